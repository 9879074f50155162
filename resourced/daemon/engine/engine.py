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
import sqlite3
import string
from collections.abc import Callable
from dataclasses import dataclass, replace

from resourced.backends import Backend, NoGpus
from resourced.config import DaemonConfig, GpuEntry, SlurmConfig
from resourced.core.attribution import attribute, children_of, claim_processes, descendants
from resourced.core.calendar import Booking, BookingEvent, Calendar
from resourced.core.caller import Caller
from resourced.core.claims import (
    BOOKING,
    BOOKING_PRIORITY,
    MODES,
    SLURM,
    Claim,
    ClaimRequest,
    Demand,
    ProcessRef,
    check_session,
    default_session,
)
from resourced.core.clock import Clock, Deadlines, utc_text, wall_clock
from resourced.core.inventory import Gpu
from resourced.core.ledger import (
    ClaimEnding,
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
    DEAD_OWNER,
    ENDED,
    EXPIRED,
    FORCED,
    GRANTED,
    IDLE,
    JOB_ENDED,
    QUEUED,
    RELEASED,
    STOPPED,
    TIMEOUT,
)
from resourced.core.pools import Pool
from resourced.core.usage import Hold as UsageHold
from resourced.core.usage import report as usage_report
from resourced.core.usewatch import UNKNOWN, UNUSED, USED, UseWatch
from resourced.core.verify import GpuReport, SeenProcess, verify
from resourced.errors import (
    Internal,
    InvalidRequest,
    LimitExceeded,
    NoSuchClaim,
    NotClaimOwner,
    NotProcessOwner,
    ResourcedError,
    StillInUse,
    quoted,
)
from resourced.evidence.gpuprobe import GpuEvidence, GpuProbe
from resourced.evidence.liveness import ExitWatcher
from resourced.evidence.pidns import (
    claim_named_by,
    container_of,
    in_callers_namespace,
    nested,
    ns_pids,
)
from resourced.evidence.processes import pid_max, pin_process, process_session, process_uid
from resourced.evidence.proctable import ancestry, command_line, read_table
from resourced.evidence.subids import owner_of
from resourced.evidence.subids import ranges as subuid_ranges
from resourced.isolation.devices import allowed, read_proc_devices
from resourced.isolation.scopes import STOP_TIMEOUT_USEC, UNAVAILABLE_ON_USER_BUS
from resourced.linux.sd import audit, one_write
from resourced.linux.threads import off_loop
from resourced.linux.users import user_name

from ..after_reply import AfterReply
from ..store.usage import retention as usage_retention
from .calendar import CalendarOperations, booking_limits
from .slurm_jobs import job_label, job_steps, slurm_gpus

log = logging.getLogger("resourced")

ID_ALPHABET = string.ascii_lowercase + string.digits
MAX_MEMBERS = 64
"""Member pids one claim may name: a wrapper or two, not a process table."""
TRACK_INTERVAL = 1.0
"""Seconds between tracking sweeps while claims exist."""
IDLE_LOOK_INTERVAL = 5.0
"""Seconds at most between two looks at what runs on the GPUs, claims or none: a free GPU
that runs processes nobody claimed is shown busy within this time."""
MAX_DURATION = 10 * 365 * 86400
"""The longest a claim may ask to last (seconds)."""
PRUNE_INTERVAL = 3600 * 1_000_000
"""Microseconds between forgetting ended bookings past their retention."""
HOLDS_WRITTEN_AFTER = 1.0
"""Seconds an ended claim's hold may wait to be written to the usage history, with the
others of that second, in one transaction (before any read of the history, and at
close).  A crash loses at most these, as the history's own WAL may lose its last
commits: a write for every release cost about a twentieth of a claim and release."""
JOB_START_GRACE = 60 * 1_000_000
"""Microseconds a Slurm job's claim waits for the job's first process (its prolog runs
before any); one that never came ends then (the epilog may have been missed)."""


@dataclass(frozen=True)
class GpuUseChanged:
    """Free GPUs that began or ceased to run processes nobody claimed (``busy``)."""

    gpus: frozenset[str]


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


class Engine(CalendarOperations):
    def __init__(self, backend: Backend, store=None, settings: DaemonConfig = DaemonConfig(),
                 configured: tuple[GpuEntry, ...] = (), pools: tuple[Pool, ...] = (),
                 clock: Clock = wall_clock, calendar_store=None, poll_clock: bool = False,
                 usage_store=None, slurm: SlurmConfig = SlurmConfig(), scopes=None):
        self.backend = backend
        self.scopes = scopes  # claims' systemd scopes (isolation.Scopes); None: not on this bus
        self.store = store  # a ClaimStore, or None to keep claims in memory only
        self.calendar_store = calendar_store  # a CalendarStore, or None: bookings in memory
        self.usage_store = usage_store  # a UsageStore, or None: no usage history
        self.poll_clock = poll_clock  # a simulated clock: look at it at least each second
        self.settings = settings
        self.configured = configured
        self.pools = pools
        self.slurm = slurm
        self.clock = clock
        self._serving: asyncio.Task | None = None  # a queue walk waiting for fresh evidence
        self._busy_free: set[str] = set()  # free GPUs last found running strangers' processes
        self.deadlines = Deadlines()  # (kind, id) -> when: see run_due
        self._alarm: asyncio.TimerHandle | None = None  # one timer, for the earliest deadline
        self._alarm_for: int | None = None  # the deadline it is set for
        self.ledger = Ledger([])
        self.calendar = Calendar(self.ledger.timeline, booking_limits(settings))
        self._pruned = 0
        self.present: list[Gpu] = []  # every GPU the backend reports, managed or not
        self.missing: list[GpuEntry] = []
        self.backend_note = getattr(backend, "reason", "")
        self.probe = GpuProbe(backend, settings.probe_timeout)
        self._listeners: list[Callable[[list[Event]], None]] = []
        self.after_reply = AfterReply()  # signals, audit lines: after the replies
        self.after_reply.hold(one_write)
        self._watcher: ExitWatcher | None = None
        self._tracker: asyncio.Task | None = None
        self._sampler: asyncio.Task | None = None
        self._strays: asyncio.Task | None = None  # stopping scopes left by a crash
        self._user_names: dict[int, str] = {}
        self._unwatched: set[tuple[str, ProcessRef]] = set()  # to watch again at the next sweep
        self.uses = UseWatch()  # no-show bookings and idle claims
        self.used_usec: dict[str, int] = {}  # claim id -> time its owner was seen using it
        self._granted_at: dict[str, int] = {}  # claim id -> when it was granted (this run)
        self._looked = 0  # when _observe_use last looked
        self._holds: list[UsageHold] = []  # ended holds not yet written (HOLDS_WRITTEN_AFTER)
        self._holds_due: asyncio.TimerHandle | None = None

    # -- lifecycle ---------------------------------------------------------------------
    async def start(self, restored: dict[str, Claim] | None = None) -> None:
        """Read the inventory, take back ``restored`` claims from before a restart, and
        watch their processes (owners that died meanwhile are handled at once)."""
        loop = asyncio.get_running_loop()
        self._watcher = ExitWatcher(loop, self._process_exited)
        failure = ""
        try:
            self.present = await self._off_loop(self.backend.inventory)
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
            self._record_calendar([BookingEvent(b, "ended") for b in dropped])
        for claim, why in self.ledger.restore((restored or {}).values()):
            log.error("dropping restored claim %s: %s", claim.id, why)
        for claim in list(self.ledger.claims.values()):
            self._watch_claim(claim)
            self._arm_timeout(claim)
            self._arm_until(claim)
        self._commit(self.ledger.schedule(None))
        self.run_due()
        for booking in list(self.calendar.bookings.values()):  # active; its claim was voided
            if booking.state == ACTIVE and booking.id not in self.ledger.claims:
                self._start_booking(booking)
        self._serve_queue()
        if self.ledger.claims:
            log.info("restored %d claim(s)", len(self.ledger.claims))
        self._tracker = asyncio.ensure_future(self._track())
        if self.scopes is not None:
            self._strays = asyncio.ensure_future(self.scopes.stop_strays(set(self.ledger.claims)))
        elif self.settings.isolation == "always":
            log.warning("isolation = \"always\" needs the system service; on this bus "
                        "claims are not isolated")
        if self.usage_store is not None:
            self._sampler = asyncio.ensure_future(self._sample_load())

    def close(self) -> None:
        for task in (self._tracker, self._serving, self._sampler, self._strays):
            if task:
                task.cancel()
        if self._alarm is not None:
            self._alarm.cancel()
        if self._watcher:
            self._watcher.close()
        self._write_holds()

    def apply_settings(self, settings: DaemonConfig) -> None:
        """Take new [daemon] settings on a reload (those that need no restart)."""
        self.settings = settings
        self.probe.timeout = settings.probe_timeout
        self.calendar.limits = booking_limits(settings)

    def subscribe(self, listener: Callable[[list[Event]], None]) -> None:
        self._listeners.append(listener)

    # -- operations --------------------------------------------------------------------
    async def claim(self, caller: Caller, demand: Demand, mode: str,
                    owner_pid: int | None = None, label: str = "", task_name: str = "",
                    member_pids: tuple[int, ...] = (), priority: int = 0, wait: bool = False,
                    timeout: float | None = None, reclaimable: bool = False,
                    duration: float | None = None, session: str | None = None,
                    dry_run: bool = False, call_serial: int = 0,
                    isolate: bool | None = None) -> tuple[Claim, list[str]]:
        """Grant ``demand`` all or nothing, or queue it (``wait``); returns the claim (granted
        or queued) and any warnings.

        ``member_pids`` are further processes of the caller that belong to the claim from
        the start (gpuctl run's wrapper, which adopts the command's orphans).  A queued
        claim leaves the queue after ``timeout`` seconds, or when its owner exits.  A claim
        with a ``duration`` (seconds) ends that long after it was asked for; every claim
        is granted only until the next booking needs what it holds (``until_usec``).  It
        belongs to ``session`` (default: the owner's Unix session).

        ``dry_run`` decides by the same admission, on a copy of the ledger: the claim
        it answers (granted, or queued) was never made, and nothing else changed.
        ``call_serial``: the serial of the caller's bus call, kept with a waiting claim
        for ``claim_of_call``.  ``isolate``: whether its processes are to be confined to
        its GPUs (``confine``); None: as the configuration says."""
        self._check_limits(caller, wait, demand)
        isolated = self._isolated(isolate, mode)
        if mode not in MODES:
            raise InvalidRequest(f"mode must be one of {', '.join(MODES)}, not {quoted(mode)}")
        if priority >= BOOKING_PRIORITY:
            raise InvalidRequest(f"priority {priority} is kept for bookings: at most "
                                 f"{BOOKING_PRIORITY - 1}")
        if duration is not None and not 0 < duration <= MAX_DURATION:
            raise InvalidRequest("a claim must last more than 0 seconds and at most 10 years")
        member_pids = tuple(dict.fromkeys(member_pids))  # each once, in order
        if len(member_pids) > MAX_MEMBERS:
            raise InvalidRequest(f"{len(member_pids)} member pids given, at most {MAX_MEMBERS} "
                                 "may be (the daemon adopts their descendants by itself)")
        look = self.probe.begin() if self._needs_evidence(demand) else None  # (checked meanwhile)
        pinned = [_callers_process(caller, caller.pid if owner_pid is None else owner_pid,
                                   "owner", self._watcher)]
        try:
            session = self._session_of(pinned[0][0].pid, session)
            self._check_limits(caller, wait, demand, session)  # the session's, now it is known
            pinned += [_callers_process(caller, pid, "member", self._watcher)
                       for pid in member_pids]
            user = await self._user_name(caller.uid)
            self.run_due()  # bookings due by now have started: the decision sees them
            now = self.clock()
            deadline = 0 if timeout is None else now + int(timeout * 1e6)
            request = ClaimRequest(demand=demand, mode=mode, owner=pinned[0][0], uid=caller.uid,
                                   user=user, label=label, task_name=task_name,
                                   members=frozenset(ref for ref, _ in pinned[1:]),
                                   priority=priority, reclaimable=reclaimable,
                                   queue_deadline_usec=deadline, session=session,
                                   reply_to=caller.bus_name, reply_serial=call_serial,
                                   end_usec=0 if duration is None else now + int(duration * 1e6),
                                   isolated=isolated)
            busy, warnings = frozenset(), []
            if self._needs_evidence(demand):  # again: a waiter for GPUs may have come since
                busy, warnings = self._busy_gpus(await self.probe.processes(look))
            # The decision: synchronous from here on, on the ledger as it is now.
            claim_id = self._new_id()
            ledger = copy.deepcopy(self.ledger) if dry_run else self.ledger
            events, refusal = ledger.submit(request, claim_id, self.clock(), busy, wait)
        except BaseException as exc:
            for _, fd in pinned:
                os.close(fd)
            if isinstance(exc, ResourcedError) and not dry_run:
                self._audit_refusal(caller, demand, exc)
            raise
        if dry_run:
            for _, fd in pinned:
                os.close(fd)
            if refusal is not None:
                raise refusal
            claim = ledger.claims[claim_id]
            return claim, [*warnings, *self.until_warning(claim)]
        claim = self.ledger.claims.get(claim_id)
        self._commit(events, undo=lambda: claim and self.ledger.release(claim_id, CANCELLED))
        if refusal is not None:
            for _, fd in pinned:
                os.close(fd)
            self._audit_refusal(caller, demand, refusal)
            raise refusal
        for ref, fd in pinned:
            self._watcher.watch_pidfd((claim.id, ref), ref, fd)
        self._arm_timeout(claim)
        return claim, [*warnings, *self.until_warning(claim)]

    def _needs_evidence(self, demand: Demand) -> bool:
        """Whether a claim's decision needs to know what runs on the GPUs: it wants GPUs,
        or its grant or release may serve a waiter that does."""
        return demand.wants_gpu or self.ledger.waiting_for_gpus()

    def until_warning(self, claim: Claim) -> list[str]:
        """What a grant until a booking says about it (none for a claim that is not)."""
        if not claim.until_booking:
            return []
        booking = self.calendar.bookings.get(claim.until_booking)
        return [f"granted until {utc_text(claim.until_usec)} only: booked from then"
                f"{f' by {booking.user}' if booking else ''}; you will be asked to give it "
                "back then"]

    def _session_of(self, pid: int, given: str | None) -> str:
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
        claim = self._check_owner(caller, self.ledger.get(claim_id), admin)
        if claim.state == QUEUED:
            if not dry_run:
                self._end(claim_id, CANCELLED, caller, reason)
            return []
        # The check runs forced or not, so that "forced" in the audit trail means it
        # overrode something (a lease's own release is a plain release).
        warnings, how = [], RELEASED
        evidence = await self.probe.processes()
        self._saw(evidence)
        in_use = await self._processes_on_gpus_of(self.ledger.get(claim_id), evidence)
        claim = self._check_owner(caller, self.ledger.get(claim_id), admin)  # re-validate
        if not evidence.known:
            warnings.append(f"released without checking the GPUs: {evidence.reason}")
        elif in_use and not force:
            listed = ", ".join(f"pid {pid} ({command_line(pid) or '?'})" for pid in in_use)
            raise StillInUse(f"claim {claim_id} still has processes on its GPUs: {listed}; "
                             "stop them, or release with --force")
        if force and (in_use or reason or caller.uid != claim.uid):
            how = FORCED
        if not dry_run:
            self._end(claim_id, how, caller, reason)
        return warnings

    # -- Slurm jobs --------------------------------------------------------------------
    async def claim_job(self, caller: Caller, job: str, gpu_names: list[str], uid: int,
                        name: str = "") -> Claim:
        """Slurm job ``job``'s GPUs here (names: index, UUID or alias) become its claim,
        in mode ``slurm``, for user ``uid``, labelled "slurm <job> <user> <name>"; its
        prolog asks, as root.  The claim is bound to the job's processes (its slurmstepd
        daemons and their descendants, adopted by the tracking sweep) and ends with them,
        at ``release_job`` (the epilog), or JOB_START_GRACE after it was made if none
        appeared.  A job that has a claim gets that claim back, labelled with ``name`` if
        one is given (the prolog claims at once, and names the job once slurmctld told
        it the name)."""
        if not (job.isascii() and job.isdigit()):
            raise InvalidRequest(f"a Slurm job id is a number, not {quoted(job)}")
        existing = self._job_claim(job)
        if existing is not None:
            if name:
                self._commit(self.ledger.relabel(existing.id, job_label(job, existing.user, name)))
            return existing
        if not gpu_names:  # (with a name: naming the job's claim, which has ended)
            raise InvalidRequest(f"Slurm job {job} has no GPU here: nothing to claim")
        uuids = tuple(dict.fromkeys(self._job_gpu(n) for n in gpu_names))
        user = await self._user_name(uid)
        label = job_label(job, user, name)
        self.run_due()
        if (made := self._job_claim(job)) is not None:  # while the user name was looked up
            return made
        claim_id = self._new_id()
        events = self.ledger.start_job(claim_id, job, uuids, uid, user, label, self.clock())
        self._commit(events, undo=lambda: self.ledger.release(claim_id, CANCELLED))
        for uuid in uuids:
            if uuid not in self.ledger.slurm:
                log.warning("Slurm job %s runs on %s, which [slurm] gpus does not give Slurm",
                            job, self.ledger.gpus[uuid].label)
        return self.ledger.claims[claim_id]

    def release_job(self, job: str) -> list[str]:
        """End Slurm job ``job``'s claim (its epilog); the claims ended, none if it had
        ended already."""
        claim = self._job_claim(job)
        if claim is None:
            return []
        self._end(claim.id, JOB_ENDED, None, "")
        return [claim.id]

    def _job_gpu(self, name: str) -> str:
        """The UUID of a GPU as Slurm names it: by UUID or alias, or by Slurm's number k,
        which counts the node's GPUs in gres.conf's order: the k-th of [slurm] gpus by
        index (our index k when the config gives Slurm none)."""
        slurm = sorted(self.ledger.slurm, key=lambda u: self.ledger.gpus[u].index)
        if not (slurm and name.isascii() and name.isdigit()):
            return self.ledger.gpu_by_name(name).uuid
        if int(name) >= len(slurm):
            raise InvalidRequest(f"Slurm's GPU {name} is not here: [slurm] gpus gives Slurm "
                                 f"{len(slurm)} GPU(s), numbered from 0 in index order")
        return slurm[int(name)]

    def _job_claim(self, job: str) -> Claim | None:
        return next((c for c in self.ledger.claims.values() if c.job == job), None)

    def _end_unstarted_jobs(self) -> None:
        now = self.clock()
        for claim in list(self.ledger.claims.values()):
            if claim.job and not claim.members and now - claim.created_usec > JOB_START_GRACE:
                self._end(claim.id, JOB_ENDED, None,
                          f"no process of Slurm job {claim.job} appeared in "
                          f"{JOB_START_GRACE // 1_000_000} s")

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
            raise InvalidRequest("stopping someone else's session needs a reason")
        self.run_due()
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
        self._commit([StopAsked(c, caller.uid, reason) for c in claims + booked
                      if c.state == GRANTED])
        stopped = []
        for booking in bookings:
            stopped.append(self.cancel_booking(caller, booking.id, reason or "stopped",
                                               admin=uid != caller.uid))
        for claim in claims:
            if claim.id in self.ledger.claims:
                self._end(claim.id, STOPPED, caller, reason)
        return claims, stopped

    def _arm_timeout(self, claim: Claim) -> None:
        if claim.state == QUEUED and claim.queue_deadline_usec:
            self.deadlines.set(("queue", claim.id), claim.queue_deadline_usec)
            self._rearm()

    def _arm_until(self, claim: Claim) -> None:
        """A granted claim's end (its own, or a booking's start), and the warning before
        (both replacing any set before: the end may have moved, or gone)."""
        self.deadlines.cancel(("until", claim.id))
        self.deadlines.cancel(("warn", claim.id))
        if claim.state != GRANTED or not claim.until_usec:
            return
        if claim.mode != "booking":  # a booking's claim ends with the booking
            self.deadlines.set(("until", claim.id), claim.until_usec)
        warn = claim.until_usec - int(self.settings.warn_before * 1e6)
        if warn > self.clock():
            self.deadlines.set(("warn", claim.id), warn)
        self._rearm()

    def run_due(self) -> None:
        """Act on every deadline due by the clock's now: a waiter's queue timeout
        (``queue``), a claim's end or a booking's start on what it holds (``until``), the
        warning before either (``warn``), and the calendar's starts and ends.  The alarm
        calls this, and so does every operation before deciding (tests with a manual clock
        call it after moving the clock)."""
        now = self.clock()
        for kind, claim_id in self.deadlines.due(now):
            if kind == "queue":
                self._queue_timeout(claim_id)
            elif kind == "until":
                self._until_reached(claim_id)
            elif kind == "warn" and claim_id in self.ledger.claims:
                self._commit([ClaimEnding(self.ledger.claims[claim_id])])
        when = self.calendar.next_due()
        if when is not None and when <= now:
            events, _ = self.calendar.due(now)
            self._calendar_changed(events)
        if now - self._pruned >= PRUNE_INTERVAL:
            self._pruned = now
            gone = self.calendar.prune(now)
            if gone and self.calendar_store is not None:
                self._record_calendar([], forgotten=gone)
        self._rearm()

    def _rearm(self) -> None:
        """One loop timer, for the earliest deadline (at least each second on a simulated
        clock, which may jump); left as it is when that deadline has not changed (every
        operation runs the deadlines first: the timer is not made again each time)."""
        when = min((w for w in (self.deadlines.next(), self.calendar.next_due()) if w is not None),
                   default=None)
        if self._alarm is not None and not self.poll_clock and when == self._alarm_for:
            return
        if self._alarm is not None:
            self._alarm.cancel()
            self._alarm = None
        self._alarm_for = when
        if when is not None or self.poll_clock:
            delay = 1.0 if when is None else max(0.0, (when - self.clock()) / 1e6)
            if self.poll_clock:
                delay = min(delay, 1.0)
            self._alarm = asyncio.get_running_loop().call_later(delay, self._alarm_rang)

    def _alarm_rang(self) -> None:
        self._alarm = None  # spent: run_due sets the next one, even for the same deadline
        self.run_due()

    def _until_reached(self, claim_id: str) -> None:
        """A claim's time is up: its own end releases it; a booking's start makes it
        overdue (asked back by the booking's claim)."""
        claim = self.ledger.claims.get(claim_id)
        if claim is None or claim.state != GRANTED:
            return
        if claim.until_booking:
            audit(f"{claim_id} is past its time: booking {claim.until_booking} needs what it "
                  "holds", priority=5, claim=claim_id, uid=claim.uid, event="overdue")
            self._commit(self.ledger.overdue(claim_id, busy=None))
        else:
            self._end(claim_id, EXPIRED, None, "")

    def _queue_timeout(self, claim_id: str) -> None:
        claim = self.ledger.claims.get(claim_id)
        if claim is not None and claim.state == QUEUED:
            self._commit(self.ledger.release(claim_id, TIMEOUT, busy=None))

    def _audit_refusal(self, caller: Caller, demand: Demand, exc: ResourcedError) -> None:
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
            self._end(claim_id, CANCELLED, None, why)

    def holder_of(self, gpu_name: str) -> Claim:
        """The claim holding a GPU named by alias, index or UUID."""
        gpu = self.ledger.gpu_by_name(gpu_name)
        holder = self.ledger.holder(gpu.uuid)
        if holder is None:
            raise NoSuchClaim(f"{gpu.label} is not claimed")
        return holder

    async def verify(self) -> list[GpuReport]:
        """Compare the claims with the compute processes the driver reports on each GPU."""
        evidence = await self.probe.processes()
        self._saw(evidence)
        if any(c.job for c in self.ledger.claims.values()):  # a step may have begun since
            self._adopt(*await self._off_loop(_table_and_steps))  # the last sweep
        pids = [p.pid for procs in (evidence.processes or {}).values() for p in procs]
        uids = {c.id: c.uid for c in self.ledger.claims.values()}
        chains, details = await self._off_loop(_observe, pids, uids)
        owned = claim_processes(self.ledger.claims.values())
        seen = None
        if evidence.known:
            seen = {}
            for uuid, procs in evidence.processes.items():
                seen[uuid] = []
                for p in procs:
                    uid, user, command, container, started_for = details[p.pid]
                    who = attribute(chains[p.pid], owned, started_for)
                    seen[uuid].append(SeenProcess(p.pid, p.used_memory_bytes, uid, user, command,
                                                  who.claim_id, who.ambiguous, container))
        missing = [(e.uuid, e.alias or "", e.index if e.index is not None else -1)
                   for e in self.missing]
        return verify(self.ledger, seen, evidence.reason, missing)

    # -- views -------------------------------------------------------------------------
    def gpu_state(self, gpu: Gpu) -> str:
        """free, claimed (held whole), shared (VRAM shares on it), busy (nobody claimed
        it, but processes run on it: the latest look) or slurm (free, but Slurm's to
        schedule)."""
        if self.ledger.holder(gpu.uuid):
            return "claimed"
        if self.ledger.vram_used(gpu.uuid):
            return "shared"
        if gpu.uuid in self.ledger.slurm:
            return "slurm"
        return "busy" if gpu.uuid in self._busy_free else "free"

    def free_count(self) -> int:
        """Free GPUs: nobody holds or shares them, and no process ran on them at the
        latest look."""
        return sum(1 for g in self.ledger.free_gpus() if g.uuid not in self._busy_free)

    # -- the queue ---------------------------------------------------------------------
    def _serve_queue(self) -> None:
        """Walk the queue after something was freed, when a waiter wants GPUs (the ledger
        walked it already for the others).  That walk grants GPUs on evidence gathered for
        it, as fresh as the claim path's, never on an older look: a GPU may have started
        running a stranger's process since."""
        if self.ledger.waiting_for_gpus() and self._serving is None:
            self._serving = asyncio.ensure_future(self._serve_with_evidence())

    async def _serve_with_evidence(self) -> None:
        try:
            busy, _ = self._busy_gpus(await self.probe.processes())
            self._commit(self.ledger.schedule(busy))
        except Exception:
            log.exception("serving the queue failed")
        finally:
            self._serving = None

    # -- evidence ----------------------------------------------------------------------
    def _busy_gpus(self, evidence: GpuEvidence) -> tuple[frozenset[str], list[str]]:
        """GPUs that must not be granted (a process runs there, or the driver does not
        report them), and warnings when the driver could not be asked.

        Every GPU counts, not only those free now: one freed while the evidence was
        awaited was not looked at for that decision, so it is not taken for idle."""
        if not evidence.known:
            log.warning("claim check skipped: %s", evidence.reason)
            return frozenset(), [f"granted without checking the GPUs: {evidence.reason}"]
        self._saw(evidence)
        return frozenset(u for u in self.ledger.gpus if evidence.processes.get(u, None) != []), []

    def _saw(self, evidence: GpuEvidence) -> None:
        """What a look found, kept for what the daemon shows and admits between looks:
        the free GPUs running processes nobody claimed (``busy``: not counted free, not
        granted), and the VRAM held on each GPU by processes no claim on it owns (not
        free to a share).  A change is published as ``GpuUseChanged``."""
        if not evidence.known:
            return
        busy_free = {g.uuid for g in self.ledger.free_gpus()
                     if evidence.processes.get(g.uuid, None) != []}
        foreign = {}
        for uuid, procs in evidence.processes.items():
            if not procs or uuid not in self.ledger.gpus:  # (the common case: nothing runs)
                continue
            own = {ref.pid for c in self.ledger.claims_on(uuid) for ref in c.processes()}
            if held := sum(p.used_memory_bytes for p in procs if p.pid not in own):
                foreign[uuid] = held
        self.ledger.foreign_vram = foreign
        changed, self._busy_free = busy_free ^ self._busy_free, busy_free
        news = sorted(changed & busy_free, key=lambda u: self.ledger.gpus[u].index)
        for uuid in news:  # each said once, when first found
            procs = evidence.processes.get(uuid)
            what = ("not reported by the driver" if procs is None else
                    "pids " + ", ".join(str(p.pid) for p in procs))
            log.warning("%s is unclaimed but busy (%s); not granting it",
                        self.ledger.gpus[uuid].label, what)
        if changed:
            for listener in self._listeners:
                listener([GpuUseChanged(frozenset(changed))])

    async def _processes_on_gpus_of(self, claim: Claim, evidence: GpuEvidence) -> list[int]:
        """The pids on the claim's GPUs that are the claim's own (empty if unknown)."""
        if not evidence.known:
            return []
        listed = {p.pid for uuid in claim.gpus for p in evidence.processes.get(uuid, [])}
        if not listed:
            return []  # the common case: nothing to attribute, no /proc to read
        chains, details = await self._off_loop(_observe, sorted(listed), {claim.id: claim.uid})
        owned = claim_processes([claim])
        return [pid for pid, chain in chains.items()
                if attribute(chain, owned, details[pid][4]).claim_id == claim.id]

    async def _track(self) -> None:
        """While claims exist, adopt descendants, release claims of long-dead owners and
        look at what runs on their GPUs; at least every ``IDLE_LOOK_INTERVAL``, look at
        what runs on the free ones (``_saw``)."""
        unlooked = IDLE_LOOK_INTERVAL  # (the first sweep looks)
        while True:
            await asyncio.sleep(TRACK_INTERVAL)
            unlooked += TRACK_INTERVAL
            try:
                if self.ledger.claims:
                    self._serve_queue()  # a GPU found busy before may be idle now
                    self._watch_again()
                    self._adopt(*await self._off_loop(_table_and_steps))
                    self._end_unstarted_jobs()
                    await self._release_dead_owners()
                    if await self._observe_use():
                        unlooked = 0.0
                if unlooked >= IDLE_LOOK_INTERVAL:
                    unlooked = 0.0
                    self._saw(await self.probe.processes())
            except Exception:
                log.exception("tracking sweep failed")

    def _adopt(self, table, steps: dict[str, set[ProcessRef]]) -> None:
        """Descendants of each claim's processes become its members, and so do a Slurm
        job's step daemons (``steps``: job id -> them) with theirs."""
        children = children_of(table)
        for claim in list(self.ledger.claims.values()):
            stepds = steps.get(claim.job, set()) if claim.job else set()
            found = descendants(table, claim.processes() | stepds, children) | stepds
            new = found - claim.members - {claim.owner}
            if new:
                self._commit(self.ledger.add_members(claim.id, new))
                for ref in new:
                    self._watch(claim.id, ref)

    async def _release_dead_owners(self) -> None:
        grace_usec = int(self.settings.dead_owner_grace * 1e6)
        due = self.ledger.dead_owner_claims(self.clock(), grace_usec)
        if not due:
            return
        evidence = await self.probe.processes()
        if not evidence.known:
            return  # no trustworthy evidence: keep the claims
        for claim in due:
            if claim.id not in self.ledger.claims or await self._processes_on_gpus_of(claim, evidence):
                continue
            if claim.id in self.ledger.claims:  # still there after the await
                self._end(claim.id, DEAD_OWNER, None,
                          f"owner {claim.owner.pid} dead for {self.settings.dead_owner_grace:g} s")

    async def _observe_use(self) -> bool:
        """One look at what runs on the GPUs (True; False: no claim holds a GPU, and it
        did not look): it counts the time each claim's owner used them (usage history)
        and releases active bookings their owner never used (``no_show_after``) and,
        where configured, claims with no process on their GPUs (``idle_after``), on
        trustworthy evidence only (core.usewatch).  Nothing is killed."""
        now = self.clock()
        claims = {c.id: c for c in self.ledger.claims.values() if c.state == GRANTED and c.gpus}
        windows = {}
        for c in claims.values():
            after = self.settings.no_show_after if c.mode == BOOKING else self.settings.idle_after
            if after and c.mode != SLURM:  # a job's GPUs are Slurm's to take back
                windows[c.id] = (int(after * 1e6), c.mode == BOOKING)
        elapsed, self._looked = now - (self._looked or now), now
        if not claims:
            self.uses.observe({}, now, {})
            return False
        evidence = await self.probe.processes()
        self._saw(evidence)
        claims = {i: c for i, c in claims.items() if i in self.ledger.claims}
        owners, anyone = {i: UNKNOWN for i in claims}, {i: UNKNOWN for i in claims}
        if evidence.known:
            listed = {p.pid for c in claims.values() for u in c.gpus
                      for p in evidence.processes.get(u) or ()}
            owners_of = {i: c.uid for i, c in claims.items()}
            uids = await self._off_loop(_uids_of, sorted(listed), owners_of) if listed else {}
            for i, c in claims.items():
                owners[i], anyone[i] = _use_of(c, evidence, uids)
        for i, c in claims.items():
            if owners[i] == USED:
                held = now - self._granted_at.get(i, c.created_usec)
                self.used_usec[i] = self.used_usec.get(i, 0) + min(elapsed, held)
        seen = {i: owners[i] if claims[i].mode == BOOKING else anyone[i]
                for i in windows if i in claims}
        for claim_id in self.uses.observe(seen, self.clock(), windows):
            if claim_id not in self.ledger.claims:
                continue
            if self.ledger.claims[claim_id].mode == BOOKING:
                self._no_show(claim_id)
            else:
                self._end(claim_id, IDLE, None,
                          f"no process on its GPUs for {self.settings.idle_after:g} s")
        return True

    def _no_show(self, booking_id: str) -> None:
        booking = self.calendar.bookings.get(booking_id)
        if booking is None or booking.state != ACTIVE:
            return
        reason = (f"no process of {booking.user or booking.uid} used its GPUs in its first "
                  f"{self.settings.no_show_after:g} s")
        _, events = self.calendar.no_show(booking_id, self.clock(), reason)
        audit(f"booking {booking_id} of {booking.user or booking.uid} released as a no-show: "
              f"{reason}", priority=5, uid=booking.uid, event="no-show", reason=reason)
        self._calendar_changed(events, [(booking_id, booking)])

    # -- usage history -----------------------------------------------------------------
    def _keep_hold(self, claim: Claim) -> None:
        """A claim ended: into the usage history with the time its owner used it (written
        after the reply, like the audit lines)."""
        used = self.used_usec.pop(claim.id, 0)
        granted = self._granted_at.pop(claim.id, claim.created_usec)
        if self.usage_store is None or claim.state != GRANTED or not claim.gpus:
            return
        self._holds.append(self._hold_of(claim, self.clock(), used, granted))
        if self._holds_due is None:
            self._holds_due = asyncio.get_running_loop().call_later(HOLDS_WRITTEN_AFTER,
                                                                    self._write_holds)

    def _write_holds(self) -> None:
        """The ended holds not yet in the usage history, in one transaction."""
        if self._holds_due is not None:
            self._holds_due.cancel()
            self._holds_due = None
        holds, self._holds = self._holds, []
        if holds:
            self._write_usage(self.usage_store.record_holds, holds)

    def _hold_of(self, claim: Claim, now: int, used: int, granted: int | None = None
                 ) -> UsageHold:
        """A granted claim as a hold, from when it was granted (when it was asked for, if
        granted before this daemon started) until ``now``."""
        start = self._granted_at.get(claim.id, claim.created_usec) if granted is None else granted
        return UsageHold(claim.id, "booking" if claim.mode == BOOKING else "claim", claim.uid,
                         claim.user, claim.gpus, start, now, used)

    def _write_usage(self, write, *args) -> None:
        try:
            write(*args)
        except (OSError, sqlite3.Error) as exc:
            log.error("cannot record usage in %s: %s", self.usage_store.path, exc)

    async def _sample_load(self) -> None:
        """Every sample_interval, each GPU's utilisation and memory into the history;
        what is past its retention goes once an hour."""
        pruned = 0
        while True:
            await asyncio.sleep(self.settings.sample_interval)
            try:
                loads = await self._off_loop(self.backend.load)
            except Exception as exc:  # noqa: BLE001 - a missed sample, not a failure
                log.debug("no GPU load sample: %s", exc)
                continue
            now = self.clock()
            managed = {u: v for u, v in loads.items() if u in self.ledger.gpus}
            self._write_usage(self.usage_store.record_load, now, managed)
            if now - pruned >= PRUNE_INTERVAL:
                pruned = now
                self._write_usage(self.usage_store.prune, now, usage_retention(self.settings))

    def usage(self, since_usec: int, until_usec: int, uid: int | None = None,
              by_gpu: bool = False) -> list[dict]:
        """Held, used and idle GPU-hours per user (or per GPU, with mean load) within the
        window: the history, and the live claims so far."""
        now = self.clock()
        self._write_holds()  # the history read whole
        holds = self.usage_store.holds(since_usec, until_usec, uid) if self.usage_store else []
        holds += [self._hold_of(c, now, self.used_usec.get(c.id, 0))
                  for c in self.ledger.claims.values()
                  if c.state == GRANTED and c.gpus and (uid is None or c.uid == uid)]
        loads = self.usage_store.loads(since_usec, until_usec) if (
            self.usage_store and by_gpu) else []
        labels = {u: g.label for u, g in self.ledger.gpus.items()}
        return usage_report(holds, loads, since_usec, until_usec, by_gpu, labels)

    # -- liveness ----------------------------------------------------------------------
    def _watch_claim(self, claim: Claim) -> None:
        if claim.owner_alive:
            self._watch(claim.id, claim.owner)
        for ref in claim.members:
            self._watch(claim.id, ref)

    def _watch(self, claim_id: str, ref: ProcessRef) -> None:
        """Watch a process of a claim; one that cannot be watched now (no descriptor left)
        is kept as alive and tried again at the next sweep, never taken for dead."""
        key = (claim_id, ref)
        try:
            watched = self._watcher.watch(key, ref)
        except OSError as exc:
            if key not in self._unwatched:
                log.error("cannot watch pid %d of %s (%s); trying again", ref.pid, claim_id, exc)
            self._unwatched.add(key)
            return
        self._unwatched.discard(key)
        if not watched:
            self._process_exited(key)

    def _watch_again(self) -> None:
        for claim_id, ref in list(self._unwatched):
            self._unwatched.discard((claim_id, ref))
            if claim_id in self.ledger.claims:
                self._watch(claim_id, ref)

    def _process_exited(self, key: tuple[str, ProcessRef]) -> None:
        claim_id, ref = key
        claim = self.ledger.claims.get(claim_id)
        if claim is None:
            return
        if ref == claim.owner:
            self._commit(self.ledger.owner_died(claim_id, self.clock(), busy=None))
        else:
            self._commit(self.ledger.member_exited(claim_id, ref, busy=None))

    def _forget(self, claim: Claim) -> None:
        for ref in claim.members | {claim.owner}:
            self._watcher.forget((claim.id, ref))
        for kind in ("queue", "until", "warn"):
            self.deadlines.cancel((kind, claim.id))

    # -- internals ---------------------------------------------------------------------
    def _isolated(self, isolate: bool | None, mode: str) -> bool:
        """Whether a new claim is isolated: as it asked, else as the configuration says
        (an opt-out under "always" was authorized by the bus layer)."""
        if isolate is None:
            return (self.settings.isolation == "always" and self.scopes is not None
                    and mode != SLURM)
        if not isolate:
            return False
        if mode == SLURM:
            raise InvalidRequest("a Slurm job's GPUs are Slurm's to confine (ConstrainDevices)")
        if self.scopes is None:
            raise InvalidRequest(UNAVAILABLE_ON_USER_BUS)
        if self.settings.isolation == "off":
            raise InvalidRequest('isolation is off on this machine: its administrator may set '
                                 '[daemon] isolation = "opt-in" (then systemctl reload resourced)')
        return True

    async def confine(self, caller: Caller, claim_id: str, pid: int) -> str:
        """Run the caller's process ``pid`` in the claim's scope, where it can open the
        claim's GPUs and no others; the scope's unit name.  The scope ends with the claim."""
        claim = self._check_owner(caller, self.ledger.get(claim_id))
        if self.scopes is None:
            raise InvalidRequest(UNAVAILABLE_ON_USER_BUS)
        if not claim.isolated:
            raise InvalidRequest(f"claim {claim_id} is not isolated (claim with --isolate)")
        if claim.state != GRANTED:
            raise InvalidRequest(f"claim {claim_id} is not granted yet")
        ref, fd = _callers_process(caller, pid, "confined", self._watcher)
        os.close(fd)
        minors = [g.minor for u in claim.gpus if (g := self.ledger.gpus[u]).minor is not None]
        devices = allowed(minors, proc_devices=read_proc_devices())
        unit = await self.scopes.confine(claim.id, [ref.pid], devices, STOP_TIMEOUT_USEC)
        if claim.id not in self.ledger.claims:  # it ended while the scope was made
            self.scopes.stop(claim.id)
            raise NoSuchClaim(f"claim {claim_id} ended meanwhile")
        return unit

    @staticmethod
    def _check_owner(caller: Caller, claim: Claim, admin: bool = False) -> Claim:
        if not admin and caller.uid not in (0, claim.uid):
            raise NotClaimOwner(f"claim {claim.id} belongs to {claim.user or claim.uid}")
        return claim

    def _end(self, claim_id: str, how: str, caller: Caller | None, reason: str) -> None:
        claim = self.ledger.get(claim_id)
        events = self.ledger.release(claim_id, how, busy=None)
        if reason or how == FORCED:
            who = f"uid {caller.uid}" if caller else "resourced"
            by_owner = caller is not None and caller.uid == claim.uid
            audit(f"{how} release of {claim_id} by {who}: {reason or 'no reason given'}",
                  priority=5 if by_owner else 4, claim=claim_id, uid=claim.uid,
                  gpu=",".join(claim.gpus), event=f"{how}-release", reason=reason)
        self._commit(events)

    def _new_id(self, prefix: str = "c") -> str:
        """A fresh reference: claims and bookings share one space (an active booking is a
        claim of the same id)."""
        while True:
            n = int.from_bytes(secrets.token_bytes(5), "big")
            ref = prefix + "".join(ID_ALPHABET[(n >> (6 * i)) % 36] for i in range(6))
            if ref not in self.ledger.claims and ref not in self.calendar.bookings and \
                    ref not in self.calendar.blackouts and ref not in self.calendar.notices:
                return ref

    def _commit(self, events: list[Event], undo=None) -> None:
        """Persist ``events`` (before anyone hears of them), then audit and publish them;
        a release also starts the walk that serves waiters for GPUs (``_serve_queue``).

        If they cannot be persisted and ``undo`` is given, the change is undone and the
        caller gets an error: nothing is acknowledged that a restart would forget.
        """
        if not events:
            return
        for event in events:
            if isinstance(event, ClaimReleased):
                self._forget(event.claim)
                self._keep_hold(event.claim)
                if event.claim.isolated and self.scopes is not None:
                    self.scopes.stop(event.claim.id)
            elif isinstance(event, (ClaimGranted, UntilChanged)):
                if isinstance(event, ClaimGranted):
                    self._granted_at[event.claim.id] = self.clock()
                self.deadlines.cancel(("queue", event.claim.id))
                self._arm_until(self.ledger.claims[event.claim.id])
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
        for listener in self._listeners:
            listener(events)
        if any(isinstance(e, ClaimReleased) for e in events):
            self._serve_queue()  # what was freed may serve a waiter for GPUs

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

    async def _off_loop(self, fn, *args):
        """Run a blocking call in a thread; give up waiting after ``probe_timeout``."""
        return await off_loop(fn, *args, timeout=self.settings.probe_timeout)

    async def _user_name(self, uid: int) -> str:
        """``user_name`` off the loop (the user database may be a network's), kept once
        found."""
        if uid not in self._user_names:
            try:
                name = await self._off_loop(user_name, uid)
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
        raise InvalidRequest(f"{role} pid {pid} is out of range: pids run from 1 to {highest}")
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
        raise InvalidRequest(f"{role} process {given} does not exist")
    if caller.uid != 0 and process_uid(pid) != caller.uid:
        os.close(pinned[1])
        raise NotProcessOwner(f"process {given} does not belong to uid {caller.uid}")
    return pinned


def _started_for(pid: int, person: int, claim_uids: dict[str, int]) -> str:
    """The live claim a process in a container was started for: its environment names it
    (RESOURCED_ALLOCATION), and it runs as the claim's user or as root (a rootful container
    engine runs it so); "" otherwise, or where this account may not read it."""
    named = claim_named_by(pid)
    return named if named in claim_uids and person in (claim_uids[named], 0) else ""


def _uids_of(pids: list[int], claim_uids: dict[str, int]) -> dict[int, int | None]:
    """Each pid's user, None where /proc does not show it (gone, or another pid namespace):
    its uid; for a rootless container's process the user whose subuid range holds it; for
    a container's process started for a claim, the claim's user (blocking)."""
    subuids = subuid_ranges()
    found = {}
    for pid in pids:
        uid = process_uid(pid)
        if uid is not None:
            uid = owner_of(uid, subuids)
            if nested(pid) and (claim := _started_for(pid, uid, claim_uids)):
                uid = claim_uids[claim]
        found[pid] = uid
    return found


def _use_of(claim: Claim, evidence: GpuEvidence, uids: dict[int, int | None]
            ) -> tuple[str, str]:
    """What the evidence says of a claim's GPUs: whether its owner's processes use them,
    and whether any process does.  A GPU the driver does not list is UNKNOWN for both; a
    process nobody can be named for (another pid namespace) for the owner's."""
    owner = anyone = UNUSED
    for uuid in claim.gpus:
        listed = evidence.processes.get(uuid)
        if listed is None:
            return UNKNOWN, UNKNOWN
        for p in listed:
            anyone = USED
            uid = uids.get(p.pid)
            if uid == claim.uid:
                owner = USED
            elif uid is None and owner == UNUSED:
                owner = UNKNOWN
    return owner, anyone


def _table_and_steps():
    """The process table, and the Slurm jobs' step daemons in it (blocking)."""
    table = read_table()
    return table, job_steps(table)


def _ancestries(pids: list[int]) -> dict:
    """Each pid's ancestry, itself first (blocking: reads /proc)."""
    return {pid: ancestry(pid) for pid in pids}


def _observe(pids: list[int], claim_uids: dict[str, int]):
    """Each pid's ancestry, and its (uid, user, command, container, the claim it was
    started for) (blocking).  A rootless container's process is its user's (subuid); one
    in a container was started for a live claim of that user when its environment names
    it."""
    chains = _ancestries(pids)
    subuids = subuid_ranges()
    details = {}
    for pid, chain in chains.items():
        uid = chain[0].uid if chain else -1
        person = owner_of(uid, subuids) if uid >= 0 else uid
        container = started_for = ""
        if chain and chain[0].nested_namespace:
            container = container_of(pid) or "a pid namespace of its own"
            started_for = _started_for(pid, person, claim_uids)
        name = user_name(person) if person >= 0 else ""
        details[pid] = (uid, name, command_line(pid), container, started_for)
    return chains, details
