"""The ledger: every claim, queued or granted, and the only place that grants and releases.

Theory of operation.  The ledger is a plain in-memory structure that the daemon consults
synchronously between two awaits, so a decision (read state, place the demand, record
the claim) is atomic by construction and no two callers can win the same GPU.  Evidence
about the GPUs (free ones running processes nobody claimed: ``busy``) is gathered
*before* a decision and handed in; the ledger never waits for anything.

What is held: whole GPUs (exclusive: one holder, no shares), VRAM shares (several claims
on one GPU, their bytes within its memory, never also held whole), and pool amounts
(within each pool's capacity).  ``check_invariants`` states exactly this.

The queue.  Claims that wait are served strictly by priority (higher first), then
arrival (FIFO).  ``_schedule`` walks the queue in that order over a *view* of what is
free: a claim that fits is granted and its amounts leave the view; a claim that does not
fit *reserves* what it could use (up to its demand) before the walk goes on.  So a later
claim can start ahead of an earlier one only with what no earlier claim could use: it
cannot delay it, and a stream of small claims cannot starve a large one.  A request that
does not wait is placed in the queue at its rank for one walk: it never takes what a
waiter ahead of it could use.  Every release walks the queue at once.

Reclaim.  When a waiter cannot be served, the walk looks for reclaimable claims of
strictly lower priority (lowest first, newest first among equals) whose amounts would
let it fit, takes as few as suffice, and asks exactly those back (``ReclaimAsked``).
What they free is reserved for that waiter by the same walk; if the waiter is served
otherwise or goes away, the requests are withdrawn.

Time.  Every granted claim is also a hold on the ``timeline`` the calendar books on, from
its creation to its ``until_usec``: its own end, or the start of the next booking that
needs what it holds (the claim is granted until then, and asked back at that time:
``overdue``), or no end at all.  So a booking is never admitted over what a claim holds
and a claim never keeps what a booking starts on: one rule, nothing held twice at any
instant.  A free GPU with no booking ahead is placed before one booked later.  A booking
at its start becomes a claim in mode ``booking`` on exactly its GPUs (``on``), at a
priority above every caller's; its hold is the booking's own.

Every mutation returns the events it caused; the caller persists, then publishes them.
"""

import operator
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, fields

from resourced.errors import (
    InvalidArgs,
    NoSuchClaim,
    NotEnoughGPUs,
    ResourcedError,
    quoted,
)

from .claims import BOOKING, BOOKING_PRIORITY, SLURM, Claim, ClaimRequest, Demand, ProcessRef
from .inventory import Gpu
from .lifecycle import CLAIM, ENDED, GRANTED, JOB_ENDED, OWNER_EXITED, QUEUED, RELEASED
from .pools import Pool, format_amount
from .queue import WaitQueue, count, counted, rank
from .refusals import never_fits, short_now
from .timeline import Hold, Timeline
from .view import View

NO_MEMBERS: frozenset = frozenset()
"""The members of most claims: one empty set for all (each made its own, 200 bytes)."""


@dataclass(frozen=True)
class _ClaimEvent:
    """Something that happened to a claim.  ``claim`` is a copy taken when it happened:
    the ledger goes on changing its own claims, never what an event says (history, the
    store and the bus read events after the fact)."""

    claim: Claim

    def __post_init__(self):
        object.__setattr__(self, "claim", _copy(self.claim))


_CLAIM_FIELDS = operator.attrgetter(*(f.name for f in fields(Claim)))


def _copy(claim: Claim) -> Claim:
    """A shallow copy, as ``copy.copy`` makes it, at a fifth of its cost (two per claim
    and release)."""
    return Claim(*_CLAIM_FIELDS(claim))


@dataclass(frozen=True)
class ClaimQueued(_ClaimEvent):
    pass


@dataclass(frozen=True)
class ClaimGranted(_ClaimEvent):
    pass


@dataclass(frozen=True)
class ClaimReleased(_ClaimEvent):
    reason: str  # released | forced | owner-exited | dead-owner | cancelled | timeout


@dataclass(frozen=True)
class OwnerDied(_ClaimEvent):
    pass


@dataclass(frozen=True)
class MembersChanged(_ClaimEvent):
    pass


@dataclass(frozen=True)
class ReclaimAsked(_ClaimEvent):
    waiter: Claim

    def __post_init__(self):
        super().__post_init__()
        object.__setattr__(self, "waiter", _copy(self.waiter))


@dataclass(frozen=True)
class ReclaimWithdrawn(_ClaimEvent):
    pass


@dataclass(frozen=True)
class UntilChanged(_ClaimEvent):
    """A granted claim may now keep what it holds until another time (a booking after it
    moved, or its own booking's end did)."""


@dataclass(frozen=True)
class Relabelled(_ClaimEvent):
    """A claim's label changed (a Slurm job's, once its prolog learnt the job's name)."""


@dataclass(frozen=True)
class ClaimEnding(_ClaimEvent):
    """A granted claim must give back soon (at ``claim.until_usec``): a warning."""


@dataclass(frozen=True)
class StopAsked(_ClaimEvent):
    """``gpuctl stop`` ends the claim's session: the claim is told (its command gets the
    reclaim signal) just before it is released."""

    by: int
    reason: str


Event = (ClaimQueued | ClaimGranted | ClaimReleased | OwnerDied | MembersChanged
         | ReclaimAsked | ReclaimWithdrawn | UntilChanged | ClaimEnding | StopAsked
         | Relabelled)


class Ledger:
    """Claims over a fixed inventory of GPUs and pools.

    ``slurm`` are the GPUs Slurm schedules: only claims in mode ``slurm`` (a job's, made
    by its prolog) hold them; they are neither free to other claims nor on the timeline
    the calendar books on."""

    def __init__(self, gpus: Iterable[Gpu], pools: Iterable[Pool] = (),
                 slurm: frozenset[str] = frozenset()):
        self.gpus: dict[str, Gpu] = {g.uuid: g for g in sorted(gpus, key=lambda g: g.index)}
        self.slurm = slurm & set(self.gpus)
        self.pools: dict[str, Pool] = {p.name: p for p in pools}
        self._memory = {u: g.memory_bytes for u, g in self.gpus.items()}  # (views share it)
        self.claims: dict[str, Claim] = {}
        self._holder: dict[str, str] = {}              # GPU uuid -> claim holding it whole
        self._shares: dict[str, dict[str, int]] = {}   # GPU uuid -> claim id -> VRAM bytes
        self._used: dict[str, int] = {name: 0 for name in self.pools}
        self._no_wait: set[str] = set()                # queued for one walk only
        self.waiting = WaitQueue()
        # uid, and (uid, session) -> its claims (any state), waiting claims, GPUs (whole,
        # or one per share; granted or waited for): what the limits count
        self._claims_of: Counter = Counter()
        self._gpus_of: Counter = Counter()
        self._reclaimable: set[str] = set()            # granted claims that may be asked back
        self._asked: set[str] = set()                  # claims asked back now (reclaim_for)
        self._bounded: set[str] = set()                # granted until a booking's start
        self._seq = 0
        self.foreign_vram: dict[str, int] = {}
        """GPU uuid -> VRAM that processes no claim on it owns held at the engine's latest
        look: not free to a share (the engine sets it from the evidence)."""
        self.timeline = Timeline({u: g.memory_bytes for u, g in self.gpus.items()
                                  if u not in self.slurm},
                                 {p.name: p.capacity for p in self.pools.values()})

    # -- queries ---------------------------------------------------------------------
    def holder(self, uuid: str) -> Claim | None:
        """The claim holding a GPU whole."""
        claim_id = self._holder.get(uuid)
        return self.claims[claim_id] if claim_id else None

    def claims_on(self, uuid: str) -> list[Claim]:
        """Every granted claim using a GPU: its holder, or the claims sharing it."""
        if uuid in self._holder:
            return [self.claims[self._holder[uuid]]]
        return [self.claims[c] for c in self._shares.get(uuid, {})]

    def free_gpus(self) -> list[Gpu]:
        """GPUs nobody holds or shares (Slurm's are never free to our claims)."""
        return [g for u, g in self.gpus.items()
                if u not in self._holder and not self._shares.get(u) and u not in self.slurm]

    def vram_used(self, uuid: str) -> int:
        return sum(self._shares.get(uuid, {}).values())

    def pool_free(self, name: str) -> int:
        return self.pools[name].capacity - self._used[name]

    def counts_of(self, uid: int, session: str | None = None) -> tuple[int, int, int]:
        """(claims, waiting claims, GPUs) of one user, or of one of its sessions."""
        key = uid if session is None else (uid, session)
        return self._claims_of[key], self.waiting.of[key], self._gpus_of[key]

    def describe(self, d: Demand) -> str:
        """``2 GPU(s), ram 32G, cpu 8`` for logs and messages."""
        parts = [f"{d.gpus} GPU(s)"] if d.gpus else []
        if d.vram:
            parts.append(f"VRAM {format_amount(d.vram, 'bytes')}")
        for name, amount in d.pools:
            unit = self.pools[name].unit if name in self.pools else "count"
            parts.append(f"{name} {format_amount(amount, unit)}")
        return ", ".join(parts)

    def get(self, claim_id: str) -> Claim:
        try:
            return self.claims[claim_id]
        except KeyError:
            raise NoSuchClaim(f"no claim {quoted(claim_id)} (unknown or already released)") from None

    def gpu_by_name(self, name: str) -> Gpu:
        """A GPU by alias, ``gpuN``, index or UUID."""
        for g in self.gpus.values():
            if name in (g.uuid, g.label, str(g.index)):
                return g
        there = ", ".join(g.label for g in sorted(self.gpus.values(), key=lambda g: g.index))
        raise InvalidArgs(f"no GPU called {quoted(name)}: "
                          + (f"the GPUs here are {there}" if there else "there are no GPUs here"))

    # -- decisions -------------------------------------------------------------------
    def submit(self, request: ClaimRequest, claim_id: str, now_usec: int,
               busy: frozenset[str] = frozenset(), wait: bool = False
               ) -> tuple[list[Event], ResourcedError | None]:
        """Grant ``request`` now, or queue it (``wait``), or refuse it.

        Returns the events (the walk may also serve others) and, for a request that does
        not wait and was not granted, the error saying what is short.  A request that could
        never be granted (an unknown pool, more than a capacity) raises at once, waiting
        or not, and changes nothing.
        """
        if claim_id in self.claims:
            raise InvalidArgs(f"claim id {claim_id!r} is taken")
        never_fits(self, request.demand, request.on)
        self._seq += 1
        claim = Claim(
            id=claim_id, mode=request.mode, demand=request.demand, owner=request.owner,
            uid=request.uid, user=request.user, label=request.label,
            task_name=request.task_name, created_usec=now_usec, priority=request.priority,
            reclaimable=request.reclaimable, state=QUEUED, seq=self._seq,
            members=request.members - {request.owner} or NO_MEMBERS,
            queue_deadline_usec=request.queue_deadline_usec if wait else 0,
            end_usec=request.end_usec, session=request.session,
            reply_to=request.reply_to if wait else "",
            reply_serial=request.reply_serial if wait else 0,
            isolated=request.isolated, on=request.on,
        )
        if not wait and not self.waiting and busy is not None:
            # Nobody waits: the walk would visit this claim alone and grant it where it
            # fits, so that is done here, without queueing it for the walk (a third of
            # the cost of an uncontended claim).  What does not fit takes the walk.
            placed = self.view(busy, gpus=claim.demand.wants_gpu).place(claim.demand, claim.on)
            if placed is not None:
                claim.state = CLAIM.move(claim.state, GRANTED)
                self._add(claim)
                self._hold(claim, *placed)
                return [ClaimGranted(claim), *self._ask_back({})], None
        self._add(claim)
        if not wait:
            self._no_wait.add(claim_id)
        events = self._schedule(busy)
        if claim.state == GRANTED:
            return events, None
        if wait:
            return [ClaimQueued(claim), *events], None
        refusal = short_now(self, claim, busy)
        self._remove(claim)
        self._no_wait.discard(claim_id)
        return events, refusal

    def start_booking(self, booking_id: str, demand: Demand, on: tuple[str, ...], uid: int,
                      user: str, label: str, task_name: str, now_usec: int, end_usec: int,
                      busy: frozenset[str] | None = frozenset(), session: str = "",
                      isolated: bool = False) -> list[Event]:
        """A booking starts: its claim (same id, mode ``booking``, no process) waits at the
        head of the queue for exactly its GPUs and is granted at once when they are free,
        as the calendar made sure; if a claim overstays, it is asked back."""
        if booking_id in self.claims:
            raise InvalidArgs(f"claim id {booking_id!r} is taken")
        self._seq += 1
        claim = Claim(id=booking_id, mode=BOOKING, demand=demand, owner=ProcessRef(0, 0),
                      uid=uid, user=user, label=label, task_name=task_name,
                      created_usec=now_usec, priority=BOOKING_PRIORITY, state=QUEUED,
                      seq=self._seq, owner_alive=False, end_usec=end_usec, on=on,
                      until_usec=end_usec, session=session, isolated=isolated)
        self._add(claim)
        return [ClaimQueued(claim), *self._schedule(busy)]

    def start_job(self, claim_id: str, job: str, gpus: tuple[str, ...], uid: int, user: str,
                  label: str, now_usec: int) -> list[Event]:
        """A Slurm job's GPUs on this node (UUIDs) become a claim in mode ``slurm``,
        granted at once: Slurm has already given them, so there is no queue, no limit and
        no evidence to look at.  Refused only if one of our claims holds one of them (the
        GPU is not Slurm's by the config, and both handed it out)."""
        if claim_id in self.claims:
            raise InvalidArgs(f"claim id {claim_id!r} is taken")
        held = sorted({c.id for u in gpus for c in self.claims_on(u)})
        if held:
            names = ", ".join(self.gpus[u].label for u in gpus)
            raise NotEnoughGPUs(f"Slurm job {job} was given {names}, but claim(s) "
                                f"{', '.join(held)} hold some of them; list Slurm's GPUs in "
                                "[slurm] gpus so that they never race")
        self._seq += 1
        claim = Claim(id=claim_id, mode=SLURM, demand=Demand(len(gpus)), owner=ProcessRef(0, 0),
                      uid=uid, user=user, label=label, task_name="", created_usec=now_usec,
                      seq=self._seq, owner_alive=False, on=gpus, job=job)
        self._add(claim)
        self._hold(claim, gpus, "")
        return [ClaimGranted(claim)]

    def release(self, claim_id: str, reason: str = RELEASED,
                busy: frozenset[str] | None = frozenset()) -> list[Event]:
        """End a claim (a queued one is cancelled) and serve the queue with what it frees.

        ``busy=None`` (here and in the other changes) says the evidence about the GPUs is
        not fresh: the queue is walked only if nobody in it waits for a GPU; else call
        ``schedule`` once fresh evidence is at hand (``waiting_for_gpus``)."""
        claim = self.get(claim_id)
        CLAIM.move(claim.state, ENDED)
        reason = CLAIM.end(reason)
        held = claim.state == GRANTED
        self._free(claim)
        self._remove(claim)
        events: list[Event] = [ClaimReleased(claim, reason)]
        if held and self._bounded:
            events += self.refresh_until()  # what it held may be what made them end early
        return events + self._schedule(busy)

    def owner_died(self, claim_id: str, now_usec: int = 0,
                   busy: frozenset[str] | None = frozenset()) -> list[Event]:
        """The owner is gone.  A queued claim is cancelled; a run claim ends once its
        members are gone too; a dev claim stays, marked dead."""
        claim = self.claims.get(claim_id)
        if claim is None or not claim.owner_alive:
            return []
        if claim.state == QUEUED or (claim.mode == "run" and not claim.members):
            return self.release(claim_id, OWNER_EXITED, busy)
        claim.owner_alive = False
        claim.owner_died_usec = now_usec
        return [OwnerDied(claim)]

    def relabel(self, claim_id: str, label: str) -> list[Event]:
        """Give a claim another label."""
        claim = self.claims.get(claim_id)
        if claim is None or claim.label == label:
            return []
        claim.label = label
        return [Relabelled(claim)]

    def add_members(self, claim_id: str, refs: Iterable[ProcessRef]) -> list[Event]:
        """Processes found to descend from the claim's processes become its members."""
        claim = self.claims.get(claim_id)
        if claim is None:
            return []
        new = frozenset(refs) - claim.members - {claim.owner}
        if not new:
            return []
        claim.members = claim.members | new
        return [MembersChanged(claim)]

    def member_exited(self, claim_id: str, ref: ProcessRef,
                      busy: frozenset[str] | None = frozenset()) -> list[Event]:
        """A member is gone; a run claim whose owner and members are all gone ends, and so
        does a Slurm job's claim when the last of its processes is."""
        claim = self.claims.get(claim_id)
        if claim is None or ref not in claim.members:
            return []
        claim.members = claim.members - {ref}
        if claim.mode in ("run", SLURM) and not claim.owner_alive and not claim.members:
            return self.release(claim_id, JOB_ENDED if claim.mode == SLURM else OWNER_EXITED,
                                busy)
        return [MembersChanged(claim)]

    def dead_owner_claims(self, now_usec: int, grace_usec: int) -> list[Claim]:
        """Dev claims whose owner died at least ``grace_usec`` ago (none when grace is 0)."""
        if grace_usec <= 0:
            return []
        return [
            c for c in self.claims.values()
            if c.mode == "dev" and c.state == GRANTED and not c.owner_alive
            and now_usec - c.owner_died_usec >= grace_usec
        ]

    def schedule(self, busy: frozenset[str] | None = frozenset()) -> list[Event]:
        """Serve the queue with what is free now (after the evidence changed, say)."""
        return self._schedule(busy)

    def overdue(self, claim_id: str, busy: frozenset[str] | None = frozenset()) -> list[Event]:
        """A claim is past the time it was granted until (a booking needs what it holds):
        from now on it may be asked back, like a reclaimable claim, by the booking's claim
        waiting for it (or any waiter of higher priority)."""
        claim = self.claims.get(claim_id)
        if claim is None or claim.state != GRANTED or claim.overdue:
            return []
        claim.overdue = True
        self._reclaimable.add(claim.id)
        return self._schedule(busy)

    def refresh_until(self) -> list[Event]:
        """After bookings moved or went away, or a claim beside them was released: the
        claims granted until a booking's start may keep what they hold until the next
        booking that needs it now (or for good).  A booking may need what a claim holds
        only together with others, so every such claim is looked at again (they are few:
        those granted on what is booked later)."""
        events: list[Event] = []
        for claim in sorted((self.claims[c] for c in self._bounded), key=lambda c: c.seq):
            self.timeline.remove(claim.id)
            before = (claim.until_usec, claim.until_booking)
            self._hold_over_time(claim)
            if (claim.until_usec, claim.until_booking) == before:
                continue  # that booking still starts then on what it holds
            if claim.overdue:  # the booking it had to make room for moved or went away
                claim.overdue = False
                if not claim.reclaimable:
                    self._reclaimable.discard(claim.id)
            events.append(UntilChanged(claim))
        return events

    def set_end(self, claim_id: str, end_usec: int) -> list[Event]:
        """A booking's claim: its booking now ends at another time."""
        claim = self.get(claim_id)
        claim.end_usec = claim.until_usec = end_usec
        return [UntilChanged(claim)]

    def restore(self, claims: Iterable[Claim]) -> list[tuple[Claim, str]]:
        """Take back claims from before a restart; returns those refused, with the reason."""
        refused = []
        for claim in sorted(claims, key=lambda c: c.seq):
            why = self._restore_problem(claim)
            if why:
                refused.append((claim, why))
                continue
            self._add(claim)
            if claim.state == GRANTED:
                self._hold(claim, claim.gpus if not claim.shared else (), claim.gpus[0] if claim.shared else "")
            self._seq = max(self._seq, claim.seq)
        waiting = {c.id for c in self.claims.values() if c.state == QUEUED}
        for claim in self.claims.values():  # asks for a waiter that did not come back
            if claim.reclaim_for not in waiting:
                claim.reclaim_for = ""
            if claim.reclaim_for:
                self._asked.add(claim.id)
        return refused

    # -- the walk --------------------------------------------------------------------
    def view(self, busy: frozenset[str], gpus: bool = True) -> View:
        """What is free now; without ``gpus``, the pools alone (no GPU free): for a walk
        in which no one wants a GPU, which then reads none of them."""
        if not gpus:
            return View([], {}, {name: self.pool_free(name) for name in self.pools},
                        self._memory)
        free = [g.uuid for g in self.free_gpus()]
        usable = [u for u in free if u not in busy]
        booked_from = ({u: self._booked_from(u) for u in self.timeline.memory}
                       if self.timeline.holds else {})
        if booked_from:
            usable.sort(key=lambda u: booked_from.get(u, 0), reverse=True)  # unbooked, then latest
        placeable = set(usable)
        shares, foreign = self._shares, self.foreign_vram
        vram = {u: g.memory_bytes - sum(shares.get(u, {}).values()) - foreign.get(u, 0)
                for u, g in self.gpus.items()
                if u not in self._holder and (u in placeable or shares.get(u))}
        pools = {name: self.pool_free(name) for name in self.pools}
        return View(usable, vram, pools, self._memory, busy_free=len(free) - len(usable),
                    booked_from=booked_from)

    def _schedule(self, busy: frozenset[str] | None) -> list[Event]:
        if busy is None:
            if self.waiting.wanting_gpus:
                return []
            busy = frozenset()  # nobody waits for a GPU: the evidence does not matter
        if not self.waiting:
            return self._ask_back({})
        events: list[Event] = []
        plan: dict[str, Claim] = {}  # claim asked back -> the waiter it makes room for
        view = self.view(busy, gpus=bool(self.waiting.wanting_gpus))
        candidates = self._reclaim_candidates()
        for claim in self.waiting.visit(view, bool(candidates)):
            if view.exhausted_for(claim.demand) and (
                    not candidates or candidates[0].priority >= claim.priority):
                continue  # nothing it wants is left, and nothing may be asked back for it
            placed = view.place(claim.demand, claim.on)
            if placed is not None:
                view.take(claim.demand, *placed)
                self.waiting.remove(claim)
                self._hold(claim, *placed)
                claim.state = CLAIM.move(claim.state, GRANTED)
                claim.queue_deadline_usec = 0
                self._no_wait.discard(claim.id)
                events.append(ClaimGranted(claim))
            elif claim.id not in self._no_wait:  # a request that does not wait just leaves
                for asked in self._reclaim_plan(claim, view, plan, candidates):
                    plan[asked.id] = claim
                view.reserve(claim.demand, claim.on)
        return events + self._ask_back(plan)

    def _reclaim_candidates(self) -> list[Claim]:
        """The granted reclaimable claims in the order they are asked back: lowest priority
        first, newest first among equals (sorted once per walk: what the walk grants has
        no lower priority than the waiters after it, so it is never a candidate for them)."""
        return sorted((self.claims[c] for c in self._reclaimable),
                      key=lambda c: (c.priority, -c.seq))

    def _reclaim_plan(self, waiter: Claim, view: View, taken: dict[str, Claim],
                      candidates: list[Claim]) -> list[Claim]:
        """As few reclaimable claims of lower priority than ``waiter`` (``candidates`` in
        order, none already planned for a waiter ahead) as let it fit."""
        if not candidates or candidates[0].priority >= waiter.priority:
            return []
        chosen: list[Claim] = []
        trial = view.copy()
        for c in candidates:
            if c.priority >= waiter.priority:
                break
            if c.id in taken:
                continue
            if trial.place(waiter.demand, waiter.on) is not None:
                break
            trial.give_back(c)
            chosen.append(c)
        if trial.place(waiter.demand, waiter.on) is None:
            return []  # asking back cannot make it fit: ask nobody
        for c in reversed(list(chosen)):  # keep only those that are needed
            without = view.copy()
            for other in chosen:
                if other is not c:
                    without.give_back(other)
            if without.place(waiter.demand, waiter.on) is not None:
                chosen.remove(c)
        return chosen

    def _ask_back(self, plan: dict[str, Claim]) -> list[Event]:
        """Make the standing reclaim requests those of ``plan``; events for what changed."""
        events: list[Event] = []
        changed = sorted((self.claims[c] for c in self._asked | plan.keys() if c in self.claims),
                         key=lambda c: c.seq)
        for c in changed:
            waiter = plan.get(c.id)
            wanted = waiter.id if waiter else ""
            if c.reclaim_for == wanted:
                continue
            c.reclaim_for = wanted
            if wanted:
                self._asked.add(c.id)
            else:
                self._asked.discard(c.id)
            events.append(ReclaimAsked(c, waiter) if waiter else ReclaimWithdrawn(c))
        return events

    # -- indexes ---------------------------------------------------------------------
    def _add(self, claim: Claim) -> None:
        self.claims[claim.id] = claim
        count(self._claims_of, claim, 1)
        count(self._gpus_of, claim, claim.demand.gpu_count)
        if claim.state == QUEUED:
            self.waiting.add(claim)

    def _remove(self, claim: Claim) -> None:
        del self.claims[claim.id]
        count(self._claims_of, claim, -1)
        count(self._gpus_of, claim, -claim.demand.gpu_count)
        if claim.state == QUEUED:
            self.waiting.remove(claim)

    # -- holding ---------------------------------------------------------------------
    def _hold(self, claim: Claim, whole: tuple[str, ...], share: str) -> None:
        for uuid in whole:
            self._holder[uuid] = claim.id
        if share:
            self._shares.setdefault(share, {})[claim.id] = claim.demand.vram
        claim.gpus = whole or ((share,) if share else ())
        for name, amount in claim.demand.pools:
            self._used[name] += amount
        if claim.reclaimable or claim.overdue:
            self._reclaimable.add(claim.id)
        if claim.mode not in (BOOKING, SLURM):  # a booking's holds over the booking's own
            self._hold_over_time(claim)           # hold; a job's time is Slurm's to plan

    def _hold_over_time(self, claim: Claim) -> None:
        """Put a granted claim on the timeline, until its end or the start of the next
        booking that needs what it holds, whichever comes first."""
        share = claim.gpus[0] if claim.shared else ""
        hold = Hold(claim.id, claim.created_usec, None, () if share else claim.gpus, share,
                    claim.demand.vram, claim.demand.pools, claim=True)
        until, booking = claim.end_usec, ""
        conflict = self.timeline.first_conflict(hold)
        if conflict is not None and (not until or conflict[0] < until):
            until, booking = conflict
        until = max(until, claim.created_usec + 1) if until else 0  # never ends before it began
        claim.until_usec, claim.until_booking = until, booking
        if booking:
            self._bounded.add(claim.id)
        else:
            self._bounded.discard(claim.id)
        if until:  # (with no end, the hold asked about is the one kept)
            hold = Hold(hold.id, hold.start, until, hold.whole, share, hold.vram, hold.pools,
                        claim=True)
        self.timeline.add(hold)

    def _booked_from(self, uuid: str) -> int:
        """When a free GPU is first booked (far in the future when never)."""
        start = self.timeline.next_start(uuid)
        return _NEVER if start is None else start

    def _free(self, claim: Claim) -> None:
        self._asked.discard(claim.id)
        if claim.state != GRANTED:
            return
        if claim.mode not in (BOOKING, SLURM):
            self.timeline.remove(claim.id)
        self._reclaimable.discard(claim.id)
        self._bounded.discard(claim.id)
        if claim.shared:
            shares = self._shares[claim.gpus[0]]
            del shares[claim.id]
            if not shares:
                del self._shares[claim.gpus[0]]
        else:
            for uuid in claim.gpus:
                del self._holder[uuid]
        for name, amount in claim.demand.pools:
            self._used[name] -= amount

    # -- refusals --------------------------------------------------------------------
    def _restore_problem(self, claim: Claim) -> str:
        if claim.id in self.claims:
            return "duplicate id"
        if any(name not in self.pools for name, _ in claim.demand.pools):
            return "its pool is gone"
        if claim.state != GRANTED:
            return ""
        for uuid in claim.gpus:
            if uuid not in self.gpus:
                return f"GPU {uuid} is gone"
            if uuid in self._holder or (not claim.shared and self._shares.get(uuid)):
                return f"GPU {uuid} is held twice"
        if claim.shared and self.vram_used(claim.gpus[0]) + claim.demand.vram > self.gpus[claim.gpus[0]].memory_bytes:
            return "its VRAM share no longer fits"
        for name, amount in claim.demand.pools:
            if self._used[name] + amount > self.pools[name].capacity:
                return f"pool {name} is over capacity"
        return ""

    # -- the invariant ---------------------------------------------------------------
    def check_invariants(self) -> None:
        """Capacity and exclusivity hold for every GPU and pool; indexes match the claims."""
        holder: dict[str, str] = {}
        shares: dict[str, dict[str, int]] = {}
        used = {name: 0 for name in self.pools}
        for c in self.claims.values():
            assert c.state in CLAIM.states - CLAIM.final, f"{c.id} is {c.state}"
            if c.state == QUEUED:
                assert not c.gpus, f"queued {c.id} holds GPUs"
                continue
            assert c.gpus or c.demand.pools, f"{c.id} holds nothing"
            for uuid in c.gpus:
                assert uuid in self.gpus, f"{c.id} holds unknown GPU {uuid}"
            if c.shared:
                assert len(c.gpus) == 1
                shares.setdefault(c.gpus[0], {})[c.id] = c.demand.vram
            else:
                assert len(c.gpus) == c.demand.gpus, f"{c.id} holds the wrong number of GPUs"
                for uuid in c.gpus:
                    assert uuid not in holder, f"{uuid} held by {holder.get(uuid)} and {c.id}"
                    holder[uuid] = c.id
            for name, amount in c.demand.pools:
                used[name] += amount
        for uuid, on in shares.items():
            assert uuid not in holder, f"{uuid} is held whole and shared"
            assert sum(on.values()) <= self.gpus[uuid].memory_bytes, f"{uuid} VRAM over capacity"
        for name, amount in used.items():
            assert amount <= self.pools[name].capacity, f"pool {name} over capacity"
        assert holder == self._holder, "holder index out of step with the claims"
        assert shares == self._shares, "share index out of step with the claims"
        assert used == self._used, "pool use out of step with the claims"
        self.waiting.check(sorted((c for c in self.claims.values() if c.state == QUEUED),
                                  key=rank))
        assert counted(self.claims.values()) == self._claims_of, "claims per user and session"
        assert counted(self.claims.values(), lambda c: c.demand.gpu_count) == self._gpus_of, "GPUs"
        granted = [c for c in self.claims.values() if c.state == GRANTED]
        assert {c.id for c in granted if c.reclaimable or c.overdue} == self._reclaimable, \
            "reclaimable index"
        assert {c.id for c in self.claims.values() if c.reclaim_for} == self._asked, "asked index"
        assert {c.id for c in granted if c.until_booking} == self._bounded, "bounded index"
        for c in granted:
            if c.mode not in (BOOKING, SLURM):
                hold = self.timeline.holds.get(c.id)
                assert hold is not None and hold.gpus() == c.gpus, f"{c.id} is not on the timeline"
                assert hold.end == (c.until_usec or None), f"{c.id} ends otherwise on the timeline"
        self.timeline.check_invariants()


_NEVER = 2**63
