"""The engine: the ledger plus the edges it needs (GPU backend, process table, liveness).

It knows nothing of D-Bus.  The bus adapter hands it a ``Caller`` and plain arguments,
and subscribes to the events it publishes.  Blocking work (the GPU backend, /proc, user
names) runs in threads with deadlines *before* a decision; the decision itself is one
synchronous call into the ledger, so it never interleaves with another caller's, and
whatever was awaited is re-validated against the ledger afterwards.

Evidence (what really runs on the GPUs) is gathered at claim time (a free GPU running a
process nobody claimed is not granted), at release time (a release is refused while the
claim's own processes still use its GPUs), for ``verify``, and by a tracking sweep that,
while claims exist, adopts the descendants of each claim's processes as its members so a
worker re-parented to init stays known.  Owners and members are watched through pidfds.
"""

import asyncio
import copy
import logging
import os
import secrets
import string
from collections.abc import Callable
from dataclasses import replace

from resourced.backends import Backend, NoGpus
from resourced.config import DaemonConfig, GpuEntry, SlurmConfig, for_the_bus
from resourced.core.calendar import Booking, BookingEvent, Calendar
from resourced.core.caller import Caller
from resourced.core.claims import (
    BOOKING,
    BOOKING_PRIORITY,
    MODES,
    SLURM,
    Claim,
    ClaimOptions,
    ClaimRequest,
    Demand,
    ProcessRef,
    check_session,
    default_session,
)
from resourced.core.clock import Clock
from resourced.core.departed import Departed
from resourced.core.inventory import Gpu
from resourced.core.ledger import (
    ClaimGranted,
    ClaimQueued,
    ClaimReleased,
    Event,
    Ledger,
    OwnerDied,
    ReclaimAsked,
    StopAsked,
    UntilChanged,
)
from resourced.core.lifecycle import (
    ACTIVE,
    CANCELLED,
    ENDED,
    FORCED,
    GRANTED,
    QUEUED,
    RELEASED,
    STOPPED,
)
from resourced.core.pools import Pool
from resourced.errors import (
    Internal,
    InvalidArgs,
    LimitExceeded,
    NoSuchClaim,
    NotClaimOwner,
    NotProcessOwner,
    ResourcedError,
    StillInUse,
    quoted,
)
from resourced.evidence.gpuprobe import GpuProbe
from resourced.evidence.liveness import ExitWatcher
from resourced.evidence.pidns import (
    in_callers_namespace,
    ns_pids,
)
from resourced.evidence.processes import pid_max, pin_process, process_session, process_uid
from resourced.evidence.proctable import command_line
from resourced.isolation.devices import allowed, read_proc_devices
from resourced.isolation.scopes import STOP_TIMEOUT_USEC, UNAVAILABLE_ON_USER_BUS
from resourced.linux.sd import audit, one_write
from resourced.linux.threads import off_loop
from resourced.linux.users import user_name
from resourced.protocol.time import DAY, iso_utc, wall_clock

from ..after_reply import AfterReply
from .alarms import Alarms
from .calendar import Bookings, booking_limits
from .slurm_jobs import SlurmJobs, slurm_gpus
from .tracking import Tracker
from .usage import UsageHistory

log = logging.getLogger("resourced")

ID_ALPHABET = string.ascii_lowercase + string.digits
ID_SHIFTS = (0, 6, 12, 18, 24, 30)  # a reference's six characters, from 30 random bits
MAX_MEMBERS = 64
"""Member pids one claim may name: a wrapper or two, not a process table."""
MAX_DURATION_USEC = 10 * 365 * DAY
"""The longest a claim may ask to last (seconds)."""


def managed_gpus(present: list[Gpu], configured: tuple[GpuEntry, ...]) -> tuple[list[Gpu], list[GpuEntry]]:
    """The GPUs to manage (all present ones, or only the configured ones when any are
    listed, with their aliases) and the configured ones that are not present."""
    if not configured:
        return present, []
    by_uuid = {g.uuid: g for g in present}
    managed, missing = [], []
    for entry in configured:
        gpu = by_uuid.get(entry.uuid)
        if gpu is None:
            missing.append(entry)
            continue
        managed.append(replace(gpu, alias=entry.alias or ""))
    return managed, missing


class Engine:
    def __init__(self, backend: Backend, store=None, settings: DaemonConfig = DaemonConfig(),
                 configured: tuple[GpuEntry, ...] = (), pools: tuple[Pool, ...] = (),
                 clock: Clock = wall_clock, calendar_store=None, poll_clock: bool = False,
                 usage_store=None, slurm: SlurmConfig = SlurmConfig(), scopes=None,
                 shared: bool = False):
        self.backend = backend
        self.shared = shared  # on a bus several users share: its defaults (for_the_bus)
        self.scopes = scopes  # claims' systemd scopes (isolation.Scopes); None: not on this bus
        self.store = store  # a ClaimStore, or None to keep claims in memory only
        self.calendar_store = calendar_store  # a CalendarStore, or None: bookings in memory
        self.usage_store = usage_store  # a UsageStore, or None: no usage history
        self.poll_clock = poll_clock  # a simulated clock: look at it at least each second
        self.given = settings  # as configured; ``settings``: with the bus's defaults
        self.settings = for_the_bus(settings, shared, 0)
        self.configured = configured
        self.pools = pools
        self.slurm = slurm
        self.clock = clock
        self.departed = Departed()
        self._serving: asyncio.Task | None = None  # a queue walk waiting for fresh evidence
        self.ledger = Ledger([])
        self.calendar = Calendar(self.ledger.timeline, booking_limits(settings))
        self.present: list[Gpu] = []  # every GPU the backend reports, managed or not
        self.missing: list[GpuEntry] = []
        self.backend_note = getattr(backend, "reason", "")
        self.probe = GpuProbe(backend, settings.probe_timeout)
        self._listeners: list[Callable[[list[Event]], None]] = []
        self.after_reply = AfterReply()  # signals, audit lines: after the replies
        self.after_reply.hold(one_write)
        self._strays: asyncio.Task | None = None  # stopping scopes left by a crash
        self._user_names: dict[int, str] = {}
        self.alarms = Alarms(self)
        self.tracker = Tracker(self)
        self.history = UsageHistory(self)
        self.jobs = SlurmJobs(self)
        self.bookings = Bookings(self)

    # -- lifecycle ---------------------------------------------------------------------
    async def start(self, restored: dict[str, Claim] | None = None) -> None:
        """Read the inventory, take back ``restored`` claims from before a restart, and
        watch their processes (owners that died meanwhile are handled at once)."""
        self.tracker.start_watching()
        failure = ""
        try:
            self.present = await self.off_loop(self.backend.inventory)
        except TimeoutError:
            failure = (f"{self.backend.name} backend did not answer within "
                       f"{self.settings.probe_timeout:g} s")
        except Exception as exc:  # noqa: BLE001 - any backend failure leaves us GPU-less
            failure = f"{self.backend.name} backend failed: {exc}"
        if failure:
            self.backend_note = failure
            self.backend = NoGpus(failure)
            self.probe = GpuProbe(self.backend, self.settings.probe_timeout)
        gpus, self.missing = managed_gpus(self.present, self.configured)
        for_slurm, unknown = slurm_gpus(self.slurm.gpus, gpus)
        for name in unknown:
            log.warning("[slurm] gpus names %s, which is no GPU managed here", name)
        self.ledger = Ledger(gpus, self.pools, for_slurm)
        self.settings = for_the_bus(self.given, self.shared, len(gpus))
        self.calendar = Calendar(self.ledger.timeline, booking_limits(self.settings),
                                 {g.uuid: g.label for g in gpus})
        if not gpus:
            log.warning("no GPUs to manage: %s", self.backend_note or "the backend lists none")
        for entry in self.missing:
            log.warning("configured GPU %s is not present", entry.uuid)
        if self.calendar_store is not None:  # bookings first: restored claims end before them
            dropped = self.calendar.load(*self.calendar_store.load())
            for booking in dropped:
                log.error("cancelling booking %s: %s", booking.id, booking.reason)
            self.bookings.record([BookingEvent(b, "ended") for b in dropped])
        for claim, why in self.ledger.restore((restored or {}).values()):
            log.error("dropping restored claim %s: %s", claim.id, why)
        for claim in list(self.ledger.claims.values()):
            self.tracker.watch_claim(claim)
            self.alarms.arm_timeout(claim)
            self.alarms.arm_until(claim)
        self.commit(self.ledger.schedule(None))
        self.alarms.run_due()
        for booking in list(self.calendar.bookings.values()):  # active; its claim was voided
            if booking.state == ACTIVE and booking.id not in self.ledger.claims:
                self.bookings.start_booking(booking)
        self.serve_queue()
        if self.ledger.claims:
            log.info("restored %d claim(s)", len(self.ledger.claims))
        self.tracker.start_sweeping()
        if self.scopes is not None:
            self._strays = asyncio.ensure_future(self.scopes.stop_strays(set(self.ledger.claims)))
        elif self.settings.isolation == "always":
            log.warning("isolation = \"always\" needs the system service; on this bus "
                        "claims are not isolated")
        self.history.start()

    def close(self) -> None:
        for task in (self._serving, self._strays):
            if task:
                task.cancel()
        self.tracker.close()
        self.alarms.close()
        self.history.close()

    def apply_settings(self, settings: DaemonConfig) -> None:
        """Take new [daemon] settings on a reload (those that need no restart)."""
        self.given = settings
        self.settings = settings = for_the_bus(settings, self.shared, len(self.ledger.gpus))
        self.probe.timeout = settings.probe_timeout
        self.calendar.limits = booking_limits(settings)

    def subscribe(self, listener: Callable[[list[Event]], None]) -> None:
        self._listeners.append(listener)

    def publish(self, items: list) -> None:
        """Tell every subscriber (the bus adapter): events, bookings, notices, GPU use."""
        for listener in self._listeners:
            listener(items)

    # -- operations --------------------------------------------------------------------
    async def claim(self, caller: Caller, ask: ClaimOptions, call_serial: int = 0
                    ) -> tuple[Claim, list[str]]:
        """Grant ``ask.demand`` all or nothing, or queue it (``ask.wait``); returns the claim
        (granted or queued) and any warnings.

        ``member_pids`` are further processes of the caller that belong to the claim from
        the start (gpuctl run's wrapper, which adopts the command's orphans).  A queued
        claim leaves the queue after its timeout, or when its owner exits.  A claim with a
        duration ends that long after it was asked for; every claim is granted only until
        the next booking needs what it holds (``until_usec``).  It belongs to its session
        (default: the owner's Unix session).

        ``dry_run`` decides by the same admission, on a copy of the ledger: the claim
        it answers (granted, or queued) was never made, and nothing else changed.
        ``call_serial``: the serial of the caller's bus call, kept with a waiting claim
        for ``claim_of_call``.  ``isolate``: whether its processes are to be confined to
        its GPUs (``confine``)."""
        demand, wait, dry_run = ask.demand, ask.wait, ask.dry_run
        self._check_limits(caller, wait, demand)
        isolated = self.isolated(ask.isolate, ask.mode, caller.uid)
        if ask.mode not in MODES:
            raise InvalidArgs(f"mode must be one of {', '.join(MODES)}, not {quoted(ask.mode)}")
        if ask.priority >= BOOKING_PRIORITY:
            raise InvalidArgs(f"priority {ask.priority} is kept for bookings: at most "
                              f"{BOOKING_PRIORITY - 1}")
        if ask.duration_usec is not None and not 0 < ask.duration_usec <= MAX_DURATION_USEC:
            raise InvalidArgs("a claim must last more than 0 seconds and at most 10 years")
        member_pids = tuple(dict.fromkeys(ask.member_pids))  # each once, in order
        if len(member_pids) > MAX_MEMBERS:
            raise InvalidArgs(f"{len(member_pids)} member pids given, at most {MAX_MEMBERS} "
                              "may be (the daemon adopts their descendants by itself)")
        look = self.probe.begin() if self._needs_evidence(demand) else None  # (checked meanwhile)
        owner_pid = caller.pid if ask.owner_pid is None else ask.owner_pid
        pinned = [_callers_process(caller, owner_pid, "owner", self.tracker.watcher)]
        try:
            session = self.session_of(pinned[0][0].pid, ask.session)
            self._check_limits(caller, wait, demand, session)  # the session's, now it is known
            pinned += [_callers_process(caller, pid, "member", self.tracker.watcher)
                       for pid in member_pids]
            user = await self.user_name(caller.uid)
            self.alarms.run_due()  # bookings due by now have started: the decision sees them
            now = self.clock()
            timeout, duration = ask.queue_timeout_usec, ask.duration_usec
            request = ClaimRequest(demand=demand, mode=ask.mode, owner=pinned[0][0],
                                   uid=caller.uid, user=user, label=ask.label,
                                   task_name=ask.task_name,
                                   members=frozenset(ref for ref, _ in pinned[1:]),
                                   priority=ask.priority, reclaimable=ask.reclaimable,
                                   queue_deadline_usec=0 if timeout is None else now + timeout,
                                   session=session, reply_to=caller.bus_name,
                                   reply_serial=call_serial,
                                   end_usec=0 if duration is None else now + duration,
                                   isolated=isolated, on=ask.on)
            busy, warnings = frozenset(), []
            if self._needs_evidence(demand):  # again: a waiter for GPUs may have come since
                busy, warnings = self.tracker.busy_gpus(await self.probe.processes(look))
            # The decision: synchronous from here on, on the ledger as it is now.
            claim_id = self.new_id()
            ledger = copy.deepcopy(self.ledger) if dry_run else self.ledger
            events, refusal = ledger.submit(request, claim_id, self.clock(), busy, wait)
        except BaseException as exc:
            for _, fd in pinned:
                os.close(fd)
            if isinstance(exc, ResourcedError) and not dry_run:
                self.audit_refusal(caller, demand, exc)
            raise
        if dry_run:
            for _, fd in pinned:
                os.close(fd)
            if refusal is not None:
                raise refusal
            claim = ledger.claims[claim_id]
            return claim, [*warnings, *self.until_warning(claim)]
        claim = self.ledger.claims.get(claim_id)
        self.commit(events, undo=lambda: claim and self.ledger.release(claim_id, CANCELLED))
        if refusal is not None:
            for _, fd in pinned:
                os.close(fd)
            self.audit_refusal(caller, demand, refusal)
            raise refusal
        for ref, fd in pinned:
            self.tracker.watcher.watch_pidfd((claim.id, ref), ref, fd)
        self.alarms.arm_timeout(claim)
        return claim, [*warnings, *self.until_warning(claim)]

    def _needs_evidence(self, demand: Demand) -> bool:
        """Whether a claim's decision needs to know what runs on the GPUs: it wants GPUs,
        or its grant or release may serve a waiter that does."""
        return demand.wants_gpu or bool(self.ledger.waiting.wanting_gpus)

    def until_warning(self, claim: Claim) -> list[str]:
        """What a grant until a booking says about it (none for a claim that is not)."""
        if not claim.until_booking:
            return []
        booking = self.calendar.bookings.get(claim.until_booking)
        return [f"granted until {iso_utc(claim.until_usec)} only: booked from then"
                f"{f' by {booking.user}' if booking else ''}; you will be asked to give it "
                "back then"]

    def session_of(self, pid: int, given: str | None) -> str:
        """The session a request names (checked), or its process's Unix session. Session
        0 is a real answer: the process's session leader is outside its PID namespace
        (a container started without a new session), and all such processes share it."""
        if given is not None:
            check_session(given)
            return given
        sid = process_session(pid) if pid > 0 else None
        return "" if sid is None else default_session(sid)

    def _check_limits(self, caller: Caller, wait: bool, demand: Demand,
                      session: str | None = None) -> None:
        """Refuse a request past the caller's per-user limits (or, given a ``session``,
        that session's), before any work; the message names the setting.  A session's
        limits hold for everyone (an agent swarm run as root too); a user's spare only
        those ``exempt_users`` names."""
        if session is None and caller.uid in self.calendar.limits.exempt:
            return
        s = self.settings
        gpus = demand.gpu_count
        if session is None:
            whose, suffix = f"uid {caller.uid}", "user"
            limits = (s.max_claims_per_user, s.max_waiting_per_user, s.max_gpus_per_user)
        else:
            whose, suffix = f"session {session}", "session"
            limits = (s.max_claims_per_session, 0, s.max_gpus_per_session)
        most_claims, most_waiting, most_gpus = limits
        claims, waiting, held = self.ledger.counts_of(caller.uid, session)
        if most_claims and claims >= most_claims:
            raise LimitExceeded(f"{whose} already has {claims} claims, the most one {suffix} "
                                f"may have (max_claims_per_{suffix}); release some first")
        if wait and most_waiting and waiting >= most_waiting:
            raise LimitExceeded(f"{whose} already has {waiting} waiting claims, the most "
                                f"one {suffix} may have (max_waiting_per_{suffix})")
        if most_gpus and gpus and held + gpus > most_gpus:
            raise LimitExceeded(f"{whose} holds or waits for {held} GPU(s); {gpus} more would "
                                f"pass the most one {suffix} may have, {most_gpus} "
                                f"(max_gpus_per_{suffix})")

    async def release(self, caller: Caller, claim_id: str, force: bool = False,
                      reason: str = "", admin: bool = False, dry_run: bool = False) -> list[str]:
        """End a claim; refused while its processes still use its GPUs unless ``force``.

        Only the claim's user (or root) may, unless ``admin`` (the caller was authorized
        to release other users' claims).  ``dry_run`` makes every check and ends nothing."""
        claim = self.check_owner(caller, self.claim_of(claim_id), admin)
        if claim.state == QUEUED:
            if not dry_run:
                self.end(claim_id, CANCELLED, caller, reason)
            return []
        # The check runs forced or not, so that "forced" in the audit trail means it
        # overrode something (a lease's own release is a plain release).
        warnings, how = [], RELEASED
        evidence = await self.probe.processes()
        self.tracker.saw(evidence)
        in_use = await self.tracker.processes_on_gpus_of(self.claim_of(claim_id), evidence)
        claim = self.check_owner(caller, self.claim_of(claim_id), admin)  # re-validate
        if not evidence.known:
            warnings.append(f"released without checking the GPUs: {evidence.reason}")
        elif in_use and not force:
            listed = ", ".join(f"pid {pid} ({command_line(pid) or '?'})" for pid in in_use)
            raise StillInUse(f"claim {claim_id} still has processes on its GPUs: {listed}; "
                             "stop them, or release with --force")
        if force and (in_use or reason or caller.uid != claim.uid):
            how = FORCED
        if not dry_run:
            self.end(claim_id, how, caller, reason)
        return warnings

    # -- Slurm jobs --------------------------------------------------------------------

    def stop(self, caller: Caller, uid: int, session: str | None, reason: str = "",
             admin: bool = False, dry_run: bool = False) -> tuple[list[Claim], list[Booking]]:
        """End at once every live claim and booking of one user's ``session`` (None: all of
        the user's): the claims are told first (``StopAsked``: their commands get the
        reclaim signal), then released whatever runs ("stopped"); bookings are cancelled
        (active ones released).  Another user's needs ``admin`` and a reason.  Returns
        what it stopped (``dry_run``: what it would stop)."""
        if session is not None:
            check_session(session)
        if uid != caller.uid and caller.uid != 0 and not admin:
            raise NotClaimOwner(f"uid {uid}'s sessions are not yours to stop")
        if uid != caller.uid and not reason:
            raise InvalidArgs("stopping someone else's session needs a reason")
        self.alarms.run_due()
        claims = [c for c in self.ledger.claims.values() if c.uid == uid
                  and c.mode not in (BOOKING, SLURM) and (session is None or c.session == session)]
        bookings = [b for b in self.calendar.bookings.values() if b.uid == uid
                    and b.state != ENDED and (session is None or b.session == session)]
        if dry_run or not (claims or bookings):
            return claims, bookings
        audit(f"stop of uid {uid}'s {f'session {session}' if session else 'sessions'} by uid "
              f"{caller.uid}: {len(claims)} claim(s), {len(bookings)} booking(s)"
              f"{f': {reason}' if reason else ''}", priority=4 if uid != caller.uid else 5,
              uid=uid, event="stop", reason=reason)
        booked = [self.ledger.claims[b.id] for b in bookings if b.id in self.ledger.claims]
        self.commit([StopAsked(c, caller.uid, reason) for c in claims + booked
                     if c.state == GRANTED])
        stopped = []
        for booking in bookings:
            stopped.append(self.bookings.cancel(caller, booking.id, reason or "stopped",
                                                admin=uid != caller.uid))
        for claim in claims:
            if claim.id in self.ledger.claims:
                self.end(claim.id, STOPPED, caller, reason)
        return claims, stopped

    def audit_refusal(self, caller: Caller, demand: Demand, exc: ResourcedError) -> None:
        audit(f"refused {self.ledger.describe(demand)} to uid {caller.uid}: {exc.message}",
              priority=4, uid=caller.uid, event="refused", refusal=exc.code)

    def claim_of_call(self, bus_name: str, serial: int) -> Claim:
        """The live claim that connection ``bus_name``'s call ``serial`` made waiting: for
        a caller that lost the reply (interrupted, or the daemon restarted meanwhile)."""
        if serial:
            for claim in self.ledger.claims.values():
                if claim.reply_serial == serial and claim.reply_to == bus_name:
                    return claim
        raise NoSuchClaim(f"no live claim was made waiting by call {serial} of {bus_name}")

    def withdraw(self, claim_id: str, why: str) -> None:
        """Take a queued claim out of the queue for a reason of resourced's (audited)."""
        if (claim := self.ledger.claims.get(claim_id)) is not None and claim.state == QUEUED:
            self.end(claim_id, CANCELLED, None, why)

    def holder_of(self, gpu_name: str) -> Claim:
        """The claim holding a GPU named by alias, index or UUID."""
        gpu = self.ledger.gpu_by_name(gpu_name)
        holder = self.ledger.holder(gpu.uuid)
        if holder is None:
            raise NoSuchClaim(f"{gpu.label} is not claimed")
        return holder

    # -- views -------------------------------------------------------------------------

    # -- the queue ---------------------------------------------------------------------
    def serve_queue(self) -> None:
        """Walk the queue after something was freed, when a waiter wants GPUs (the ledger
        walked it already for the others).  That walk grants GPUs on evidence gathered for
        it, as fresh as the claim path's, never on an older look: a GPU may have started
        running a stranger's process since."""
        if bool(self.ledger.waiting.wanting_gpus) and self._serving is None:
            self._serving = asyncio.ensure_future(self._serve_with_evidence())

    async def _serve_with_evidence(self) -> None:
        try:
            busy, _ = self.tracker.busy_gpus(await self.probe.processes())
            self.commit(self.ledger.schedule(busy))
        except Exception:
            log.exception("serving the queue failed")
        finally:
            self._serving = None

    # -- evidence ----------------------------------------------------------------------

    # -- usage history -----------------------------------------------------------------

    # -- liveness ----------------------------------------------------------------------

    # -- internals ---------------------------------------------------------------------
    def isolated(self, isolate: bool | None, mode: str, uid: int) -> bool:
        """Whether a new claim of user ``uid`` is isolated: as it asked, else as the
        configuration says (an opt-out under "always" was authorized by the bus layer).
        Root's never is: the helper moves no root process (resourced.isolation.helper)."""
        if isolate is None:
            return (self.settings.isolation == "always" and self.scopes is not None
                    and mode != SLURM and uid != 0)
        if not isolate:
            return False
        if mode == SLURM:
            raise InvalidArgs("a Slurm job's GPUs are Slurm's to confine (ConstrainDevices)")
        if self.scopes is None:
            raise InvalidArgs(UNAVAILABLE_ON_USER_BUS)
        if self.settings.isolation == "off":
            raise InvalidArgs('isolation is off on this machine: its administrator may set '
                              '[daemon] isolation = "opt-in" (then systemctl reload resourced)')
        if uid == 0:
            raise InvalidArgs("root's commands are never confined (the isolation helper "
                              "moves no root process): run the command as the user it is for")
        return True

    async def confine(self, caller: Caller, claim_id: str, pid: int) -> str:
        """Run the caller's process ``pid`` in the claim's scope, where it can open the
        claim's GPUs and no others; the scope's unit name.  The scope ends with the claim."""
        claim = self.check_owner(caller, self.claim_of(claim_id))
        if self.scopes is None:
            raise InvalidArgs(UNAVAILABLE_ON_USER_BUS)
        if not claim.isolated:
            raise InvalidArgs(f"claim {claim_id} is not isolated (claim with --isolate)")
        if claim.state != GRANTED:
            raise InvalidArgs(f"claim {claim_id} is not granted yet")
        ref, fd = _callers_process(caller, pid, "confined", self.tracker.watcher)
        os.close(fd)
        minors = [g.minor for u in claim.gpus if (g := self.ledger.gpus[u]).minor is not None]
        devices = allowed(minors, proc_devices=read_proc_devices())
        unit = await self.scopes.confine(claim.id, claim.uid, [ref.pid], devices,
                                         STOP_TIMEOUT_USEC)
        if claim.id not in self.ledger.claims:  # it ended while the scope was made
            self.scopes.stop(claim.id)
            raise NoSuchClaim(f"claim {claim_id} ended meanwhile")
        return unit

    def claim_of(self, claim_id: str) -> Claim:
        """A live claim; for one that ended, NoSuchClaim says when and how."""
        try:
            return self.ledger.get(claim_id)
        except NoSuchClaim:
            raise self.departed.refusal(claim_id) from None

    @staticmethod
    def check_owner(caller: Caller, claim: Claim, admin: bool = False) -> Claim:
        if not admin and caller.uid not in (0, claim.uid):
            raise NotClaimOwner(f"claim {claim.id} belongs to {claim.user or claim.uid}")
        return claim

    def end(self, claim_id: str, how: str, caller: Caller | None, reason: str) -> None:
        claim = self.claim_of(claim_id)
        events = self.ledger.release(claim_id, how, busy=None)
        if reason or how == FORCED:
            who = f"uid {caller.uid}" if caller else "resourced"
            by_owner = caller is not None and caller.uid == claim.uid
            audit(f"{how} release of {claim_id} by {who}: {reason or 'no reason given'}",
                  priority=5 if by_owner else 4, claim=claim_id, uid=claim.uid,
                  gpu=",".join(claim.gpus), event=f"{how}-release", reason=reason)
        self.commit(events)

    def new_id(self, prefix: str = "c") -> str:
        """A fresh reference: claims and bookings share one space (an active booking is a
        claim of the same id)."""
        while True:
            n = int.from_bytes(secrets.token_bytes(5), "big")
            ref = prefix + "".join([ID_ALPHABET[(n >> shift) % 36] for shift in ID_SHIFTS])
            if ref not in self.ledger.claims and ref not in self.calendar.bookings and \
                    ref not in self.calendar.blackouts and ref not in self.calendar.notices:
                return ref

    def commit(self, events: list[Event], undo=None) -> None:
        """Persist ``events`` (before anyone hears of them), then audit and publish them;
        a release also starts the walk that serves waiters for GPUs (``_serve_queue``).

        If they cannot be persisted and ``undo`` is given, the change is undone and the
        caller gets an error: nothing is acknowledged that a restart would forget.
        """
        if not events:
            return
        for event in events:
            if isinstance(event, ClaimReleased):
                self.departed.note(event.claim.id, event.reason, self.clock())
                self.tracker.forget(event.claim)
                self.history.keep_hold(event.claim)
                if event.claim.isolated and self.scopes is not None:
                    self.scopes.stop(event.claim.id)
            elif isinstance(event, (ClaimGranted, UntilChanged)):
                if isinstance(event, ClaimGranted):
                    self.tracker.granted_at[event.claim.id] = self.clock()
                self.alarms.deadlines.cancel(("queue", event.claim.id))
                self.alarms.arm_until(self.ledger.claims[event.claim.id])
        if self.store is not None:
            try:
                self.store.record(events, self.ledger.claims)
            except OSError as exc:
                log.error("cannot persist claims to %s: %s", self.store.path, exc)
                if undo is not None:
                    undo()
                    raise Internal("the daemon cannot record claims; see its log") from exc
        # The audit lines are written after the reply: the log is not on the caller's clock.
        self.after_reply(self._audit_all, events)
        self.publish(events)
        if any(isinstance(e, ClaimReleased) for e in events):
            self.serve_queue()  # what was freed may serve a waiter for GPUs

    def _audit_all(self, events: list[Event]) -> None:
        for event in events:
            self._audit(event)

    def _audit(self, event: Event) -> None:
        c = event.claim
        gpus = ",".join(c.gpus)
        if isinstance(event, ClaimGranted):
            audit(f"granted {c.id} ({c.mode}, {self.ledger.describe(c.demand)}) to {c.user or c.uid}"
                  f"{': ' + gpus if gpus else ''}", claim=c.id, uid=c.uid, gpu=gpus, event="granted")
        elif isinstance(event, ClaimQueued):
            audit(f"queued {c.id} ({self.ledger.describe(c.demand)}, priority {c.priority}) for "
                  f"{c.user or c.uid}", claim=c.id, uid=c.uid, event="queued")
        elif isinstance(event, ReclaimAsked):
            audit(f"asked {c.id} back for {event.waiter.id} (priority {event.waiter.priority})",
                  claim=c.id, uid=c.uid, gpu=gpus, event="reclaim-asked")
        elif isinstance(event, ClaimReleased):
            audit(f"released {c.id} ({event.reason}): {gpus}",
                  claim=c.id, uid=c.uid, gpu=gpus, event="released", reason=event.reason)
        elif isinstance(event, OwnerDied):
            audit(f"owner {c.owner.pid} of {c.id} exited", claim=c.id, uid=c.uid, gpu=gpus,
                  event="owner-died")

    async def off_loop(self, fn, *args):
        """Run a blocking call in a thread; give up waiting after ``probe_timeout``."""
        return await off_loop(fn, *args, timeout=self.settings.probe_timeout)

    async def user_name(self, uid: int) -> str:
        """``user_name`` off the loop (the user database may be a network's), kept once
        found."""
        if uid not in self._user_names:
            try:
                name = await self.off_loop(user_name, uid)
            except TimeoutError:
                return str(uid)
            if name == str(uid):
                return name
            self._user_names[uid] = name
        return self._user_names[uid]


def _callers_process(caller: Caller, pid: int, role: str,
                     watcher: ExitWatcher) -> tuple[ProcessRef, int]:
    """The live process ``pid`` and a pidfd pinning it (from ``watcher``'s, where it holds
    one: a process that claims again); it must be the caller's own (root may name any).
    ``pid`` is in the caller's pid namespace: a caller in a container names its own."""
    highest = pid_max()
    if not 0 < pid <= highest:
        raise InvalidArgs(f"{role} pid {pid} is out of range: pids run from 1 to {highest}")
    given = pid
    if caller.nested:  # a caller in a container names the pids of its namespace
        pid = in_callers_namespace(caller.pid, pid)
    try:
        pinned = None if pid is None else watcher.pin(pid) or pin_process(pid)
    except OSError as exc:
        log.error("cannot pin %s process %d: %s", role, pid, exc)
        raise Internal(f"the daemon cannot watch process {pid} now ({exc.strerror}); "
                       "see its log") from exc
    if pinned is not None and pid != given and (ns_pids(pid) or [0])[-1] != given:
        os.close(pinned[1])  # the number was taken again meanwhile
        pinned = None
    if pinned is None:
        raise InvalidArgs(f"{role} process {given} does not exist")
    if caller.uid != 0 and process_uid(pid) != caller.uid:
        os.close(pinned[1])
        raise NotProcessOwner(f"process {given} does not belong to uid {caller.uid}")
    return pinned


