"""The root helper that asks systemd for claims' scopes: ``resourced-isolation.service``,
started by bus activation as ``org.resourced.Isolation`` on the system bus.

It does one narrow thing for one caller, the daemon's account (and root):

- ``Confine(claim_id, uid, pids, devices, stop_timeout_usec)``: put ``pids``, processes
  of the claim's user ``uid``, in the claim's scope, ``resourced-claim-<id>.scope`` in
  that user's slice (``user-<uid>.slice``), started with ``DevicePolicy=closed`` and these
  ``DeviceAllow=`` entries (or, when it runs already, added to it); it returns once every
  pid is inside, with the scope's name.
- ``Stop(claim_id)``: stop that scope (SIGTERM, then SIGKILL after its stop timeout);
  whether there was one.

Every scope it starts denies all devices but those listed and systemd's pseudo devices,
so what a call can do to a process is take devices away from it, never give any.  The
bus policy lets no one else call it, and it checks the caller's uid again.

What it moves is checked here, not taken on trust from the daemon (whose account could
be compromised): each pid is pinned with a pidfd, and must be a process of ``uid`` (never
root's) running in that user's slice (a login session, the user's own systemd), so that
no service, no Slurm job's cgroup and no other user's process is ever moved or, when the
scope stops, killed.  A pid can be reused once its process has ended: the pidfd is read
again after the move, and whatever holds a pid whose process ended meanwhile is put back
in its parent's unit, outside the scope, and the call fails.
"""

import asyncio
import logging
import os
import pwd
import re
import signal
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
SIGNATURE = "suaua(ss)t"
"""Confine's: claim id, the claim's uid, pids, devices, stop timeout."""
INSIDE_TIMEOUT = 5.0
"""Seconds a started scope has to hold every pid it was given."""
SYSTEMD = ("org.freedesktop.systemd1", "/org/freedesktop/systemd1",
           "org.freedesktop.systemd1.Manager")
DENIED = "org.freedesktop.DBus.Error.AccessDenied"
INVALID = "org.freedesktop.DBus.Error.InvalidArgs"
FAILED = "org.freedesktop.DBus.Error.Failed"
REFUSED = "org.resourced.Isolation.Error.ProcessRefused"
"""A process that is not the claim's user's to confine (the text says why)."""


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
            if msg.member == "Confine" and msg.signature == SIGNATURE:
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

    async def confine(self, claim_id: str, uid: int, pids: list[int], devices: list,
                      stop_timeout_usec: int) -> str:
        if not CLAIM_ID.fullmatch(claim_id):
            raise DBusError(INVALID, f"not a claim id: {claim_id!r}")
        if not pids or len(pids) > MAX_PIDS or any(p <= 1 or p == os.getpid() for p in pids):
            raise DBusError(INVALID, f"1 to {MAX_PIDS} pids above 1, not {pids}")
        for spec, access in devices:
            if not DEVICE.fullmatch(spec) or not ACCESS.fullmatch(access) or not access:
                raise DBusError(INVALID, f"not a device entry: {spec!r} {access!r}")
        unit = scope_name(claim_id)
        pinned = pin_users_processes(pids, uid)
        try:
            await self._move(claim_id, uid, pids, devices, stop_timeout_usec, pinned)
        finally:
            for fd in pinned.values():
                os.close(fd)
        log.info("confined pids %s to %s", " ".join(map(str, pids)), unit)
        return unit

    async def _move(self, claim_id: str, uid: int, pids: list[int], devices: list,
                    stop_timeout_usec: int, pinned: dict[int, int]) -> None:
        """Start (or join) the claim's scope with ``pids`` in it; their processes,
        ``pinned``, must live until every pid is inside, or whatever took an ended one's
        pid is put back."""
        unit = scope_name(claim_id)
        properties = [
            ["Description", Variant("s", f"resourced claim {claim_id}: its GPUs only")],
            ["Slice", Variant("s", user_slice(uid))],
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
            if not all(alive(fd) for fd in pinned.values()):
                break
            if asyncio.get_running_loop().time() > deadline:
                raise DBusError(FAILED, f"{unit} did not take pids {pids} in {INSIDE_TIMEOUT:g} s")
            await asyncio.sleep(0.001)
        ended = [pid for pid, fd in pinned.items() if not alive(fd)]
        if ended:
            for pid in ended:
                if in_scope(pid, unit):  # the pid was taken again: not our process
                    await self._put_back(pid, unit)
            raise DBusError(FAILED, f"process {ended[0]} ended while it was being confined")

    async def _put_back(self, pid: int, unit: str) -> None:
        """Move ``pid`` out of ``unit`` into its parent's unit, where it started."""
        home = parents_unit(pid)
        if home is None:
            log.error("pid %d was moved into %s after its process ended, and its parent's "
                      "unit is unknown: stopping the scope would kill it; left there", pid, unit)
            return
        answer = await self._systemd("AttachProcessesToUnit", "ssau", [*home, [pid]])
        if answer.message_type is MessageType.ERROR:
            log.error("cannot move pid %d back to %s: %s", pid, home[0],
                      answer.body[0] if answer.body else answer.error_name)
        else:
            log.warning("pid %d was taken again while it was being confined; put back in %s",
                        pid, home[0])

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


def user_slice(uid: int) -> str:
    return f"user-{uid}.slice"


def alive(pidfd: int) -> bool:
    """Whether the process a pidfd pins still runs (another user's says EPERM: it does)."""
    try:
        signal.pidfd_send_signal(pidfd, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def _proc(pid: int, name: str) -> str:
    with open(f"/proc/{pid}/{name}", encoding="utf-8", errors="replace") as f:
        return f.read()


def owner_and_cgroup(pid: int) -> tuple[list[int], str]:
    """A process's uids (real, effective, saved, filesystem) and its cgroup (v2) path."""
    uids = next(line.split()[1:] for line in _proc(pid, "status").splitlines()
                if line.startswith("Uid:"))
    cgroup = next((line[3:] for line in _proc(pid, "cgroup").splitlines()
                   if line.startswith("0::")), "")
    return [int(u) for u in uids], cgroup


def refusal(pid: int, uid: int, uids: list[int], cgroup: str) -> str | None:
    """Why process ``pid`` (with ``uids``, in ``cgroup``) may not be moved into a scope of
    user ``uid``'s, or None."""
    if 0 in uids or uid == 0:
        return f"process {pid} runs as root: no root process is confined"
    if set(uids) != {uid}:
        return f"process {pid} belongs to uid {uids[0]}, not to the claim's user (uid {uid})"
    home = f"/user.slice/{user_slice(uid)}/"
    if not cgroup.startswith(home):
        return (f"process {pid} runs in {cgroup or 'no cgroup'}, outside {user_slice(uid)}: "
                "a claim's processes are confined within their user's slice only (run the "
                "command from a login session or the user's own systemd, not from a "
                "service or another cgroup that holds it)")
    return None


def pin_users_processes(pids: list[int], uid: int) -> dict[int, int]:
    """A pidfd for each of ``pids``, once each is a process of user ``uid`` in its slice
    (read while the pidfd shows it alive: the pid was not reused in between)."""
    pinned: dict[int, int] = {}
    try:
        for pid in pids:
            try:
                pinned[pid] = os.pidfd_open(pid)
                uids, cgroup = owner_and_cgroup(pid)
                if not alive(pinned[pid]):
                    raise ProcessLookupError(pid)
            except (OSError, StopIteration, ValueError):
                raise DBusError(INVALID, f"process {pid} does not exist") from None
            why = refusal(pid, uid, uids, cgroup)
            if why:
                raise DBusError(REFUSED, why)
        return pinned
    except BaseException:
        for fd in pinned.values():
            os.close(fd)
        raise


def unit_of(cgroup: str) -> tuple[str, str] | None:
    """The unit (a service or scope) that holds cgroup path ``cgroup``, and the path below
    it (what AttachProcessesToUnit takes), or None."""
    parts = cgroup.strip("/").split("/")
    for i in range(len(parts) - 1, -1, -1):
        if parts[i].endswith((".service", ".scope")):
            below = "/".join(parts[i + 1:])
            return parts[i], "/" + below if below else ""
    return None


def parents_unit(pid: int) -> tuple[str, str] | None:
    """The unit of ``pid``'s parent, and the path below it, or None."""
    try:
        stat = _proc(pid, "stat")
        ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        return unit_of(owner_and_cgroup(ppid)[1])
    except (OSError, ValueError, StopIteration):
        return None


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
