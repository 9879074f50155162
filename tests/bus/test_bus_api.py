"""The bus API itself, spoken with dbus-fast: signals, PropertiesChanged, error names, refusals
that change nothing, the Claim object, AsyncClient, and which bus the clients choose."""

import asyncio
import json
import os

import pytest
from dbus_fast import Message, MessageType, Variant
from dbus_fast.aio import MessageBus

from resourced.client.aio import AsyncClient
from resourced.client.sync import Client
from resourced.errors import InvalidArgs, NoSuchClaim, NotEnoughGPUs

TIMEOUT = 10.0
NAME = "org.resourced"
MANAGER_PATH = "/org/resourced"
MANAGER = "org.resourced.Manager"
PROPERTIES = "org.freedesktop.DBus.Properties"
INVALID_ARGS = "org.freedesktop.DBus.Error.InvalidArgs"


def run(coro):
    """Run one test coroutine, bounded as a whole."""
    return asyncio.run(asyncio.wait_for(coro, 3 * TIMEOUT))


class Peer:
    """A dbus-fast connection to the private bus that calls the daemon and records signals."""

    def __init__(self, bus: MessageBus):
        self.bus = bus
        self.signals: list[Message] = []
        self._arrived = asyncio.Event()
        bus.add_message_handler(self._record)

    @classmethod
    async def connect(cls, address: str) -> "Peer":
        return cls(await asyncio.wait_for(MessageBus(bus_address=address).connect(), TIMEOUT))

    def _record(self, msg: Message) -> None:
        if msg.message_type is MessageType.SIGNAL and msg.sender != "org.freedesktop.DBus":
            self.signals.append(msg)
            self._arrived.set()

    async def call(self, member, signature="", body=(), path=MANAGER_PATH, interface=MANAGER):
        msg = Message(destination=NAME, path=path, interface=interface, member=member,
                      signature=signature, body=list(body))
        return await asyncio.wait_for(self.bus.call(msg), TIMEOUT)

    async def ok(self, *args, **kwargs) -> list:
        reply = await self.call(*args, **kwargs)
        assert reply.message_type is MessageType.METHOD_RETURN, (reply.error_name, reply.body)
        return reply.body

    async def error(self, *args, **kwargs) -> tuple[str, str]:
        reply = await self.call(*args, **kwargs)
        assert reply.message_type is MessageType.ERROR, reply.body
        return reply.error_name, reply.body[0]

    async def subscribe(self, rule: str) -> None:
        msg = Message(destination="org.freedesktop.DBus", path="/org/freedesktop/DBus",
                      interface="org.freedesktop.DBus", member="AddMatch", signature="s",
                      body=[rule])
        reply = await asyncio.wait_for(self.bus.call(msg), TIMEOUT)
        assert reply.message_type is MessageType.METHOD_RETURN

    async def wait_signal(self, predicate, timeout: float = TIMEOUT) -> Message:
        """The first recorded signal that satisfies ``predicate``, waiting for it if need be."""
        async def first():
            while True:
                for msg in self.signals:
                    if predicate(msg):
                        return msg
                self._arrived.clear()
                await self._arrived.wait()

        return await asyncio.wait_for(first(), timeout)

    async def describe(self) -> dict:
        return json.loads((await self.ok("Describe"))[0])

    async def claim(self, gpus: int, **options) -> tuple[str, str, dict]:
        return tuple(await self.ok("Claim", "ua{sv}", [gpus, dev_options(**options)]))

    def close(self) -> None:
        self.bus.disconnect()


def dev_options(mode="dev", owner_pid=None, **extra) -> dict:
    return {"Mode": Variant("s", mode), "OwnerPID": Variant("u", owner_pid or os.getpid()), **extra}


def manager_signal(member: str):
    return lambda m: m.interface == MANAGER and m.member == member


def properties_changed(path: str, interface: str, **expected):
    def match(m: Message) -> bool:
        if (m.path, m.interface, m.member) != (path, PROPERTIES, "PropertiesChanged"):
            return False
        changed = {k: v.value for k, v in m.body[1].items()}
        return m.body[0] == interface and all(changed.get(k) == v for k, v in expected.items())

    return match


def test_claim_new_and_claim_removed_reach_a_subscriber(daemon):
    async def scenario():
        listener = await Peer.connect(daemon.bus.address)
        caller = await Peer.connect(daemon.bus.address)
        await listener.subscribe(f"type='signal',sender='{NAME}',interface='{MANAGER}'")

        claim_id, path, _ = await caller.claim(2)
        await caller.ok("Release", "st", [claim_id, 0])

        new = await listener.wait_signal(manager_signal("ClaimNew"))
        removed = await listener.wait_signal(manager_signal("ClaimRemoved"))
        assert (new.path, new.body) == (MANAGER_PATH, [claim_id, path])
        assert (removed.path, removed.body) == (MANAGER_PATH, [claim_id, path, "released"])
        assert listener.signals.index(new) < listener.signals.index(removed)
        listener.close()
        caller.close()

    run(scenario())


def test_claim_removed_says_owner_exited_when_a_run_claims_owner_dies(daemon, owner):
    async def scenario():
        peer = await Peer.connect(daemon.bus.address)
        await peer.subscribe(f"type='signal',sender='{NAME}',interface='{MANAGER}'")
        claim_id, path, _ = await peer.claim(1, mode="run", owner_pid=owner.pid)

        owner.kill()
        owner.wait(timeout=TIMEOUT)

        removed = await peer.wait_signal(manager_signal("ClaimRemoved"))
        assert removed.body == [claim_id, path, "owner-exited"]
        assert (await peer.describe())["claims"] == []
        peer.close()

    run(scenario())


def test_properties_changed_follow_claims_on_manager_gpu_and_claim_objects(daemon, owner):
    async def scenario():
        peer = await Peer.connect(daemon.bus.address)
        await peer.subscribe(f"type='signal',sender='{NAME}',interface='{PROPERTIES}',"
                             "member='PropertiesChanged'")

        claim_id, path, grant = await peer.claim(1, owner_pid=owner.pid)
        [index] = grant["GPUIndices"].value
        gpu_path = f"{MANAGER_PATH}/gpu/{index}"
        await peer.wait_signal(properties_changed(MANAGER_PATH, MANAGER, FreeGPUs=3, NClaims=1))
        await peer.wait_signal(properties_changed(gpu_path, "org.resourced.GPU",
                                                  State="claimed", ClaimID=claim_id))

        owner.kill()
        owner.wait(timeout=TIMEOUT)
        await peer.wait_signal(properties_changed(path, "org.resourced.Claim", OwnerAlive=False))

        await peer.ok("Release", "st", [claim_id, 0])
        await peer.wait_signal(properties_changed(MANAGER_PATH, MANAGER, FreeGPUs=4, NClaims=0))
        await peer.wait_signal(properties_changed(gpu_path, "org.resourced.GPU",
                                                  State="free", ClaimID=""))
        state = await peer.ok("Get", "ss", ["org.resourced.GPU", "State"],
                              path=gpu_path, interface=PROPERTIES)
        assert state[0].value == "free"
        peer.close()

    run(scenario())


REFUSED_CALLS = {
    "unknown-option": (("Claim", "ua{sv}", [1, dev_options(Bogus=Variant("s", "x"))]),
                       INVALID_ARGS, "Bogus"),
    "owner-pid-as-string": (("Claim", "ua{sv}", [1, {"OwnerPID": Variant("s", "1")}]),
                            INVALID_ARGS, "OwnerPID"),
    "mode-as-number": (("Claim", "ua{sv}", [1, {"Mode": Variant("u", 1)}]), INVALID_ARGS, "Mode"),
    "unknown-mode": (("Claim", "ua{sv}", [1, dev_options(mode="forever")]), INVALID_ARGS, "forever"),
    "zero-gpus": (("Claim", "ua{sv}", [0, dev_options()]), INVALID_ARGS, "nothing requested"),
    "too-many-gpus": (("Claim", "ua{sv}", [5, dev_options()]),
                      "org.resourced.Error.NotEnoughGPUs", "5 GPU(s) requested"),
    "get-unknown-claim": (("GetClaim", "s", ["cnosuch"]), "org.resourced.Error.NoSuchClaim", "cnosuch"),
    "release-unknown-claim": (("Release", "st", ["cnosuch", 0]),
                              "org.resourced.Error.NoSuchClaim", "cnosuch"),
}


@pytest.mark.parametrize("case", REFUSED_CALLS.values(), ids=REFUSED_CALLS.keys())
def test_a_refused_call_has_its_error_name_and_changes_nothing(daemon, case):
    (member, signature, body), error_name, mentions = case

    async def scenario():
        peer = await Peer.connect(daemon.bus.address)
        await peer.claim(1)  # something that could be disturbed
        before = await peer.describe()

        name, text = await peer.error(member, signature, body)

        assert (name, mentions in text) == (error_name, True), text
        assert await peer.describe() == before
        peer.close()

    run(scenario())


@pytest.mark.parametrize("flags", [1 << 2, 1 << 63], ids=["bit2", "bit63"])
def test_release_with_an_unknown_flag_bit_is_invalid_and_keeps_the_claim(daemon, flags):
    async def scenario():
        peer = await Peer.connect(daemon.bus.address)
        claim_id, path, _ = await peer.claim(2)
        before = await peer.describe()

        by_manager = await peer.error("Release", "st", [claim_id, flags])
        by_object = await peer.error("Release", "t", [flags], path=path, interface="org.resourced.Claim")

        assert by_manager[0] == by_object[0] == INVALID_ARGS
        assert await peer.describe() == before
        peer.close()

    run(scenario())


def test_the_claim_object_describes_and_releases_itself(daemon):
    async def scenario():
        peer = await Peer.connect(daemon.bus.address)
        await peer.subscribe(f"type='signal',sender='{NAME}',interface='{MANAGER}'")
        claim_id, path, grant = await peer.claim(2, TaskName=Variant("s", "tune"))
        assert await peer.ok("GetClaim", "s", [claim_id]) == [path]
        props = (await peer.ok("GetAll", "s", ["org.resourced.Claim"], path=path,
                               interface=PROPERTIES))[0]
        assert {k: props[k].value for k in ("Id", "Mode", "OwnerPID", "TaskName", "GPUUUIDs")} == {
            "Id": claim_id, "Mode": "dev", "OwnerPID": os.getpid(), "TaskName": "tune",
            "GPUUUIDs": grant["GPUUUIDs"].value,
        }

        assert await peer.ok("Release", "t", [0], path=path, interface="org.resourced.Claim") == [[]]  # no warnings

        removed = await peer.wait_signal(manager_signal("ClaimRemoved"))
        assert removed.body == [claim_id, path, "released"]
        assert (await peer.describe())["claims"] == []
        assert (await peer.error("GetClaim", "s", [claim_id]))[0] == "org.resourced.Error.NoSuchClaim"
        peer.close()

    run(scenario())


def test_async_client_claims_lists_and_releases(daemon):
    async def scenario():
        async with AsyncClient() as c:
            claim = await asyncio.wait_for(
                c.claim(mode="dev", gpus=2, owner_pid=os.getpid(), task_name="async"), TIMEOUT)
            ref = claim["allocation"]["ref"]
            status = await asyncio.wait_for(c.status(), TIMEOUT)
            free_while_held = await asyncio.wait_for(c.free(), TIMEOUT)
            with pytest.raises(NotEnoughGPUs):
                await asyncio.wait_for(c.claim(mode="dev", gpus=3, owner_pid=os.getpid()), TIMEOUT)
            await asyncio.wait_for(c.release(ref), TIMEOUT)
            with pytest.raises(NoSuchClaim):
                await asyncio.wait_for(c.release(ref), TIMEOUT)
            free_after = await asyncio.wait_for(c.free(), TIMEOUT)
            assert c.bus == "session"
        return claim, status, free_while_held, free_after

    claim, status, free_while_held, free_after = run(scenario())

    [record] = status["claims"]
    assert (record["id"], record["task_name"]) == (claim["allocation"]["ref"], "async")
    assert record["gpu_uuids"] == claim["allocation"]["gpu_uuids"]
    assert claim["env"]["CUDA_VISIBLE_DEVICES"] == ",".join(record["gpu_uuids"])
    assert (free_while_held, free_after) == (2, 4)


def test_clients_find_the_daemon_on_the_session_bus_when_no_bus_is_named(daemon, monkeypatch):
    monkeypatch.delenv("RESOURCED_BUS")

    with Client() as c:
        assert c.free() == 4
        assert c.bus == "session"

    async def async_bus():
        async with AsyncClient() as c:
            await asyncio.wait_for(c.free(), TIMEOUT)
            return c.bus

    assert run(async_bus()) == "session"


def test_an_unknown_bus_name_is_an_invalid_request(monkeypatch):
    with pytest.raises(InvalidArgs):
        Client(bus="bogus")
    with pytest.raises(InvalidArgs):
        AsyncClient(bus="bogus")
    monkeypatch.setenv("RESOURCED_BUS", "bogus")
    with pytest.raises(InvalidArgs):
        Client()


OBJECT_MANAGER = "org.freedesktop.DBus.ObjectManager"
CLAIM_SIGNALS = {"InterfacesAdded", "InterfacesRemoved", "ClaimNew", "ClaimRemoved"}


def test_claims_are_announced_by_claim_new_and_object_manager_signals(daemon):
    """Object-manager clients watch the manager's path (after GetManagedObjects, as such a
    client starts): a claim is InterfacesAdded there just before ClaimNew and
    InterfacesRemoved just before ClaimRemoved, and GetManagedObjects lists it with its
    Claim interface."""
    async def scenario():
        listener = await Peer.connect(daemon.bus.address)
        caller = await Peer.connect(daemon.bus.address)
        await listener.subscribe(f"type='signal',sender='{NAME}'")
        await listener.call("GetManagedObjects", interface=OBJECT_MANAGER)
        claim_id, path, _ = await caller.claim(1)
        managed = await caller.bus.call(Message(
            destination=NAME, path=MANAGER_PATH, interface="org.freedesktop.DBus.ObjectManager",
            member="GetManagedObjects"))
        assert "org.resourced.Claim" in managed.body[0][path]
        await caller.ok("Release", "st", [claim_id, 0])
        await listener.wait_signal(manager_signal("ClaimRemoved"))
        seen = [(m.member, m.path, m.body[0]) for m in listener.signals
                if m.member in CLAIM_SIGNALS]
        assert seen == [("InterfacesAdded", MANAGER_PATH, path),
                        ("ClaimNew", MANAGER_PATH, claim_id),
                        ("InterfacesRemoved", MANAGER_PATH, path),
                        ("ClaimRemoved", MANAGER_PATH, claim_id)]
        listener.close()
        caller.close()

    run(scenario())


def test_claim_objects_are_announced_only_while_an_object_manager_client_is_there(daemon):
    """Until a connection has called GetManagedObjects, and once every one that did has
    left, a claim and its release send ClaimNew and ClaimRemoved alone: InterfacesAdded
    and InterfacesRemoved would reach no object-manager client."""
    async def scenario():
        listener = await Peer.connect(daemon.bus.address)
        caller = await Peer.connect(daemon.bus.address)
        await listener.subscribe(f"type='signal',sender='{NAME}'")

        async def claim_and_release() -> list[str]:
            listener.signals.clear()
            claim_id, _, _ = await caller.claim(1)
            await caller.ok("Release", "st", [claim_id, 0])
            await listener.wait_signal(manager_signal("ClaimRemoved"))
            return [m.member for m in listener.signals if m.member in CLAIM_SIGNALS]

        assert await claim_and_release() == ["ClaimNew", "ClaimRemoved"]
        manager = await Peer.connect(daemon.bus.address)
        await manager.call("GetManagedObjects", interface=OBJECT_MANAGER)
        assert await claim_and_release() == ["InterfacesAdded", "ClaimNew",
                                             "InterfacesRemoved", "ClaimRemoved"]
        manager.close()
        for _ in range(50):  # until the daemon has heard from the bus that it left
            if await claim_and_release() == ["ClaimNew", "ClaimRemoved"]:
                break
        else:
            raise AssertionError("claim objects still announced after the client left")
        listener.close()
        caller.close()

    run(scenario())
