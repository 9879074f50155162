"""Every call of the Python client, defined once: what it sends, how its answer is read,
which errors it raises.  ``Calls`` holds them as step generators (``steps``); ``Client``
(``sync``) runs them blocking and ``AsyncClient`` (``aio``) awaits them, so the two have
the same calls with the same parameters.

Which bus: ``bus="session"``, ``"system"`` or ``"shared"``, else ``$RESOURCED_BUS``, else
a shared bus set up for this account (``gpuctl connect DIR`` or ``$RESOURCED_BUS_ADDRESS``),
else the session bus when ``org.resourced`` runs or can start there, else the system bus
(``discovery``: the one order; ``connecting``: the steps).

Errors raise ``resourced.ResourcedError`` subclasses with ``.code`` and ``.message``.
"""

import os
from collections.abc import Callable

from jeepney import DBusAddress, MessageFlag, MessageType, new_method_call
from jeepney.low_level import HeaderFields

from resourced.errors import (
    DaemonUnreachable,
    GPUsBusy,
    NoSuchClaim,
    NotEnoughCapacity,
    NotEnoughGPUs,
    ResourcedError,
    error_from_bus,
    left_the_queue,
)
from resourced.protocol import records as tables
from resourced.protocol.names import (
    BUS_NAME,
    CLAIM_IFACE,
    MANAGER_IFACE,
    MANAGER_PATH,
    RELEASE_DRY_RUN,
    RELEASE_FORCE,
    claim_path,
    no_session_bus,
    session_bus_missing,
)
from resourced.protocol.time import seconds_of

from . import discovery, sandbox, signals, waiting, wire
from .arguments import (
    INT32,
    UINT32_MAX,
    bus_string,
    bus_whole,
    memory_and_counts,
    named_gpus,
    session_option,
    span,
    wait_span,
)
from .bookings import BookingCalls
from .environment import claim_env
from .steps import Defined, Emit, Listen, Next, Subscribe, call, stream

DEFAULT_TIMEOUT = 25.0
ALLOCATION = ("state", "mode", "gpu_uuids", "gpu_indices", "pci_indices", "gpu_memory_bytes",
              "vram_bytes", "pools")
"""The grant's fields an allocation (``claim``'s answer) always has, in its order."""
SHORT = (NotEnoughGPUs, NotEnoughCapacity, GPUsBusy)
"""What try_acquire answers with None."""

_MANAGER = DBusAddress(MANAGER_PATH, bus_name=BUS_NAME, interface=MANAGER_IFACE)
_PEER = DBusAddress(MANAGER_PATH, bus_name=BUS_NAME, interface="org.freedesktop.DBus.Peer")
LEVEL_CHANGES = signals.rule(MANAGER_IFACE, "LevelChanged", MANAGER_PATH)

START_HINTS = {
    "session": "`systemctl --user start resourced` (after `gpuctl service enable --user`), "
               "or `resourced --session`",
    "system": "`sudo systemctl start resourced` (after `sudo gpuctl service enable --system`), "
              "or one of your own: `resourced --session`",
    "shared": "ask its host to start `resourced --shared DIR` (or `systemctl --user start "
              "resourced-shared`)",
    "either": "`sudo systemctl start resourced` (everyone's) or `systemctl --user start "
              "resourced` (yours), after `gpuctl service enable --system`/`--user`; or "
              "`resourced --session`",
}
"""How to start the daemon on each bus (``either``: where both were looked at), for the
message that says it is not there."""


def _method_call(address: DBusAddress, method: str, signature: str | None = None,
                 body: tuple = ()):
    """A method call, written by ``wire`` (a fifth of jeepney's time for a claim)."""
    return wire.fast(new_method_call(address, method, signature, body))


class Calls(BookingCalls):
    """The calls, and what they share: building messages, reading answers, the errors.
    A subclass runs the steps (``_run``, ``_iterate``) and does each (``steps``)."""

    def __init__(self, bus: str | None = None, timeout: float = DEFAULT_TIMEOUT,
                 interactive: bool = False):
        self._requested_bus = discovery.named_bus(bus)
        self.timeout = timeout
        self.interactive = interactive
        self.bus: str | None = None  # the bus in use, once connected
        self._session_refused: PermissionError | None = None  # its socket, when looking

    # -- claims ------------------------------------------------------------------------
    @call
    def claim(self, mode: str = "dev", gpus: int | None = None, task_name: str = "",
              owner_pid: int | None = None, label: str = "", use_index: bool = False,
              member_pids: tuple[int, ...] = (), vram=None, ram=None, cpu=None,
              pools: dict | None = None, priority: int = 0, wait: bool = False,
              timeout: float | None = None, reclaimable: bool = False,
              progress: Callable[[dict], None] | None = None, duration=None,
              session: str | None = None, dry_run: bool = False, vram_mb=None,
              ram_mb=None, isolate: bool | None = None, gpu_names=None,
              exclude=None) -> dict:
        """Claim GPUs, a VRAM share and/or pool amounts, all or nothing; returns
        ``{"allocation": {"ref": ...}, "env": {...}, "warnings": [...]}``.

        ``gpus`` whole GPUs: 1 unless given, or none when ``vram`` (``vram_mb``) asks for a
        share of one instead, as ``acquire`` and MCP's ``claim`` read it.
        Memory (``vram``, ``ram``) is text with a unit (``"4G"``) or bytes (at least 1 MiB),
        or MiB as ``vram_mb``/``ram_mb``; ``cpu`` a whole count.  ``member_pids`` are
        further processes of yours that belong to the claim from the start.  With ``wait``
        the request queues (by ``priority``, then arrival) until granted; ``timeout``
        seconds later it gives up with ``QueueTimeout``; an interrupted (or cancelled)
        wait leaves the queue.  While it waits, ``progress`` (if given) is called once
        queued and again whenever a claim comes or goes, with ``{"position", "waiting",
        "claim", "holders", "units"}``: its place in the queue (1 is next), how many wait,
        its record and the records of the claims holding what it wants (as in
        ``status()``), and each pool's unit.  ``duration`` (seconds or ``"2h"``) ends the
        claim that long after it was asked for.  The allocation's ``until_usec`` says
        until when it may hold what it got (0: no end): its end, or the start of a
        booking (``until_booking``).  ``session`` names the agent session (default
        ``$RESOURCED_SESSION``, else the daemon takes the owner's Unix session).
        ``dry_run``: what the daemon would decide, limits included, with nothing made
        (``"dry_run": True``, ref "").  ``isolate``: its processes run confined to its
        GPUs (``confine``; None: as the daemon's configuration says); the allocation's
        ``isolated`` says whether they do.  ``gpu_names`` (alias, index or UUID): those GPUs
        whole, one for each of ``gpus`` (or the one GPU of a ``vram`` share); ``exclude``:
        never those, as ``book`` takes them."""
        held = wait and not progress
        if gpus is None:
            gpus = 0 if vram is not None or vram_mb is not None else 1
        msg = self._claim_message(mode, gpus, owner_pid, label, task_name, member_pids, vram,
                                  ram, cpu, pools, priority, wait, timeout, reclaimable, duration,
                                  session, dry_run, held, vram_mb, ram_mb, isolate, gpu_names,
                                  exclude)
        if not wait or dry_run:
            ref, _path, grant = yield msg
            return self._allocation(ref, grant, use_index)
        return (yield from waiting.wait(self, msg, None if timeout is None else
                                        seconds_of(timeout), progress, use_index))

    @call(entered=True)
    def acquire(self, gpus: int = 0, vram=None, ram=None, cpu=None, pools: dict | None = None,
                priority: int = 0, label: str = "", timeout: float | None = None,
                reclaimable: bool = False, vram_mb=None, ram_mb=None) -> "Leased":
        """Wait for a lease (by priority, then arrival) and return it; use it in ``with``
        (``async with``, or ``await``, for ``AsyncClient``).

        The lease belongs to this process: it ends on ``release()``, on leaving the
        ``with`` block, or when the process dies."""
        granted = yield from Calls.claim.steps(
            self, mode="run", gpus=gpus, vram=vram, ram=ram, cpu=cpu, pools=pools,
            priority=priority, label=label, wait=True, timeout=timeout,
            reclaimable=reclaimable, owner_pid=os.getpid(), vram_mb=vram_mb, ram_mb=ram_mb)
        return self._lease(self, granted)

    @call
    def try_acquire(self, gpus: int = 0, vram=None, ram=None, cpu=None,
                    pools: dict | None = None, priority: int = 0, label: str = "",
                    reclaimable: bool = False, vram_mb=None, ram_mb=None) -> "Leased | None":
        """A lease if it fits now (without jumping a waiter), else None."""
        try:
            granted = yield from Calls.claim.steps(
                self, mode="run", gpus=gpus, vram=vram, ram=ram, cpu=cpu, pools=pools,
                priority=priority, label=label, reclaimable=reclaimable,
                owner_pid=os.getpid(), vram_mb=vram_mb, ram_mb=ram_mb)
        except SHORT:
            return None
        return self._lease(self, granted)

    @call
    def release(self, ref: str, force: bool = False, dry_run: bool = False) -> list[str]:
        """Release a claim (a queued one leaves the queue); returns warnings.

        Raises ``StillInUse`` while the claim's processes still use its GPUs, unless forced.
        ``dry_run`` makes every check and releases nothing.
        """
        return list((yield self._release_message(ref, force, dry_run))[0])

    @call
    def stop(self, session: str | None = None, uid: int | None = None, reason: str = "",
             dry_run: bool = False) -> dict:
        """The stop switch: end every claim and booking of one of my sessions (None: all of
        mine), or of user ``uid`` (an administrator, with a ``reason``).  Their commands
        get the reclaim signal first.  ``{"claims": [...], "bookings": [...]}`` stopped."""
        options = tables.options(
            tables.STOP_OPTIONS,
            session=None if session is None else bus_string("session", session),
            uid=None if uid is None else bus_whole("uid", uid, 0, UINT32_MAX),
            reason=bus_string("reason", reason) or None, dry_run=dry_run or None)
        claims, bookings = yield self._call("Stop", "a{sv}", (options,))
        return {"claims": list(claims), "bookings": list(bookings)}

    @call
    def claim_job(self, job: str, gpus: list[str], uid: int | None = None, name: str = "") -> str:
        """Make Slurm job ``job``'s GPUs here (indices, UUIDs or aliases) its claim, for
        user ``uid`` (root, or with manage; default: me); returns the claim's reference
        (the job's claim if it had one, relabelled with ``name`` if given: then ``gpus``
        may be empty).  ``gpuctl slurm prolog`` calls this."""
        options = tables.options(
            tables.JOB_OPTIONS, uid=None if uid is None else bus_whole("uid", uid, 0, UINT32_MAX),
            name=bus_string("job name", name) or None)
        return (yield self._call("ClaimJob", "sasa{sv}", (
            bus_string("job id", job), [bus_string("GPU", g) for g in gpus], options)))[0]

    @call
    def release_job(self, job: str) -> list[str]:
        """End Slurm job ``job``'s claim; returns the references ended (none if it had
        none).  ``gpuctl slurm epilog`` calls this."""
        return list((yield self._call("ReleaseJob", "s", (bus_string("job id", job),)))[0])

    @call
    def release_gpu(self, gpu: str, reason: str) -> str:
        """Force-release whatever claim holds ``gpu`` (alias, index or UUID); returns its ref."""
        return (yield self._call("ReleaseGPU", "ss", (bus_string("GPU", gpu),
                                                      bus_string("reason", reason))))[0]

    @call
    def reclaim_requested(self, ref: str) -> bool:
        """Whether the daemon asks this (reclaimable) claim back."""
        return (yield self._get_property("ReclaimRequested", f"{MANAGER_PATH}/claim/{ref}",
                                         CLAIM_IFACE))[0][1]

    @call
    def claim_properties(self, ref: str) -> dict:
        """A live claim's properties (``org.resourced.Claim``, in one ``GetAll``) by their
        keys in ``protocol.records.CLAIM``: ``uid``, ``mode``, ``until_usec``...;
        ``NoSuchClaim`` once it is gone."""
        return tables.read(tables.CLAIM, (yield self._get_all(claim_path(ref), CLAIM_IFACE))[0])

    @call
    def allocation(self, ref: str, use_index: bool = False) -> dict:
        """A live claim by reference, in the same shape ``claim`` returns."""
        grant = (yield self._call("GetGrant", "s", (bus_string("reference", ref),)))[0]
        return self._allocation(ref, grant, use_index)

    @call
    def confine(self, ref: str, pid: int) -> str:
        """Run your process ``pid`` (before it execs its command) in isolated claim
        ``ref``'s scope, where it opens the claim's GPUs and no others; the scope's name."""
        return (yield self._call("Confine", "su", (bus_string("reference", ref),
                                                   bus_whole("pid", pid, 1, UINT32_MAX))))[0]

    # -- the daemon's view -------------------------------------------------------------
    @call
    def status_json(self) -> str:
        """``status()`` as the daemon sends it: JSON text, keys sorted."""
        return (yield self._call("Describe"))[0]

    @call
    def status(self) -> dict:
        """The daemon's whole view: GPUs, pools, claims, the queue, health."""
        return (yield from self._status())

    def _status(self):
        import json

        return json.loads((yield from Calls.status_json.steps(self)))

    @call
    def resources(self) -> dict:
        """The advisory RAM/disk health: ``{"level": ..., "checks": [...]}`` (see README)."""
        return (yield from self._status())["health"]

    @call
    def free(self) -> int:
        """How many GPUs are free now."""
        return (yield self._get_property("FreeGPUs"))[0][1]

    @call
    def instance(self) -> str:
        """The daemon's identity (its ``Instance``): kept across its restarts, another for
        every daemon; a booked command's job names it, and only its runner starts it."""
        return (yield self._get_property("Instance"))[0][1]

    @call
    def verify(self) -> list[dict]:
        """Per GPU: status (OK, IDLE CLAIM, UNCLAIMED USE, FOREIGN PROCESS, OVERDUE, MISSING,
        UNKNOWN), claim, processes (pid, user, command, claim, ambiguous, ...)."""
        reports = [tables.read(tables.REPORT, r) for r in (yield self._call("Verify"))[0]]
        for report in reports:
            if "processes" in report:
                report["processes"] = [tables.read(tables.PROCESS, p) for p in report["processes"]]
        return reports

    @call
    def ping(self) -> None:
        """A bare round trip to the daemon (org.freedesktop.DBus.Peer.Ping)."""
        yield _method_call(_PEER, "Ping")

    @call
    def metrics(self) -> str:
        """The daemon's metrics in the Prometheus text format (``gpuctl metrics``)."""
        return (yield self._call("Metrics"))[0]

    @call
    def diagnose(self) -> list[dict]:
        """The daemon's own checks (``gpuctl doctor``): id, status, summary, fix, detail."""
        import json

        return json.loads((yield self._call("Diagnose"))[0])

    @stream
    def level_changes(self, check: str | None = None):
        """Every LevelChanged from now on (of ``check``, if given), as an iterator (an
        async iterator for ``AsyncClient``) of ``{"check", "old", "new", "reason"}``; the
        subscription lasts as long as the loop."""
        changes = yield from self._level_signals()
        while True:
            yield Emit((yield from self._next_change(changes, check, None)))

    @call
    def wait_level_change(self, check: str | None = None, levels: tuple[str, ...] | None = None,
                          timeout: float | None = None) -> dict:
        """Wait for the next LevelChanged (of ``check``, to one of ``levels``, if given);
        raises ``TimeoutError`` after ``timeout`` seconds.  A training loop can checkpoint
        and stop on STOP::

            change = client.wait_level_change(levels=("STOP",))
        """
        from .steps import Deadline

        deadline = Deadline(timeout)
        changes = yield from self._level_signals()
        while True:
            change = yield from self._next_change(changes, check, deadline)
            if levels is None or change["new"] in levels:
                return change

    @staticmethod
    def _level_signals():
        heard = signals.FromDaemon([signals.local(LEVEL_CHANGES)])  # the daemon's alone
        changes = yield Listen(heard, bufsize=64)
        yield Subscribe(LEVEL_CHANGES)
        yield from signals.follow(heard)
        return changes

    @staticmethod
    def _next_change(changes, check: str | None, deadline):
        while True:
            msg = yield Next(changes, deadline and deadline.left())
            if signals.is_owner_change(msg):
                continue
            name, old, new, reason = msg.body
            if check is None or name == check:
                return {"check": name, "old": old, "new": new, "reason": reason}

    @call
    def _send(self, msg) -> tuple:
        """``msg``'s answer (a call made by hand, as tests make a malformed one)."""
        return (yield msg)

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
                       isolate=None, gpu_names=None, exclude=None):
        gpus = bus_whole("gpus", gpus, 0, UINT32_MAX)
        vram, amounts = memory_and_counts(vram, ram, cpu, pools, vram_mb, ram_mb)
        queue_timeout = None if timeout is None else wait_span(timeout)
        options = {**session_option(session), **tables.options(
            tables.CLAIM_OPTIONS, vram_bytes=vram, pools=amounts or None,
            gpu_names=named_gpus(gpu_names), exclude=named_gpus(exclude),
            isolate=None if isolate is None else bool(isolate),
            dry_run=dry_run or None,
            mode=bus_string("mode", mode),
            owner_pid=None if owner_pid is None else bus_whole("owner pid", owner_pid, 1,
                                                              UINT32_MAX),
            member_pids=[bus_whole("member pid", p, 1, UINT32_MAX) for p in member_pids] or None,
            label=bus_string("label", label) or None,
            task_name=bus_string("task name", task_name) or None,
            priority=bus_whole("priority", priority, *INT32) or None,
            wait=wait or None,
            reply_when_granted=held or None,
            queue_timeout_usec=queue_timeout,
            reclaimable=reclaimable or None,
            duration_usec=None if duration is None else span("duration", duration))}
        return self._call("Claim", "ua{sv}", (gpus, options))

    def _claim_of_call(self, serial: int):
        return self._call("GetClaimByCall", "u", (serial,))

    def _release_message(self, ref: str, force: bool, dry_run: bool = False):
        flags = (RELEASE_FORCE if force else 0) | (RELEASE_DRY_RUN if dry_run else 0)
        return self._call("Release", "st", (bus_string("reference", ref), flags))

    @staticmethod
    def _get_property(name: str, path: str = MANAGER_PATH, interface: str = MANAGER_IFACE):
        props = DBusAddress(path, bus_name=BUS_NAME, interface="org.freedesktop.DBus.Properties")
        return _method_call(props, "Get", "ss", (interface, name))

    @staticmethod
    def _get_all(path: str = MANAGER_PATH, interface: str = MANAGER_IFACE):
        props = DBusAddress(path, bus_name=BUS_NAME, interface="org.freedesktop.DBus.Properties")
        return _method_call(props, "GetAll", "s", (interface,))

    # -- answers -----------------------------------------------------------------------
    @staticmethod
    def _body(reply) -> tuple:
        if reply.header.message_type is MessageType.error:
            name = reply.header.fields.get(HeaderFields.error_name, "")
            text = reply.body[0] if reply.body and isinstance(reply.body[0], str) else ""
            raise error_from_bus(name, text)
        return reply.body

    def _answer(self, reply) -> tuple:
        """A method call's answer: its body, or its error raised (a daemon that is not on
        the bus, in words)."""
        try:
            return self._body(reply)
        except DaemonUnreachable:
            raise self._not_running(self.bus) from None

    @staticmethod
    def _allocation(ref: str, grant: dict, use_index: bool) -> dict:
        g = tables.read(tables.GRANT, grant)
        allocation = {"ref": ref, **{k: g[k] for k in ALLOCATION}, **{
            k: g.get(k, absent) for k, absent in (("until_usec", 0), ("until_booking", ""),
                                                  ("session", ""), ("isolated", False))}}
        result = {"allocation": allocation, "env": claim_env(allocation, use_index),
                  "warnings": g["warnings"]}
        if g.get("dry_run"):
            result["dry_run"] = True
        return result

    @staticmethod
    def _outcome(msg, use_index: bool) -> dict:
        """A queued claim's Granted or Cancelled signal, as claim()'s result or an error."""
        ref = msg.header.fields[HeaderFields.path].rsplit("/", 1)[1]
        if msg.header.fields[HeaderFields.member] == "Granted":
            return Calls._allocation(ref, msg.body[0], use_index)
        raise left_the_queue(ref, msg.body[0])

    # -- errors ------------------------------------------------------------------------
    def _unreachable(self, bus: str, exc: Exception) -> ResourcedError:
        """The bus itself could not be reached (or stopped answering); a socket this
        process may not open is a sandbox's refusal, in words (``sandbox``)."""
        if self.bus is None and (refusal := self._session_refusal(bus)):
            return refusal
        if isinstance(exc, PermissionError):
            return sandbox.refused(bus, exc)
        if bus == "session" and session_bus_missing():
            return DaemonUnreachable(f"{no_session_bus()}; then start the daemon: resourced "
                                     "--session (or use the system service: --bus system)")
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
        if not self._looked_everywhere(bus):
            return ""
        if session_bus_missing():
            return ", and there is no session bus (dbus-run-session -- bash starts one)"
        return ", and no daemon runs on the session bus"

    def _hint(self, bus: str) -> str:
        """How to start a daemon on ``bus`` (and on the session bus, where both were tried)."""
        return START_HINTS["either" if self._looked_everywhere(bus) else bus]


class Leased(Defined):
    """A granted, process-bound claim (``Lease``, ``AsyncLease``): released once, by
    ``release()``, on leaving its ``with`` block, or when the process dies."""

    def __init__(self, client: Calls, granted: dict):
        from resourced.protocol.time import in_local_time

        self.client = client
        self.allocation = granted["allocation"]
        self.env = granted["env"]
        # What gpuctl prints: "granted until today 21:00 only: booked from then by bob".
        self.warnings = [in_local_time(w) for w in granted["warnings"]]
        self.ref = self.allocation["ref"]
        self.released = False

    def __repr__(self) -> str:
        """``<Lease c4x9k2a: GPU-..., granted>``: which claim, on what, and whether it is
        still held (printed in a notebook or a log, not ``<... object at 0x...>``)."""
        held = self.allocation.get("gpu_uuids") or []
        what = ", ".join(held) or ", ".join(f"{n} {a}" for n, a in
                                            self.allocation.get("pools", {}).items()) or "nothing"
        return (f"<{type(self).__name__} {self.ref}: {what}, "
                f"{'released' if self.released else 'held'}>")

    def _run(self, steps):
        return self.client._run(steps)

    @call
    def reclaim_requested(self) -> bool:
        """Whether the daemon asks this lease back for a higher-priority waiter."""
        return (yield from Calls.reclaim_requested.steps(self.client, self.ref))

    @call
    def release(self) -> None:
        """Release it (a second time does nothing)."""
        if not self.released:
            try:
                yield self.client._release_message(self.ref, True)
            except NoSuchClaim:
                pass
            self.released = True
