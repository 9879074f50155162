"""The daemon's connection writes a method's reply together with what the method sent:
a reply the bus cannot carry must still end as an error reply, never as silence."""

import asyncio

from dbus_fast import Message, MessageType
from dbus_fast.aio import MessageBus
from dbus_fast.service import ServiceInterface, method

from resourced.daemon.bus.connection import DaemonBus


class Faulty(ServiceInterface):
    def __init__(self, bus: DaemonBus):
        super().__init__("org.resourced.test.Faulty")
        self.bus = bus

    @method()
    async def Answer(self, also_signal: "b") -> "s":
        if also_signal:  # sent in the same write as the reply would be
            self.bus.emit("/org/resourced/test", self.name, "Said", "s", ["hello"])
        return 42  # not a string: the reply cannot be written


async def ask(address: str) -> list[tuple]:
    server = await DaemonBus(bus_address=address).connect()
    client = await MessageBus(bus_address=address).connect()
    try:
        server.export("/org/resourced/test", Faulty(server))
        answers = []
        for also_signal in (False, True):
            reply = await asyncio.wait_for(client.call(Message(
                destination=server.unique_name, path="/org/resourced/test",
                interface="org.resourced.test.Faulty", member="Answer", signature="b",
                body=[also_signal])), 5)
            answers.append((reply.message_type, reply.error_name))
        return answers
    finally:
        client.disconnect()
        server.disconnect()


def test_a_reply_that_cannot_be_written_becomes_an_error_even_beside_a_signal(private_bus):
    answers = asyncio.run(ask(private_bus.address))  # (a silent one times out there)
    assert [message_type for message_type, _ in answers] == [MessageType.ERROR] * 2
    assert all(error.endswith(".ServiceError") for _, error in answers)  # dbus-fast's name
