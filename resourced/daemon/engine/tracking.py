"""What runs on the GPUs and which processes are still there: evidence at claim and
release, the tracking sweep that adopts a claim's descendants, pidfd watches, no-shows
and idle claims, ``verify``."""

import asyncio
import contextlib
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from resourced.core.attribution import attribute, children_of, claim_processes, descendants
from resourced.core.claims import (
    BOOKING,
    SLURM,
    Claim,
    ProcessRef,
)
from resourced.core.inventory import Gpu
from resourced.core.lifecycle import (
    ACTIVE,
    DEAD_OWNER,
    GRANTED,
    IDLE,
)
from resourced.core.usewatch import UNKNOWN, UNUSED, USED, UseWatch
from resourced.core.verify import GpuReport, SeenProcess, verify
from resourced.evidence.gpuprobe import GpuEvidence
from resourced.evidence.liveness import ExitWatcher
from resourced.evidence.pidns import (
    claim_named_by,
    container_of,
    nested,
)
from resourced.evidence.processes import process_uid
from resourced.evidence.proctable import ancestry, command_line, read_table
from resourced.evidence.subids import owner_of
from resourced.evidence.subids import ranges as subuid_ranges
from resourced.linux.sd import audit
from resourced.linux.users import user_name
from resourced.protocol.time import usec_of_seconds

from .slurm_jobs import job_steps

log = logging.getLogger("resourced")

TRACK_INTERVAL = 1.0
"""Seconds between tracking sweeps while claims exist (and, on a simulated clock, one
each time the clock moves)."""
IDLE_LOOK_INTERVAL = 5.0
"""Seconds at most between two looks at what runs on the GPUs, claims or none: a free GPU
that runs processes nobody claimed is shown busy within this time."""


@dataclass(frozen=True)
class GpuUseChanged:
    """Free GPUs that began or ceased to run processes nobody claimed (``busy``)."""

    gpus: frozenset[str]


class Tracker:
    """Evidence and liveness for the engine's claims."""

    def __init__(self, engine):
        self.engine = engine
        self._busy_free: set[str] = set()  # free GPUs last found running strangers' processes
        self.watcher: ExitWatcher | None = None
        self._sweep: asyncio.Task | None = None
        self._clock_moved = asyncio.Event()  # a simulated clock moved: sweep now
        self._unwatched: set[tuple[str, ProcessRef]] = set()  # to watch again at the next sweep
        self.uses = UseWatch()  # no-show bookings and idle claims
        self.used_usec: dict[str, int] = {}  # claim id -> time its owner was seen using it
        self.granted_at: dict[str, int] = {}  # claim id -> when it was granted (this run)
        self._looked = 0  # when _observe_use last looked

    def start_watching(self) -> None:
        self.watcher = ExitWatcher(asyncio.get_running_loop(), self._process_exited)

    def start_sweeping(self) -> None:
        self._sweep = asyncio.ensure_future(self._track())

    def clock_moved(self) -> None:
        """A simulated clock moved: the next sweep runs now, on the new time, not at the
        end of the interval (a clock that jumps an hour is looked at in that hour)."""
        self._clock_moved.set()

    def close(self) -> None:
        if self._sweep:
            self._sweep.cancel()
        if self.watcher:
            self.watcher.close()

    async def verify(self) -> list[GpuReport]:
        """Compare the claims with the compute processes the driver reports on each GPU."""
        evidence = await self.engine.probe.processes()
        self.saw(evidence)
        if any(c.job for c in self.engine.ledger.claims.values()):  # a step may have begun since
            self.adopt(*await self.engine.off_loop(_table_and_steps))  # the last sweep
        seen = None
        if evidence.known:
            details, who = await self.attributed(evidence.processes)
            seen = {uuid: [SeenProcess(p.pid, p.used_memory_bytes, *details[p.pid][:3],
                                       who[uuid, p.pid].claim_id, who[uuid, p.pid].ambiguous,
                                       details[p.pid][3]) for p in procs]
                    for uuid, procs in evidence.processes.items()}
        missing = [(e.uuid, e.alias or "", e.index if e.index is not None else -1)
                   for e in self.engine.missing]
        return verify(self.engine.ledger, seen, evidence.reason, missing)

    def gpu_state(self, gpu: Gpu) -> str:
        """free, claimed (held whole), shared (VRAM shares on it), busy (nobody claimed
        it, but processes run on it: the latest look) or slurm (free, but Slurm's to
        schedule)."""
        if self.engine.ledger.holder(gpu.uuid):
            return "claimed"
        if self.engine.ledger.vram_used(gpu.uuid):
            return "shared"
        if gpu.uuid in self.engine.ledger.slurm:
            return "slurm"
        return "busy" if gpu.uuid in self._busy_free else "free"

    def free_count(self) -> int:
        """Free GPUs: nobody holds or shares them, and no process ran on them at the
        latest look."""
        return sum(1 for g in self.engine.ledger.free_gpus() if g.uuid not in self._busy_free)

    def busy_gpus(self, evidence: GpuEvidence) -> tuple[frozenset[str], list[str]]:
        """GPUs that must not be granted (a process runs there, or the driver does not
        report them), and warnings when the driver could not be asked.

        Every GPU counts, not only those free now: one freed while the evidence was
        awaited was not looked at for that decision, so it is not taken for idle."""
        if not evidence.known:
            log.warning("claim check skipped: %s", evidence.reason)
            return frozenset(), [f"granted without checking the GPUs: {evidence.reason}"]
        self.saw(evidence)
        gpus = self.engine.ledger.gpus
        return frozenset(u for u in gpus if evidence.processes.get(u, None) != []), []

    def saw(self, evidence: GpuEvidence) -> None:
        """What a look found, kept for what the daemon shows and admits between looks:
        the free GPUs running processes nobody claimed (``busy``: not counted free, not
        granted), and the VRAM held on each GPU by processes no claim on it owns (not
        free to a share).  A change is published as ``GpuUseChanged``."""
        if not evidence.known:
            return
        busy_free = {g.uuid for g in self.engine.ledger.free_gpus()
                     if evidence.processes.get(g.uuid, None) != []}
        foreign = {}
        for uuid, procs in evidence.processes.items():
            if not procs or uuid not in self.engine.ledger.gpus:  # (the common case: nothing runs)
                continue
            own = {ref.pid for c in self.engine.ledger.claims_on(uuid) for ref in c.processes()}
            if held := sum(p.used_memory_bytes for p in procs if p.pid not in own):
                foreign[uuid] = held
        self.engine.ledger.foreign_vram = foreign
        changed, self._busy_free = busy_free ^ self._busy_free, busy_free
        news = sorted(changed & busy_free, key=lambda u: self.engine.ledger.gpus[u].index)
        for uuid in news:  # each said once, when first found
            procs = evidence.processes.get(uuid)
            what = ("not reported by the driver" if procs is None else
                    "pids " + ", ".join(str(p.pid) for p in procs))
            log.warning("%s is unclaimed but busy (%s); not granting it",
                        self.engine.ledger.gpus[uuid].label, what)
        if changed:
            self.engine.publish([GpuUseChanged(frozenset(changed))])

    async def processes_on_gpus_of(self, claim: Claim, evidence: GpuEvidence) -> list[int]:
        """The pids on the claim's GPUs that are the claim's own (empty if unknown)."""
        if not evidence.known:
            return []
        on = {u: evidence.processes.get(u, []) for u in claim.gpus}
        if not any(on.values()):
            return []  # the common case: nothing to attribute, no /proc to read
        _, who = await self.attributed(on)
        return sorted({pid for (_, pid), found in who.items() if found.claim_id == claim.id})

    async def attributed(self, processes: Mapping[str, Sequence]) -> tuple[dict, dict]:
        """The processes the driver reports on GPUs (uuid -> them), each attributed as
        ``verify`` and a release's check both see it (``attribute``, with the GPU's
        holders): (details by pid, {(uuid, pid): Attribution})."""
        claims = self.engine.ledger.claims.values()
        pids = sorted({p.pid for procs in processes.values() for p in procs})
        chains, details = await self.engine.off_loop(_observe, pids,
                                                     {c.id: c.uid for c in claims})
        owned = claim_processes(claims)
        who = {}
        for uuid, procs in processes.items():
            holders = {c.id for c in self.engine.ledger.claims_on(uuid)}
            for p in procs:
                who[uuid, p.pid] = attribute(chains[p.pid], owned, details[p.pid][4], holders)
        return details, who

    async def _track(self) -> None:
        """While claims exist, adopt descendants, release claims of long-dead owners and
        look at what runs on their GPUs; at least every ``IDLE_LOOK_INTERVAL``, look at
        what runs on the free ones (``_saw``)."""
        unlooked = IDLE_LOOK_INTERVAL  # (the first sweep looks)
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._clock_moved.wait(), TRACK_INTERVAL)
            self._clock_moved.clear()
            unlooked += TRACK_INTERVAL
            try:
                if self.engine.ledger.claims:
                    self.engine.serve_queue()  # a GPU found busy before may be idle now
                    self.watch_again()
                    self.adopt(*await self.engine.off_loop(_table_and_steps))
                    self.engine.jobs.end_unstarted()
                    await self._release_dead_owners()
                    if await self._observe_use():
                        unlooked = 0.0
                if unlooked >= IDLE_LOOK_INTERVAL:
                    unlooked = 0.0
                    self.saw(await self.engine.probe.processes())
            except Exception:
                log.exception("tracking sweep failed")

    def adopt(self, table, steps: dict[str, set[ProcessRef]]) -> None:
        """Descendants of each claim's processes become its members, and so do a Slurm
        job's step daemons (``steps``: job id -> them) with theirs."""
        children = children_of(table)
        for claim in list(self.engine.ledger.claims.values()):
            stepds = steps.get(claim.job, set()) if claim.job else set()
            found = descendants(table, claim.processes() | stepds, children) | stepds
            new = found - claim.members - {claim.owner}
            if new:
                self.engine.commit(self.engine.ledger.add_members(claim.id, new))
                for ref in new:
                    self._watch(claim.id, ref)

    async def _release_dead_owners(self) -> None:
        grace_usec = usec_of_seconds(self.engine.settings.dead_owner_grace)
        due = self.engine.ledger.dead_owner_claims(self.engine.clock(), grace_usec)
        if not due:
            return
        evidence = await self.engine.probe.processes()
        if not evidence.known:
            return  # no trustworthy evidence: keep the claims
        claims, grace = self.engine.ledger.claims, self.engine.settings.dead_owner_grace
        for claim in due:
            if claim.id not in claims or await self.processes_on_gpus_of(claim, evidence):
                continue
            if claim.id in claims:  # still there after the await
                self.engine.end(claim.id, DEAD_OWNER, None,
                                f"owner {claim.owner.pid} dead for {grace:g} s")

    async def _observe_use(self) -> bool:
        """One look at what runs on the GPUs (True; False: no claim holds a GPU, and it
        did not look): it counts the time each claim's owner used them (usage history)
        and releases active bookings their owner never used (``no_show_after``) and,
        where configured, claims with no process on their GPUs (``idle_after``), on
        trustworthy evidence only (core.usewatch).  Nothing is killed."""
        now = self.engine.clock()
        claims = {c.id: c for c in self.engine.ledger.claims.values()
                  if c.state == GRANTED and c.gpus}
        settings, windows = self.engine.settings, {}
        for c in claims.values():
            after = settings.no_show_after if c.mode == BOOKING else settings.idle_after
            if after and c.mode != SLURM:  # a job's GPUs are Slurm's to take back
                windows[c.id] = (usec_of_seconds(after), c.mode == BOOKING)
        elapsed, self._looked = now - (self._looked or now), now
        if not claims:
            self.uses.observe({}, now, {})
            return False
        evidence = await self.engine.probe.processes()
        self.saw(evidence)
        claims = {i: c for i, c in claims.items() if i in self.engine.ledger.claims}
        owners, anyone = {i: UNKNOWN for i in claims}, {i: UNKNOWN for i in claims}
        if evidence.known:
            listed = {p.pid for c in claims.values() for u in c.gpus
                      for p in evidence.processes.get(u) or ()}
            owners_of = {i: c.uid for i, c in claims.items()}
            uids = await self.engine.off_loop(_uids_of, sorted(listed), owners_of) if listed else {}
            for i, c in claims.items():
                owners[i], anyone[i] = _use_of(c, evidence, uids)
        for i, c in claims.items():
            if owners[i] == USED:
                held = now - self.granted_at.get(i, c.created_usec)
                self.used_usec[i] = self.used_usec.get(i, 0) + min(elapsed, held)
        seen = {i: owners[i] if claims[i].mode == BOOKING else anyone[i]
                for i in windows if i in claims}
        for claim_id in self.uses.observe(seen, self.engine.clock(), windows):
            if claim_id not in self.engine.ledger.claims:
                continue
            if self.engine.ledger.claims[claim_id].mode == BOOKING:
                self._no_show(claim_id)
            else:
                self.engine.end(claim_id, IDLE, None,
                                f"no process on its GPUs for {self.engine.settings.idle_after:g} s")
        return True

    def _no_show(self, booking_id: str) -> None:
        booking = self.engine.calendar.bookings.get(booking_id)
        if booking is None or booking.state != ACTIVE:
            return
        reason = (f"no process of {booking.user or booking.uid} used its GPUs in its first "
                  f"{self.engine.settings.no_show_after:g} s")
        _, events = self.engine.calendar.no_show(booking_id, self.engine.clock(), reason)
        audit(f"booking {booking_id} of {booking.user or booking.uid} released as a no-show: "
              f"{reason}", priority=5, uid=booking.uid, event="no-show", reason=reason)
        self.engine.bookings.changed(events, [(booking_id, booking)])

    def watch_claim(self, claim: Claim) -> None:
        if claim.owner_alive:
            self._watch(claim.id, claim.owner)
        for ref in claim.members:
            self._watch(claim.id, ref)

    def _watch(self, claim_id: str, ref: ProcessRef) -> None:
        """Watch a process of a claim; one that cannot be watched now (no descriptor left)
        is kept as alive and tried again at the next sweep, never taken for dead."""
        key = (claim_id, ref)
        try:
            watched = self.watcher.watch(key, ref)
        except OSError as exc:
            if key not in self._unwatched:
                log.error("cannot watch pid %d of %s (%s); trying again", ref.pid, claim_id, exc)
            self._unwatched.add(key)
            return
        self._unwatched.discard(key)
        if not watched:
            self._process_exited(key)

    def watch_again(self) -> None:
        for claim_id, ref in list(self._unwatched):
            self._unwatched.discard((claim_id, ref))
            if claim_id in self.engine.ledger.claims:
                self._watch(claim_id, ref)

    def _process_exited(self, key: tuple[str, ProcessRef]) -> None:
        claim_id, ref = key
        claim = self.engine.ledger.claims.get(claim_id)
        if claim is None:
            return
        if ref == claim.owner:
            self.engine.commit(self.engine.ledger.owner_died(claim_id, self.engine.clock(),
                                                             busy=None))
        else:
            self.engine.commit(self.engine.ledger.member_exited(claim_id, ref, busy=None))

    def forget(self, claim: Claim) -> None:
        for ref in claim.members | {claim.owner}:
            self.watcher.forget((claim.id, ref))
        for kind in ("queue", "until", "warn"):
            self.engine.alarms.deadlines.cancel((kind, claim.id))


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
