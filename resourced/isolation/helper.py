"""The root helper that asks systemd for claims' scopes: ``resourced-isolation.service``,
started by bus activation as ``org.resourced.Isolation`` on the system bus.

It does one narrow thing for one caller, the daemon's account (and root):

- ``Confine(claim_id, pids, devices, stop_timeout_usec)``: put ``pids`` in the claim's
  scope, ``resourced-claim-<id>.scope``, started with ``DevicePolicy=closed`` and these
  ``DeviceAllow=`` entries (or, when it runs already, added to it); it returns once every
  pid is inside, with the scope's name.
- ``Stop(claim_id)``: stop that scope (SIGTERM, then SIGKILL after its stop timeout);
  whether there was one.

Every scope it starts denies all devices but those listed and systemd's pseudo devices,
so what a call can do to a process is take devices away from it, never give any.  The
bus policy lets no one else call it, and it checks the caller's uid again.
"""

import asyncio
import logging
import os
import pwd
import re
import sys

from dbus_fast import BusType, DBusError, Message, MessageType, Variant
from dbus_fast.aio import MessageBus

from resourced.protocol.names import ACCOUNT, BUS_DRIVER

log = logging.getLogger("resourced-isolation")

BUS_NAME = "org.resourced.Isolation"
PATH = "/org/resourced/Isolation"
INTERFACE = "org.resourced.Isolation"
SCOPE_PREFIX = "resourced-claim-"
CLAIM_ID = re.compile(r"[a-z0-9]{1,32}")
DEVICE = re.compile(r"/dev/char/\d{1,4}:\d{1,7}|char-[A-Za-z0-9_.-]{1,64}")
ACCESS = re.compile(r"r?w?m?")
MAX_PIDS = 64
INSIDE_TIMEOUT = 5.0
"""Seconds a started scope has to hold every pid it was given."""
SYSTEMD = ("org.freedesktop.systemd1", "/org/freedesktop/systemd1",
           "org.freedesktop.systemd1.Manager")
DENIED = "org.freedesktop.DBus.Error.AccessDenied"
INVALID = "org.freedesktop.DBus.Error.InvalidArgs"
FAILED = "org.freedesktop.DBus.Error.Failed"


def scope_name(claim_id: str) -> str:
    return f"{SCOPE_PREFIX}{claim_id}.scope"


def in_scope(pid: int, unit: str) -> bool:
    """Whether ``pid``'s cgroup is ``unit``'s (False once it is gone)."""
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            return any(line.rstrip("\n").endswith("/" + unit) for line in f)
    except OSError:
        return False


class Helper:
    def __init__(self, bus: MessageBus, callers: frozenset[int]):
        self.bus = bus
        self.callers = callers  # uids that may call
        self._uids: dict[str, int] = {}  # unique bus name -> its uid (names are never reused)
        self._answering: set[asyncio.Task] = set()

    def handle(self, msg: Message):
        """A message handler: our calls are answered by a task of their own."""
        if msg.message_type is not MessageType.METHOD_CALL or msg.path != PATH or \
                msg.interface not in (INTERFACE, None):
            return None
        task = asyncio.ensure_future(self._answer(msg))
        self._answering.add(task)
        task.add_done_callback(self._answering.discard)
        return True

    async def _answer(self, msg: Message) -> None:
        try:
            await self._check_caller(msg.sender)
            if msg.member == "Confine" and msg.signature == "saua(ss)t":
                body = [await self.confine(*msg.body)]
                reply = Message.new_method_return(msg, "s", body)
            elif msg.member == "Stop" and msg.signature == "s":
                reply = Message.new_method_return(msg, "b", [await self.stop(*msg.body)])
            else:
                raise DBusError("org.freedesktop.DBus.Error.UnknownMethod",
                                f"no method {msg.member}({msg.signature}) here")
        except DBusError as exc:
            reply = Message.new_error(msg, exc.type, exc.text)
        except Exception as exc:  # noqa: BLE001 - answered, and logged for the administrator
            log.exception("%s failed", msg.member)
            reply = Message.new_error(msg, FAILED, f"{msg.member} failed: {exc}")
        self.bus.send(reply)

    async def _check_caller(self, sender: str) -> None:
        """Refuse any caller but the daemon's account and root (the bus says who it is;
        the daemon's own Credentials would bring the whole engine into this process)."""
        if sender not in self._uids:
            answer = await self.bus.call(Message(**BUS_DRIVER, member="GetConnectionUnixUser",
                                                 signature="s", body=[sender]))
            if answer.message_type is not MessageType.METHOD_RETURN:
                raise DBusError(DENIED, "cannot tell who is calling")
            self._uids[sender] = answer.body[0]
        if self._uids[sender] not in self.callers:
            raise DBusError(DENIED, "only the resourced daemon may ask for scopes")

    async def confine(self, claim_id: str, pids: list[int], devices: list,
                      stop_timeout_usec: int) -> str:
        if not CLAIM_ID.fullmatch(claim_id):
            raise DBusError(INVALID, f"not a claim id: {claim_id!r}")
        if not pids or len(pids) > MAX_PIDS or any(p <= 1 or p == os.getpid() for p in pids):
            raise DBusError(INVALID, f"1 to {MAX_PIDS} pids above 1, not {pids}")
        for spec, access in devices:
            if not DEVICE.fullmatch(spec) or not ACCESS.fullmatch(access) or not access:
                raise DBusError(INVALID, f"not a device entry: {spec!r} {access!r}")
        unit = scope_name(claim_id)
        properties = [
            ["Description", Variant("s", f"resourced claim {claim_id}: its GPUs only")],
            ["PIDs", Variant("au", pids)],
            ["DevicePolicy", Variant("s", "closed")],
            ["DeviceAllow", Variant("a(ss)", [list(d) for d in devices])],
            ["TimeoutStopUSec", Variant("t", stop_timeout_usec)],
            ["CollectMode", Variant("s", "inactive-or-failed")],
        ]
        answer = await self._systemd("StartTransientUnit", "ssa(sv)a(sa(sv))",
                                     [unit, "fail", properties, []])
        if answer.message_type is MessageType.ERROR and \
                answer.error_name == "org.freedesktop.systemd1.UnitExists":
            answer = await self._systemd("AttachProcessesToUnit", "ssau", [unit, "", pids])
        if answer.message_type is MessageType.ERROR:
            raise DBusError(FAILED, f"systemd: {answer.body[0] if answer.body else answer.error_name}")
        deadline = asyncio.get_running_loop().time() + INSIDE_TIMEOUT
        while not all(in_scope(p, unit) for p in pids):
            if asyncio.get_running_loop().time() > deadline:
                raise DBusError(FAILED, f"{unit} did not take pids {pids} in {INSIDE_TIMEOUT:g} s")
            await asyncio.sleep(0.001)
        log.info("confined pids %s to %s", " ".join(map(str, pids)), unit)
        return unit

    async def stop(self, claim_id: str) -> bool:
        if not CLAIM_ID.fullmatch(claim_id):
            raise DBusError(INVALID, f"not a claim id: {claim_id!r}")
        answer = await self._systemd("StopUnit", "ss", [scope_name(claim_id), "replace"])
        if answer.message_type is MessageType.ERROR:
            if answer.error_name == "org.freedesktop.systemd1.NoSuchUnit":
                return False
            raise DBusError(FAILED, f"systemd: {answer.body[0] if answer.body else answer.error_name}")
        log.info("stopping %s", scope_name(claim_id))
        return True

    async def _systemd(self, member: str, signature: str, body: list) -> Message:
        destination, path, interface = SYSTEMD
        return await self.bus.call(Message(destination=destination, path=path,
                                           interface=interface, member=member,
                                           signature=signature, body=body))


def callers() -> frozenset[int]:
    """Root and the daemon's account, where it exists."""
    try:
        return frozenset({0, pwd.getpwnam(ACCOUNT).pw_uid})
    except KeyError:
        return frozenset({0})


async def serve() -> None:
    bus = await MessageBus(bus_type=BusType.SYSTEM).connect()
    helper = Helper(bus, callers())
    bus.add_message_handler(helper.handle)
    await bus.request_name(BUS_NAME)
    await bus.wait_for_disconnect()


def main() -> None:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")
    asyncio.run(serve())


if __name__ == "__main__":
    main()
