"""The Python client: ``Client`` (blocking) and ``AsyncClient`` (asyncio).

Both speak to the daemon through jeepney, a small pure-Python D-Bus library that does not
import asyncio for blocking use, so scripts and ``gpuctl`` start fast.  ``_Base`` holds
the pure half (building messages, decoding replies, translating errors); the two classes
differ only in how a message travels.

Which bus: ``bus="session"``, ``"system"`` or ``"shared"``, else ``$RESOURCED_BUS``, else
a shared bus set up for this account (``gpuctl connect DIR`` or ``$RESOURCED_BUS_ADDRESS``),
else the session bus when ``org.resourced`` runs or can start there, else the system bus
(``discovery``: the one order).

    >>> from resourced import Client
    >>> with Client() as client:
    ...     claim = client.claim(mode="dev", gpus=1, task_name="tuning", owner_pid=os.getpid())
    ...     client.release(claim["allocation"]["ref"])

Leases, after reslock: a process-bound claim of GPUs, VRAM or pool amounts, released on
leaving the ``with`` block (or when the process dies)::

    with client.acquire(vram="4G", priority=5, label="whisper") as lease:
        run_whisper(lease.env)
    lease = client.try_acquire(ram="64G", cpu=8)       # None if it does not fit now
    async with AsyncClient().acquire(vram="4G") as lease: ...

Errors raise ``resourced.ResourcedError`` subclasses with ``.code`` and ``.message``.
"""

import contextlib
import itertools
import os
import time
from collections.abc import Callable

from jeepney import DBusAddress, MatchRule, MessageFlag, MessageType, new_method_call
from jeepney.bus_messages import message_bus
from jeepney.low_level import HeaderFields

from resourced.errors import (
    DaemonUnreachable,
    GPUsBusy,
    InvalidRequest,
    NoSuchClaim,
    NotEnoughCapacity,
    NotEnoughGPUs,
    QueueTimeout,
    ResourcedError,
    error_from_bus,
    left_the_queue,
)
from resourced.protocol.names import (
    BUS_NAME,
    CLAIM_IFACE,
    MANAGER_IFACE,
    MANAGER_PATH,
    RELEASE_DRY_RUN,
    RELEASE_FORCE,
)
from resourced.protocol.records import BLACKOUT, NOTICE, SLOT

from . import discovery, sandbox, wire
from .arguments import (
    INT32,
    UINT32_MAX,
    bus_string,
    bus_whole,
    demand_options,
    session_option,
    span,
)
from .discovery import SharedTarget
from .environment import claim_env

__all__ = ["AsyncClient", "AsyncLease", "Client", "Lease"]

DEFAULT_TIMEOUT = 25.0
SHORT = (NotEnoughGPUs, NotEnoughCapacity, GPUsBusy)
"""What try_acquire answers with None."""

_MANAGER = DBusAddress(MANAGER_PATH, bus_name=BUS_NAME, interface=MANAGER_IFACE)
_DBUS = DBusAddress("/org/freedesktop/DBus", bus_name="org.freedesktop.DBus",
                    interface="org.freedesktop.DBus")
_PEER = DBusAddress(MANAGER_PATH, bus_name=BUS_NAME, interface="org.freedesktop.DBus.Peer")
# The bus resolves a well-known sender name in a match rule; jeepney's local filter cannot
# (messages carry the daemon's unique name), so the local rule matches on the rest.
_LEVEL_SIGNALS = dict(type="signal", interface=MANAGER_IFACE, member="LevelChanged",
                      path=MANAGER_PATH)


_QUEUE_CHANGES = MatchRule(sender=BUS_NAME, type="signal", interface=MANAGER_IFACE,
                           path=MANAGER_PATH)
"""ClaimNew, ClaimRemoved (and the Manager's other signals): when a waiter's place may move."""


def _method_call(address: DBusAddress, method: str, signature: str | None = None,
                 body: tuple = ()):
    """A method call, written by ``wire`` (a fifth of jeepney's time for a claim)."""
    return wire.fast(new_method_call(address, method, signature, body))


_OUTCOMES = MatchRule(type="signal", interface=CLAIM_IFACE)
"""A waiting claim's ``Granted`` or ``Cancelled``, which the daemon sends to the connection
that made the claim alone: the bus delivers it there without a match rule."""


START_HINTS = {
    "session": "`systemctl --user start resourced` (after `gpuctl service enable --user`), "
               "or `resourced --session`",
    "system": "`sudo systemctl start resourced` (after `sudo gpuctl service enable --system`), "
              "or one of your own: `resourced --session`",
    "shared": "ask its host to start `resourced --shared DIR` (or `systemctl --user start "
              "resourced-shared`)",
}
"""How to start the daemon on each bus, for the message that says it is not there."""


class _Base:
    """Everything that does not depend on how messages travel."""

    def __init__(self, bus: str | None = None, timeout: float = DEFAULT_TIMEOUT,
                 interactive: bool = False):
        self._requested_bus = discovery.named_bus(bus)
        self.timeout = timeout
        self.interactive = interactive
        self.bus: str | None = None  # the bus in use, once connected
        self._session_refused: PermissionError | None = None  # its socket, when looking

    # -- messages ----------------------------------------------------------------------
    def _call(self, method: str, signature: str | None = None, body: tuple = ()):
        msg = _method_call(_MANAGER, method, signature, body)
        if self.interactive:
            msg.header.flags |= MessageFlag.allow_interactive_authorization
        return msg

    def _claim_message(self, mode, gpus, owner_pid=None, label="", task_name="",
                       member_pids=(), vram=None, ram=None, cpu=None, pools=None,
                       priority=0, wait=False, timeout=None, reclaimable=False, duration=None,
                       session=None, dry_run=False, held=False, vram_mb=None, ram_mb=None,
                       isolate=None):
        gpus, options = demand_options(gpus, vram, ram, cpu, pools, vram_mb, ram_mb)
        if isolate is not None:
            options["Isolate"] = ("b", bool(isolate))
        options.update(session_option(session))
        if dry_run:
            options["DryRun"] = ("b", True)
        options["Mode"] = ("s", bus_string("mode", mode))
        if owner_pid is not None:
            options["OwnerPID"] = ("u", bus_whole("owner pid", owner_pid, 1, UINT32_MAX))
        if member_pids:
            options["MemberPIDs"] = ("au", [bus_whole("member pid", p, 1, UINT32_MAX)
                                            for p in member_pids])
        if label:
            options["Label"] = ("s", bus_string("label", label))
        if task_name:
            options["TaskName"] = ("s", bus_string("task name", task_name))
        if priority:
            options["Priority"] = ("i", bus_whole("priority", priority, *INT32))
        if wait:
            options["Wait"] = ("b", True)
        if held:
            options["ReplyWhenGranted"] = ("b", True)
        if timeout is not None:
            if not 0 <= timeout < 2**63 / 1e6:
                raise InvalidRequest(f"timeout must be a number of seconds of at least 0, not {timeout!r}")
            options["QueueTimeoutUSec"] = ("t", int(timeout * 1e6))
        if reclaimable:
            options["Reclaimable"] = ("b", True)
        if duration is not None:

            options["DurationUSec"] = ("t", span("duration", duration))
        return self._call("Claim", "ua{sv}", (gpus, options))

    def _wait_failure(self, exc: TimeoutError | OSError) -> ResourcedError:
        """What a held claim's wait that timed out or lost the bus raises (the claim taken
        out, where the daemon still answered)."""
        if isinstance(exc, TimeoutError):
            return QueueTimeout("the claim was not granted in time; it left the queue")
        return self._unreachable(self.bus, exc)

    def _held_answer(self, reply):
        """Claim's answer in the ``reply`` to a held call, or why there is none:
        ``_RESTARTED`` (the bus answered NoReply: the daemon went away holding the call,
        and its claims log kept the claim for the next one), ``_NOT_KEPT`` (a daemon older
        than ReplyWhenGranted)."""
        error = reply.header.fields.get(HeaderFields.error_name)
        if error == NO_REPLY:
            return _RESTARTED
        try:
            return self._body(reply)
        except DaemonUnreachable:
            raise self._not_running(self.bus) from None
        except InvalidRequest as exc:
            if error == InvalidRequest.bus_name() and "'ReplyWhenGranted'" in exc.message:
                return _NOT_KEPT
            raise

    def _claim_of_call(self, serial: int):
        return self._call("GetClaimByCall", "u", (serial,))

    def _release_message(self, ref: str, force: bool, dry_run: bool = False):
        flags = (RELEASE_FORCE if force else 0) | (RELEASE_DRY_RUN if dry_run else 0)
        return self._call("Release", "st", (bus_string("reference", ref), flags))

    def _stop_message(self, session, uid, reason, dry_run):
        options = {}
        if session is not None:
            options["Session"] = ("s", bus_string("session", session))
        if uid is not None:
            options["UID"] = ("u", bus_whole("uid", uid, 0, UINT32_MAX))
        if reason:
            options["Reason"] = ("s", bus_string("reason", reason))
        if dry_run:
            options["DryRun"] = ("b", True)
        return self._call("Stop", "a{sv}", (options,))

    def _claim_job_message(self, job: str, gpus: list[str], uid: int | None, name: str):
        options = {} if uid is None else {"UID": ("u", bus_whole("uid", uid, 0, UINT32_MAX))}
        if name:
            options["Name"] = ("s", bus_string("job name", name))
        return self._call("ClaimJob", "sasa{sv}", (bus_string("job id", job),
                                                   [bus_string("GPU", g) for g in gpus], options))

    def _confine_message(self, ref: str, pid: int):
        return self._call("Confine", "su", (bus_string("reference", ref),
                                            bus_whole("pid", pid, 1, UINT32_MAX)))

    def _grant_message(self, ref: str):
        return self._call("GetGrant", "s", (bus_string("reference", ref),))

    def _release_gpu_message(self, gpu: str, reason: str):
        return self._call("ReleaseGPU", "ss", (bus_string("GPU", gpu),
                                                bus_string("reason", reason)))

    @staticmethod
    def _get_property(name: str, path: str = MANAGER_PATH, interface: str = MANAGER_IFACE):
        props = DBusAddress(path, bus_name=BUS_NAME, interface="org.freedesktop.DBus.Properties")
        return _method_call(props, "Get", "ss", (interface, name))

    @staticmethod
    def _name_has_owner():
        return _method_call(_DBUS, "NameHasOwner", "s", (BUS_NAME,))

    @staticmethod
    def _activatable():
        return _method_call(_DBUS, "ListActivatableNames")

    @staticmethod
    def _owner_uid():
        return _method_call(_DBUS, "GetConnectionUnixUser", "s", (BUS_NAME,))

    def _shared_target(self) -> SharedTarget | None:
        """The shared bus to use: named (``bus="shared"``), or set up for this account
        (``gpuctl connect``, $RESOURCED_BUS_ADDRESS) when no bus is named; else None."""
        return discovery.target() if discovery.preset_bus(self._requested_bus) == "shared" else None

    def _trust(self, target: SharedTarget, reply) -> None:
        """The host's check: the directory's owner must own org.resourced there."""
        try:
            owner = self._body(reply)[0]
        except DaemonUnreachable:
            raise self._not_running("shared") from None
        discovery.check_host(target, owner)

    # -- replies -----------------------------------------------------------------------
    @staticmethod
    def _body(reply) -> tuple:
        if reply.header.message_type is MessageType.error:
            name = reply.header.fields.get(HeaderFields.error_name, "")
            text = reply.body[0] if reply.body and isinstance(reply.body[0], str) else ""
            raise error_from_bus(name, text)
        return reply.body

    @staticmethod
    def _allocation(ref: str, grant: dict, use_index: bool) -> dict:
        allocation = {
            "ref": ref,
            "state": grant["State"][1],
            "mode": grant["Mode"][1],
            "gpu_uuids": list(grant["GPUUUIDs"][1]),
            "gpu_indices": list(grant["GPUIndices"][1]),
            "pci_indices": list(grant["PCIIndices"][1]),
            "gpu_memory_bytes": list(grant["GPUMemoryBytes"][1]),
            "vram_bytes": grant["VRAMBytes"][1],
            "pools": dict(grant["Pools"][1]),
            "until_usec": grant["UntilUSec"][1] if "UntilUSec" in grant else 0,
            "until_booking": grant["UntilBooking"][1] if "UntilBooking" in grant else "",
            "session": grant["Session"][1] if "Session" in grant else "",
            "isolated": grant["Isolated"][1] if "Isolated" in grant else False,
        }
        result = {"allocation": allocation, "env": claim_env(allocation, use_index),
                  "warnings": list(grant["Warnings"][1])}
        if "DryRun" in grant:
            result["dry_run"] = True
        return result

    @staticmethod
    def _outcome(msg, use_index: bool) -> dict:
        """A queued claim's Granted or Cancelled signal, as claim()'s result or an error."""
        ref = msg.header.fields[HeaderFields.path].rsplit("/", 1)[1]
        if msg.header.fields[HeaderFields.member] == "Granted":
            return _Base._allocation(ref, msg.body[0], use_index)
        raise left_the_queue(ref, msg.body[0])

    @staticmethod
    def _decode_verify(body: tuple) -> list[dict]:
        """Verify's reports, read by the records' table (``uuid``, ``status``,
        ``processes`` with ``pid``...)."""
        from resourced.protocol.records import PROCESS, REPORT, read

        reports = [read(REPORT, r) for r in body[0]]
        for report in reports:
            if "processes" in report:
                report["processes"] = [read(PROCESS, p) for p in report["processes"]]
        return reports

    def _unreachable(self, bus: str, exc: Exception) -> ResourcedError:
        """The bus itself could not be reached (or stopped answering); a socket this
        process may not open is a sandbox's refusal, in words (``sandbox``)."""
        if self.bus is None and (refusal := self._session_refusal(bus)):
            return refusal
        if isinstance(exc, PermissionError):
            return sandbox.refused(bus, exc)
        why = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
        return DaemonUnreachable(f"cannot reach the {bus} bus ({why}){self._tried(bus)}; "
                                 f"start the daemon: {self._hint(bus)}")

    def _not_running(self, bus: str) -> ResourcedError:
        """The bus answered, but nobody owns org.resourced there (and where the session
        bus was refused on the way, that is what to fix)."""
        if refusal := self._session_refusal(bus):
            return refusal
        return DaemonUnreachable(f"the resourced daemon is not running on the {bus} bus"
                                 f"{self._tried(bus)}; start it: {self._hint(bus)}")

    def _session_refusal(self, bus: str) -> ResourcedError | None:
        """Where both buses were looked at and the session bus's socket was refused on
        the way (a sandbox, most often): that refusal, the thing to fix."""
        if self._looked_everywhere(bus) and self._session_refused is not None:
            return sandbox.refused("session", self._session_refused)
        return None

    def _looked_everywhere(self, bus: str) -> bool:
        return not self._requested_bus and bus == "system"

    def _tried(self, bus: str) -> str:
        return ", and no daemon runs on the session bus" if self._looked_everywhere(bus) else ""

    def _hint(self, bus: str) -> str:
        """How to start a daemon on ``bus`` (and on the session bus, where both were tried)."""
        if self._looked_everywhere(bus):
            return f"{START_HINTS['system']}; for yourself alone, {START_HINTS['session']}"
        return START_HINTS[bus]


_HELD_SERIALS = itertools.count((1 << 31) + int.from_bytes(os.urandom(4), "big") % (1 << 30))
"""Serials of held claim calls: chosen here, out of the range jeepney counts up from 1,
so that the client knows a call's serial before its answer (``GetClaimByCall``); from a
random start, so that after a restart of the bus (when unique names start again) a
process is unlikely to take another's serial too."""
NO_REPLY = "org.freedesktop.DBus.Error.NoReply"
_RESTARTED = object()
_NOT_KEPT = object()


def _waiting_only(msg):
    """``msg``, a Claim with ReplyWhenGranted, asking with Wait alone (an older daemon)."""
    gpus, options = msg.body
    msg.body = (gpus, {k: v for k, v in options.items() if k != "ReplyWhenGranted"})
    return msg


RETRY_INTERVAL = 0.2
"""Seconds between calls while the daemon restarts under a waiting claim."""


class _ReplyTo:
    """A filter rule (jeepney's filters ask only ``matches``) for the answer to call
    ``serial``."""

    def __init__(self, serial: int):
        self.serial = serial

    def matches(self, msg) -> bool:
        return msg.header.fields.get(HeaderFields.reply_serial) == self.serial


def _is_outcome_of(msg, path: str) -> bool:
    fields = msg.header.fields
    return fields.get(HeaderFields.path) == path and \
        fields.get(HeaderFields.member) in ("Granted", "Cancelled")


class Client(_Base):
    """A blocking client. Use as a context manager, or call ``close()``."""

    _conn = None

    def _connection(self):
        if self._conn is None:
            self._conn, self.bus = self._open()
            wire.install(self._conn)  # replies read in a third of jeepney's time
        return self._conn

    def _open(self):
        from jeepney.io.blocking import open_dbus_connection

        if target := self._shared_target():
            try:
                conn = open_dbus_connection(target.address)
            except Exception as exc:  # jeepney's failures to connect or authenticate
                raise discovery.unreachable(target, exc) from exc
            try:
                self._trust(target, conn.send_and_get_reply(self._owner_uid(),
                                                            timeout=self.timeout))
            except BaseException:
                conn.close()
                raise
            return conn, "shared"
        if self._requested_bus:
            return self._connect(open_dbus_connection, self._requested_bus), self._requested_bus
        try:
            conn = open_dbus_connection("SESSION")
        except PermissionError as exc:
            conn, self._session_refused = None, exc
        except (OSError, KeyError, ValueError):
            conn = None
        if conn is not None:
            owned = self._body(conn.send_and_get_reply(self._name_has_owner(),
                                                       timeout=self.timeout))[0]
            if owned or discovery.serves(owned, self._body(conn.send_and_get_reply(
                    self._activatable(), timeout=self.timeout))[0]):
                return conn, "session"
            conn.close()
        return self._connect(open_dbus_connection, "system"), "system"

    def _connect(self, opener, bus: str):
        try:
            return opener(bus.upper())
        except (OSError, KeyError, ValueError) as exc:
            raise self._unreachable(bus, exc) from exc

    def _send(self, msg) -> tuple:
        conn = self._connection()
        try:
            reply = conn.send_and_get_reply(msg, timeout=self.timeout)
        except (OSError, TimeoutError) as exc:
            raise self._unreachable(self.bus, exc) from exc
        try:
            return self._body(reply)
        except DaemonUnreachable:
            raise self._not_running(self.bus) from None

    def claim(self, mode: str = "dev", gpus: int = 1, task_name: str = "",
              owner_pid: int | None = None, label: str = "", use_index: bool = False,
              member_pids: tuple[int, ...] = (), vram=None, ram=None, cpu=None,
              pools: dict | None = None, priority: int = 0, wait: bool = False,
              timeout: float | None = None, reclaimable: bool = False,
              progress: Callable[[dict], None] | None = None, duration=None,
              session: str | None = None, dry_run: bool = False, vram_mb=None,
              ram_mb=None, isolate: bool | None = None) -> dict:
        """Claim GPUs, a VRAM share and/or pool amounts, all or nothing; returns
        ``{"allocation": {"ref": ...}, "env": {...}, "warnings": [...]}``.

        Memory (``vram``, ``ram``) is text with a unit (``"4G"``) or bytes (at least 1 MiB),
        or MiB as ``vram_mb``/``ram_mb``; ``cpu`` a whole count.  ``member_pids`` are further processes
        of yours that belong to the claim from the start.  With ``wait`` the request
        queues (by ``priority``, then arrival) until granted; ``timeout`` seconds later it
        gives up with ``QueueTimeout``; an interrupted wait leaves the queue.  While it
        waits, ``progress`` (if given) is called once queued and again whenever a claim
        comes or goes, with ``{"position", "waiting", "claim", "holders", "units"}``: its
        place in the queue (1 is next), how many wait, its record and the records of the
        claims holding what it wants (as in ``status()``), and each pool's unit.
        ``duration`` (seconds or ``"2h"``) ends the claim that long after it was asked
        for.  The allocation's ``until_usec`` says until when it may hold what it got
        (0: no end): its end, or the start of a booking (``until_booking``).
        ``session`` names the agent session (default ``$RESOURCED_SESSION``, else the
        daemon takes the owner's Unix session).  ``dry_run``: what the daemon would
        decide, limits included, with nothing made (``"dry_run": True``, ref "").
        ``isolate``: its processes run confined to its GPUs (``confine``; None: as the
        daemon's configuration says); the allocation's ``isolated`` says whether they do."""
        held = wait and not progress  # (progress needs the claim's reference at once)
        msg = self._claim_message(mode, gpus, owner_pid, label, task_name, member_pids, vram,
                                  ram, cpu, pools, priority, wait, timeout, reclaimable, duration,
                                  session, dry_run, held, vram_mb, ram_mb, isolate)
        if not wait or dry_run:
            ref, _path, grant = self._send(msg)
            return self._allocation(ref, grant, use_index)
        conn = self._connection()
        # Listened for before asking: the outcome may come right behind the answer (or,
        # from a daemon that did not keep a held call, instead of it).
        with conn.filter(MatchRule(type="signal") if progress else _OUTCOMES,
                         bufsize=64) as signals:
            ref, path, grant = self._held_claim(msg, timeout) if held else self._send(msg)
            if grant["State"][1] != "queued":
                return self._allocation(ref, grant, use_index)
            try:
                if not progress:
                    return self._await_outcome(signals, ref, path, timeout, use_index)
                self._send(message_bus.AddMatch(_QUEUE_CHANGES))
                try:
                    return self._await_outcome(signals, ref, path, timeout, use_index, progress)
                finally:
                    with contextlib.suppress(Exception):
                        conn.send(message_bus.RemoveMatch(_QUEUE_CHANGES))
            except BaseException:  # timed out, interrupted, or cancelled by the daemon
                with contextlib.suppress(NoSuchClaim, DaemonUnreachable):
                    self.release(ref)  # leave no trace in the queue
                raise

    def _held_claim(self, msg, timeout: float | None) -> tuple:
        """Claim's answer to ``msg`` (made with ``ReplyWhenGranted``): the grant once
        granted, or a queued claim (from a daemon that answered at once, or whose successor
        has the claim after a restart: its signal follows).  An interrupted or timed-out
        wait leaves the queue, or releases a claim granted meanwhile."""
        conn = self._connection()
        serial = next(_HELD_SERIALS)
        with conn.filter(_ReplyTo(serial)) as replies:
            try:
                conn.send(msg, serial=serial)
                reply = conn.recv_until_filtered(replies, timeout=None if timeout is None
                                                 else timeout + self.timeout)
            except BaseException as exc:
                with contextlib.suppress(NoSuchClaim, DaemonUnreachable):
                    self.release(self._send(self._claim_of_call(serial))[0])
                if isinstance(exc, (TimeoutError, OSError)):
                    raise self._wait_failure(exc) from exc
                raise
        answer = self._held_answer(reply)
        if answer is _RESTARTED:
            return self._retry_unreachable(self._claim_of_call(serial), timeout)
        if answer is _NOT_KEPT:
            return self._send(_waiting_only(msg))
        return answer

    def _retry_unreachable(self, msg, timeout: float | None) -> tuple:
        """``msg``'s answer once the daemon answers again (a restart), asking every
        ``RETRY_INTERVAL`` for ``timeout`` seconds more than the call's own (None: until
        it answers)."""
        deadline = None if timeout is None else time.monotonic() + timeout + self.timeout
        while True:
            try:
                return self._send(msg)
            except DaemonUnreachable:
                if deadline is not None and time.monotonic() > deadline:
                    raise
            time.sleep(RETRY_INTERVAL)

    def _await_outcome(self, signals, ref: str, path: str, timeout, use_index: bool,
                       progress=None) -> dict:
        conn = self._connection()
        if progress:
            self._report_place(ref, progress)
        while True:
            try:
                msg = conn.recv_until_filtered(signals, timeout=None if timeout is None
                                               else timeout + self.timeout)
            except TimeoutError:
                raise QueueTimeout(f"claim {ref} was not granted in time") from None
            except OSError as exc:
                raise self._unreachable(self.bus, exc) from exc
            if _is_outcome_of(msg, path):
                return self._outcome(msg, use_index)
            if progress and msg.header.fields.get(HeaderFields.member) in ("ClaimNew",
                                                                           "ClaimRemoved"):
                self._report_place(ref, progress)

    def _report_place(self, ref: str, progress: Callable[[dict], None]) -> None:
        """Where a waiting claim stands, for ``claim(progress=...)``."""
        view = self.status()
        claims = {c["id"]: c for c in view["claims"]}
        if ref not in view["queue"]:
            return  # granted or gone: its own signal says which
        me = claims[ref]
        wants_gpus = bool(me["gpus_requested"] or me["vram_bytes"])
        holders = [c for c in view["claims"] if c["state"] == "granted" and (
            (wants_gpus and c["gpu_uuids"]) or set(c["pools"]) & set(me["pools"]))]
        progress({"position": view["queue"].index(ref) + 1, "waiting": len(view["queue"]),
                  "claim": me, "holders": holders,
                  "units": {p["name"]: p["unit"] for p in view["pools"]}})

    def release(self, ref: str, force: bool = False, dry_run: bool = False) -> list[str]:
        """Release a claim (a queued one leaves the queue); returns warnings.

        Raises ``StillInUse`` while the claim's processes still use its GPUs, unless forced.
        ``dry_run`` makes every check and releases nothing.
        """
        return list(self._send(self._release_message(ref, force, dry_run))[0])

    def stop(self, session: str | None = None, uid: int | None = None, reason: str = "",
             dry_run: bool = False) -> dict:
        """The stop switch: end every claim and booking of one of my sessions (None: all of
        mine), or of user ``uid`` (an administrator, with a ``reason``).  Their commands
        get the reclaim signal first.  ``{"claims": [...], "bookings": [...]}`` stopped."""
        claims, bookings = self._send(self._stop_message(session, uid, reason, dry_run))
        return {"claims": list(claims), "bookings": list(bookings)}

    def claim_job(self, job: str, gpus: list[str], uid: int | None = None, name: str = "") -> str:
        """Make Slurm job ``job``'s GPUs here (indices, UUIDs or aliases) its claim, for
        user ``uid`` (root, or with manage; default: me); returns the claim's reference
        (the job's claim if it had one, relabelled with ``name`` if given: then ``gpus``
        may be empty).  ``gpuctl slurm prolog`` calls this."""
        return self._send(self._claim_job_message(job, gpus, uid, name))[0]

    def release_job(self, job: str) -> list[str]:
        """End Slurm job ``job``'s claim; returns the references ended (none if it had
        none).  ``gpuctl slurm epilog`` calls this."""
        return list(self._send(self._call("ReleaseJob", "s", (bus_string("job id", job),)))[0])

    def release_gpu(self, gpu: str, reason: str) -> str:
        """Force-release whatever claim holds ``gpu`` (alias, index or UUID); returns its ref."""
        return self._send(self._release_gpu_message(gpu, reason))[0]

    def acquire(self, gpus: int = 0, vram=None, ram=None, cpu=None, pools: dict | None = None,
                priority: int = 0, label: str = "", timeout: float | None = None,
                reclaimable: bool = False, vram_mb=None, ram_mb=None) -> "Lease":
        """Wait for a lease (by priority, then arrival) and return it; use it in ``with``.

        The lease belongs to this process: it ends on ``release()``, on leaving the
        ``with`` block, or when the process dies."""
        granted = self.claim(mode="run", gpus=gpus, vram=vram, ram=ram, cpu=cpu, pools=pools,
                             priority=priority, label=label, wait=True, timeout=timeout,
                             reclaimable=reclaimable, owner_pid=os.getpid(), vram_mb=vram_mb,
                             ram_mb=ram_mb)
        return Lease(self, granted)

    def try_acquire(self, gpus: int = 0, vram=None, ram=None, cpu=None,
                    pools: dict | None = None, priority: int = 0, label: str = "",
                    reclaimable: bool = False, vram_mb=None, ram_mb=None) -> "Lease | None":
        """A lease if it fits now (without jumping a waiter), else None."""
        try:
            granted = self.claim(mode="run", gpus=gpus, vram=vram, ram=ram, cpu=cpu,
                                 pools=pools, priority=priority, label=label,
                                 reclaimable=reclaimable, owner_pid=os.getpid(),
                                 vram_mb=vram_mb, ram_mb=ram_mb)
        except SHORT:
            return None
        return Lease(self, granted)

    def reclaim_requested(self, ref: str) -> bool:
        """Whether the daemon asks this (reclaimable) claim back."""
        msg = self._get_property("ReclaimRequested", f"{MANAGER_PATH}/claim/{ref}", CLAIM_IFACE)
        return self._send(msg)[0][1]

    def status(self) -> dict:
        """The daemon's whole view: GPUs, pools, claims, the queue, health."""
        import json

        return json.loads(self.status_json())

    def status_json(self) -> str:
        """``status()`` as the daemon sends it: JSON text, keys sorted."""
        return self._send(self._call("Describe"))[0]

    def allocation(self, ref: str, use_index: bool = False) -> dict:
        """A live claim by reference, in the same shape ``claim`` returns."""
        return self._allocation(ref, self._send(self._grant_message(ref))[0], use_index)

    def confine(self, ref: str, pid: int) -> str:
        """Run your process ``pid`` (before it execs its command) in isolated claim
        ``ref``'s scope, where it opens the claim's GPUs and no others; the scope's name."""
        return self._send(self._confine_message(ref, pid))[0]

    def resources(self) -> dict:
        """The advisory RAM/disk health: ``{"level": ..., "checks": [...]}`` (see README)."""
        return self.status()["health"]

    def free(self) -> int:
        """How many GPUs are free now."""
        return self._send(self._get_property("FreeGPUs"))[0][1]

    def verify(self) -> list[dict]:
        """Per GPU: status (OK, IDLE CLAIM, UNCLAIMED USE, FOREIGN PROCESS, OVERDUE, MISSING,
        UNKNOWN), claim, processes (pid, user, command, claim, ambiguous, ...)."""
        return self._decode_verify(self._send(self._call("Verify")))

    def ping(self) -> None:
        """A bare round trip to the daemon (org.freedesktop.DBus.Peer.Ping)."""
        self._send(_method_call(_PEER, "Ping"))

    def metrics(self) -> str:
        """The daemon's metrics in the Prometheus text format (``gpuctl metrics``)."""
        return self._send(self._call("Metrics"))[0]

    def diagnose(self) -> list[dict]:
        """The daemon's own checks (``gpuctl doctor``): id, status, summary, fix, detail."""
        import json

        return json.loads(self._send(self._call("Diagnose"))[0])

    # -- bookings (see booking_calls for the arguments) --------------------------------
    def book(self, duration, gpus=None, start=None, **request) -> dict:
        """Reserve a window: ``{"status": "created" | "exists", "booking": {...}}``.
        ``start`` None takes the earliest start that fits."""
        from . import bookings as b

        return b.booked(self._send(b.book_message(duration=duration, gpus=gpus, start=start,
                                                  **request)))

    def bookings(self, all_users: bool = False, since=None, until=None, offset: int = 0,
                 limit: int | None = None) -> list[dict]:
        """Mine (or everyone's): scheduled, active, and ended since ``since`` (default a
        day ago), by start."""
        import json

        from . import bookings as b

        return json.loads(self._send(b.list_message(all_users, since, until, offset, limit))[0])

    def booking(self, ref: str) -> dict:
        from . import bookings as b

        return b.record(self._send(b.ref_message("GetBooking", ref))[0])

    def edit(self, ref: str, **changes) -> dict:
        """Change a booking that has not started (what is not given stays)."""
        from . import bookings as b

        msg = b.ref_message("EditBooking", ref, ("a{sv}", b.request_options(**changes)))
        return b.record(self._send(msg)[0])

    def extend(self, ref: str, by=None, until=None, op_id: str = "",
               dry_run: bool = False) -> dict:
        """Move a booking's end: ``by`` a duration past its end, or ``until`` a time
        (earlier shrinks it, not before now).  ``dry_run`` (here and on book, edit and
        cancel): what it would be, decided by the daemon, with nothing changed."""
        from . import bookings as b

        return b.record(self._send(b.end_message(ref, by, until, op_id, dry_run))[0])

    def cancel(self, ref: str, reason: str = "", op_id: str = "", dry_run: bool = False) -> dict:
        """End a booking now; someone else's needs the manage action and a reason."""
        from . import bookings as b

        msg = b.ref_message("CancelBooking", ref, ("s", bus_string("reason", reason)),
                            b.change_options(op_id, dry_run))
        return b.record(self._send(msg)[0])

    def usage(self, since=None, until=None, uid: int | None = None,
              by_gpu: bool = False) -> list[dict]:
        """GPU-hours held, used and idle per user (or per GPU, with mean load) from
        ``since`` (default 7 days ago) to ``until`` (default now): see ``gpuctl usage``."""
        import json

        from . import bookings as b

        options = {}
        if since is not None:
            options["SinceUSec"] = ("t", b.instant("since", since))
        if until is not None:
            options["UntilUSec"] = ("t", b.instant("until", until))
        if uid is not None:
            options["UID"] = ("u", bus_whole("uid", uid, 0, UINT32_MAX))
        if by_gpu:
            options["ByGPU"] = ("b", True)
        return json.loads(self._send(b.call("Usage", "a{sv}", (options,)))[0])

    def report_job(self, ref: str, state: str, exit_code: int = -1, detail: str = "") -> dict:
        """As a booking's owner (its runner): how the booking's command stands (pending,
        running, succeeded, failed, timed-out, cancelled, missed); the booking's record."""
        from . import bookings as b

        msg = b.call("ReportJob", "ssis", (bus_string("reference", ref), bus_string("state", state),
                                           bus_whole("exit code", exit_code, *INT32),
                                           bus_string("detail", detail)))
        return b.record(self._send(msg)[0])

    def slots(self, duration, count: int = 3, **request) -> list[dict]:
        """The earliest places a booking would fit (read-only)."""
        from . import bookings as b

        return b.records(SLOT, self._send(b.slots_message(count, duration=duration,
                                                          **request)))

    def add_blackout(self, start, end, reason: str) -> dict:
        """Block a window for new bookings: ``{"id", "bookings_inside"}``."""
        from . import bookings as b

        blackout_id, inside = self._send(b.blackout_message(start, end, reason))
        return {"id": blackout_id, "bookings_inside": list(inside)}

    def blackouts(self) -> list[dict]:
        from . import bookings as b

        return b.records(BLACKOUT, self._send(b.call("ListBlackouts")))

    def remove_blackout(self, blackout_id: str) -> None:
        from . import bookings as b

        self._send(b.ref_message("RemoveBlackout", blackout_id))

    def add_notice(self, text: str, until=None) -> str:
        from . import bookings as b

        return self._send(b.notice_message(text, until))[0]

    def notices(self) -> list[dict]:
        from . import bookings as b

        return b.records(NOTICE, self._send(b.call("ListNotices")))

    def remove_notice(self, notice_id: str) -> None:
        from . import bookings as b

        self._send(b.ref_message("RemoveNotice", notice_id))

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class SharedClient:
    """One blocking ``Client`` shared by threads, used one call at a time, and made anew
    at the next call after the daemon was lost (for long-lived programs: resourced-mcp,
    gpuctl top).  ``options`` go to ``Client``."""

    def __init__(self, bus: str | None = None, **options):
        import threading

        self.bus = bus
        self._options = options
        self._client: Client | None = None
        self._lock = threading.Lock()

    @property
    def bus_in_use(self) -> str | None:
        """The bus of the open connection (None while there is none)."""
        return self._client.bus if self._client is not None else None

    def call(self, fn):
        """``fn(client)`` under the lock, in the calling thread."""
        with self._lock:
            if self._client is None:
                self._client = Client(bus=self.bus, **self._options)
            try:
                return fn(self._client)
            except DaemonUnreachable:
                self._client.close()
                self._client = None
                raise

    def close(self) -> None:
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None


class Lease:
    """A granted, process-bound claim; a context manager that releases it."""

    def __init__(self, client: Client, granted: dict):
        self.client = client
        self.allocation = granted["allocation"]
        self.env = granted["env"]
        self.ref = self.allocation["ref"]
        self.released = False

    @property
    def reclaim_requested(self) -> bool:
        """Whether the daemon asks this lease back for a higher-priority waiter."""
        return self.client.reclaim_requested(self.ref)

    def release(self) -> None:
        if not self.released:
            with contextlib.suppress(NoSuchClaim):
                self.client.release(self.ref, force=True)
            self.released = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()


class AsyncClient(_Base):
    """The asyncio client. Use as ``async with AsyncClient() as client:``."""

    _router = None
    _router_cm = None
    _opening = None  # an asyncio.Lock, made by the first call that connects

    async def _connection(self):
        if self._router is None:
            import asyncio

            if self._opening is None:  # (calls that start together share one connection)
                self._opening = asyncio.Lock()
            async with self._opening:
                if self._router is None:
                    await self._open()
                    wire.install(getattr(self._router, "_conn", None))
        return self._router

    async def _open(self):
        from jeepney.io.asyncio import open_dbus_router

        if target := self._shared_target():
            cm = open_dbus_router(target.address)
            try:
                router = await cm.__aenter__()
            except Exception as exc:  # jeepney's failures to connect or authenticate
                raise discovery.unreachable(target, exc) from exc
            try:
                self._trust(target, await router.send_and_get_reply(self._owner_uid()))
            except BaseException:
                await cm.__aexit__(None, None, None)
                raise
            self._router, self._router_cm, self.bus = router, cm, "shared"
            return
        for bus in [self._requested_bus] if self._requested_bus else ("session", "system"):
            cm = open_dbus_router(bus.upper())
            try:
                router = await cm.__aenter__()
            except (OSError, KeyError, ValueError) as exc:
                if self._requested_bus or bus == "system":
                    raise self._unreachable(bus, exc) from exc
                if isinstance(exc, PermissionError):
                    self._session_refused = exc
                continue
            if bus == "session" and not self._requested_bus:
                owned = self._body(await router.send_and_get_reply(self._name_has_owner()))[0]
                if not (owned or discovery.serves(owned, self._body(
                        await router.send_and_get_reply(self._activatable()))[0])):
                    await cm.__aexit__(None, None, None)
                    continue
            self._router, self._router_cm, self.bus = router, cm, bus
            return

    async def _send(self, msg) -> tuple:
        import asyncio

        router = await self._connection()
        try:
            async with asyncio.timeout(self.timeout):
                reply = await router.send_and_get_reply(msg)
        except (OSError, TimeoutError) as exc:
            raise self._unreachable(self.bus, exc) from exc
        try:
            return self._body(reply)
        except DaemonUnreachable:
            raise self._not_running(self.bus) from None

    async def claim(self, mode: str = "dev", gpus: int = 1, task_name: str = "",
                    owner_pid: int | None = None, label: str = "", use_index: bool = False,
                    member_pids: tuple[int, ...] = (), vram=None, ram=None, cpu=None,
                    pools: dict | None = None, priority: int = 0, wait: bool = False,
                    timeout: float | None = None, reclaimable: bool = False,
                    duration=None, session: str | None = None, dry_run: bool = False,
                    vram_mb=None, ram_mb=None, isolate: bool | None = None) -> dict:
        """As ``Client.claim``; a cancelled wait leaves the queue."""
        import asyncio

        msg = self._claim_message(mode, gpus, owner_pid, label, task_name, member_pids, vram,
                                  ram, cpu, pools, priority, wait, timeout, reclaimable, duration,
                                  session, dry_run, held=wait, vram_mb=vram_mb, ram_mb=ram_mb,
                                  isolate=isolate)
        if not wait or dry_run:
            ref, _path, grant = await self._send(msg)
            return self._allocation(ref, grant, use_index)
        router = await self._connection()
        # Listened for before asking (the outcome may come right behind the answer, or
        # instead of it), then, without an await between, for this claim's path alone:
        # other claims made on this connection meanwhile have outcomes of their own.
        with router.filter(_OUTCOMES, bufsize=1024) as early:
            ref, path, grant = await self._held_claim(msg, timeout)
            if grant["State"][1] != "queued":
                return self._allocation(ref, grant, use_index)
            mine = router.filter(MatchRule(type="signal", interface=CLAIM_IFACE, path=path),
                                 bufsize=4)
            while not early.empty():
                if _is_outcome_of(signal_msg := early.get_nowait(), path):
                    mine.queue.put_nowait(signal_msg)
        try:
            with mine as signals:
                async with asyncio.timeout(None if timeout is None else timeout + self.timeout):
                    while True:
                        signal_msg = await signals.get()
                        if _is_outcome_of(signal_msg, path):
                            return self._outcome(signal_msg, use_index)
        except (asyncio.CancelledError, TimeoutError):
            with contextlib.suppress(Exception):
                await self._send(self._release_message(ref, False))
            raise

    async def _held_claim(self, msg, timeout: float | None) -> tuple:
        """As ``Client._held_claim``."""
        import asyncio

        router = await self._connection()
        serial = next(_HELD_SERIALS)
        with router.filter(_ReplyTo(serial)) as replies:
            try:
                await router.send(msg, serial=serial)
                async with asyncio.timeout(None if timeout is None else timeout + self.timeout):
                    reply = await replies.get()
            except BaseException as exc:
                with contextlib.suppress(NoSuchClaim, DaemonUnreachable):
                    await self.release((await self._send(self._claim_of_call(serial)))[0])
                if isinstance(exc, (TimeoutError, OSError)):
                    raise self._wait_failure(exc) from exc
                raise
        answer = self._held_answer(reply)
        if answer is _RESTARTED:
            return await self._retry_unreachable(self._claim_of_call(serial), timeout)
        if answer is _NOT_KEPT:
            return await self._send(_waiting_only(msg))
        return answer

    async def _retry_unreachable(self, msg, timeout: float | None) -> tuple:
        """As ``Client._retry_unreachable``."""
        import asyncio

        deadline = None if timeout is None else time.monotonic() + timeout + self.timeout
        while True:
            try:
                return await self._send(msg)
            except DaemonUnreachable:
                if deadline is not None and time.monotonic() > deadline:
                    raise
            await asyncio.sleep(RETRY_INTERVAL)

    async def release(self, ref: str, force: bool = False, dry_run: bool = False) -> list[str]:
        return list((await self._send(self._release_message(ref, force, dry_run)))[0])

    async def stop(self, session: str | None = None, uid: int | None = None, reason: str = "",
                   dry_run: bool = False) -> dict:
        claims, bookings = await self._send(self._stop_message(session, uid, reason, dry_run))
        return {"claims": list(claims), "bookings": list(bookings)}

    async def release_gpu(self, gpu: str, reason: str) -> str:
        return (await self._send(self._release_gpu_message(gpu, reason)))[0]

    def acquire(self, gpus: int = 0, vram=None, ram=None, cpu=None, pools: dict | None = None,
                priority: int = 0, label: str = "", timeout: float | None = None,
                reclaimable: bool = False, vram_mb=None, ram_mb=None) -> "_Acquiring":
        """``async with client.acquire(vram="4G") as lease:`` (or ``lease = await ...``)."""
        return _Acquiring(self, dict(gpus=gpus, vram=vram, ram=ram, cpu=cpu, pools=pools,
                                     priority=priority, label=label, wait=True, timeout=timeout,
                                     reclaimable=reclaimable, vram_mb=vram_mb, ram_mb=ram_mb))

    async def try_acquire(self, gpus: int = 0, vram=None, ram=None, cpu=None,
                          pools: dict | None = None, priority: int = 0, label: str = "",
                          reclaimable: bool = False, vram_mb=None,
                          ram_mb=None) -> "AsyncLease | None":
        try:
            granted = await self.claim(mode="run", gpus=gpus, vram=vram, ram=ram, cpu=cpu,
                                       pools=pools, priority=priority, label=label,
                                       reclaimable=reclaimable, owner_pid=os.getpid(),
                                       vram_mb=vram_mb, ram_mb=ram_mb)
        except SHORT:
            return None
        return AsyncLease(self, granted)

    async def reclaim_requested(self, ref: str) -> bool:
        msg = self._get_property("ReclaimRequested", f"{MANAGER_PATH}/claim/{ref}", CLAIM_IFACE)
        return (await self._send(msg))[0][1]

    async def status(self) -> dict:
        import json

        return json.loads((await self._send(self._call("Describe")))[0])

    async def allocation(self, ref: str, use_index: bool = False) -> dict:
        return self._allocation(ref, (await self._send(self._grant_message(ref)))[0], use_index)

    async def confine(self, ref: str, pid: int) -> str:
        return (await self._send(self._confine_message(ref, pid)))[0]

    async def free(self) -> int:
        return (await self._send(self._get_property("FreeGPUs")))[0][1]

    # -- bookings (as Client's) --------------------------------------------------------
    async def book(self, duration, gpus=None, start=None, **request) -> dict:
        from . import bookings as b

        return b.booked(await self._send(b.book_message(duration=duration, gpus=gpus,
                                                        start=start, **request)))

    async def bookings(self, all_users: bool = False, since=None, until=None, offset: int = 0,
                       limit: int | None = None) -> list[dict]:
        import json

        from . import bookings as b

        return json.loads((await self._send(b.list_message(all_users, since, until, offset,
                                                           limit)))[0])

    async def booking(self, ref: str) -> dict:
        from . import bookings as b

        return b.record((await self._send(b.ref_message("GetBooking", ref)))[0])

    async def edit(self, ref: str, **changes) -> dict:
        from . import bookings as b

        msg = b.ref_message("EditBooking", ref, ("a{sv}", b.request_options(**changes)))
        return b.record((await self._send(msg))[0])

    async def extend(self, ref: str, by=None, until=None, op_id: str = "",
                     dry_run: bool = False) -> dict:
        from . import bookings as b

        return b.record((await self._send(b.end_message(ref, by, until, op_id, dry_run)))[0])

    async def cancel(self, ref: str, reason: str = "", op_id: str = "",
                     dry_run: bool = False) -> dict:
        from . import bookings as b

        msg = b.ref_message("CancelBooking", ref, ("s", bus_string("reason", reason)),
                            b.change_options(op_id, dry_run))
        return b.record((await self._send(msg))[0])

    async def slots(self, duration, count: int = 3, **request) -> list[dict]:
        from . import bookings as b

        return b.records(SLOT, await self._send(b.slots_message(count, duration=duration,
                                                                **request)))

    async def resources(self) -> dict:
        return (await self.status())["health"]

    async def level_changes(self, check: str | None = None):
        """Every LevelChanged from now on (of ``check``, if given), as an async iterator of
        ``{"check", "old", "new", "reason"}``; the subscription lasts as long as the loop."""
        router = await self._connection()
        rule = MatchRule(sender=BUS_NAME, **_LEVEL_SIGNALS)
        with router.filter(MatchRule(**_LEVEL_SIGNALS), bufsize=64) as queue:
            await router.send_and_get_reply(message_bus.AddMatch(rule))
            try:
                while True:
                    name, old, new, reason = (await queue.get()).body
                    if check is None or name == check:
                        yield {"check": name, "old": old, "new": new, "reason": reason}
            finally:
                with contextlib.suppress(Exception):  # closing: the bus drops it with us anyway
                    await router.send(message_bus.RemoveMatch(rule))

    async def wait_level_change(self, check: str | None = None,
                                levels: tuple[str, ...] | None = None,
                                timeout: float | None = None) -> dict:
        """Wait for the next LevelChanged (of ``check``, to one of ``levels``, if given);
        raises ``TimeoutError`` after ``timeout`` seconds.  A training loop can checkpoint
        and stop on STOP::

            change = await client.wait_level_change(levels=("STOP",))
        """
        import asyncio

        async with asyncio.timeout(timeout):
            async with contextlib.aclosing(self.level_changes(check)) as changes:
                async for change in changes:
                    if levels is None or change["new"] in levels:
                        return change

    async def verify(self) -> list[dict]:
        return self._decode_verify(await self._send(self._call("Verify")))

    async def ping(self) -> None:
        await self._send(_method_call(_PEER, "Ping"))

    async def metrics(self) -> str:
        return (await self._send(self._call("Metrics")))[0]

    async def diagnose(self) -> list[dict]:
        import json

        return json.loads((await self._send(self._call("Diagnose")))[0])

    async def close(self) -> None:
        if self._router_cm is not None:
            await self._router_cm.__aexit__(None, None, None)
            self._router = self._router_cm = None

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()


class AsyncLease:
    """A granted, process-bound claim for asyncio; ``async with`` releases it."""

    def __init__(self, client: AsyncClient, granted: dict):
        self.client = client
        self.allocation = granted["allocation"]
        self.env = granted["env"]
        self.ref = self.allocation["ref"]
        self.released = False

    async def reclaim_requested(self) -> bool:
        return await self.client.reclaim_requested(self.ref)

    async def release(self) -> None:
        if not self.released:
            with contextlib.suppress(NoSuchClaim):
                await self.client.release(self.ref, force=True)
            self.released = True

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.release()


class _Acquiring:
    """What ``AsyncClient.acquire`` returns: awaitable, and an async context manager."""

    def __init__(self, client: AsyncClient, kwargs: dict):
        self.client = client
        self.kwargs = kwargs
        self.lease: AsyncLease | None = None

    async def _acquire(self) -> AsyncLease:
        granted = await self.client.claim(mode="run", owner_pid=os.getpid(), **self.kwargs)
        self.lease = AsyncLease(self.client, granted)
        return self.lease

    def __await__(self):
        return self._acquire().__await__()

    async def __aenter__(self) -> AsyncLease:
        return await self._acquire()

    async def __aexit__(self, *exc):
        await self.lease.release()

