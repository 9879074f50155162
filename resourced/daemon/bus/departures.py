"""Hearing when a connection leaves the bus: one ``NameOwnerChanged`` match rule per
connection watched, added with its first watch and removed when it leaves.

A kept Claim call (``held_calls``) and an object-manager client (the manager announces
claim objects only while one is there) both need to know when their caller is gone."""

import asyncio
from collections.abc import Callable

from dbus_fast import Message, MessageFlag, MessageType

from resourced.protocol.names import BUS_DRIVER


class Departures:
    def __init__(self, bus):
        self._bus = bus
        self._watched: dict[str, list[Callable[[str], None]]] = {}  # name -> when it leaves
        self._checks: set[asyncio.Task] = set()  # (held while they run)
        bus.add_message_handler(self._on_message)

    def watch(self, name: str, on_left: Callable[[str], None]) -> None:
        """Call ``on_left(name)`` once the connection ``name`` has left the bus (once,
        however often the same ``on_left`` is asked for)."""
        if name in self._watched:
            if on_left not in self._watched[name]:
                self._watched[name].append(on_left)
            return
        self._watched[name] = [on_left]
        self._bus.send(_driver_call("AddMatch", _left_rule(name)))
        check = asyncio.ensure_future(self._check_still_there(name))
        self._checks.add(check)
        check.add_done_callback(self._checks.discard)

    async def _check_still_there(self, name: str) -> None:
        """For a connection that left before its match rule was in place."""
        try:
            reply = await self._bus.call(Message(**BUS_DRIVER, member="NameHasOwner",
                                                 signature="s", body=[name]))
        except Exception:  # noqa: BLE001 - the bus went (a stop): nobody is left to tell
            return
        if reply.message_type is MessageType.METHOD_RETURN and not reply.body[0]:
            self._left(name)

    def _on_message(self, msg: Message) -> bool:
        if (msg.message_type is MessageType.SIGNAL and msg.member == "NameOwnerChanged"
                and msg.sender == BUS_DRIVER["destination"] and len(msg.body) == 3
                and msg.body[0] in self._watched and not msg.body[2]):
            self._left(msg.body[0])
        return False  # (never handled here)

    def _left(self, name: str) -> None:
        callbacks = self._watched.pop(name, None)
        if callbacks is None:
            return
        self._bus.send(_driver_call("RemoveMatch", _left_rule(name)))
        for on_left in callbacks:
            on_left(name)


def _left_rule(name: str) -> str:
    return (f"type='signal',sender='{BUS_DRIVER['destination']}',"
            f"interface='{BUS_DRIVER['interface']}',member='NameOwnerChanged',arg0='{name}'")


def _driver_call(member: str, rule: str) -> Message:
    return Message(**BUS_DRIVER, member=member, signature="s", body=[rule],
                   flags=MessageFlag.NO_REPLY_EXPECTED)
