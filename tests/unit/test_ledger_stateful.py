"""No sequence of requests, waits, releases, owner deaths and evidence changes ever breaks
capacity, exclusivity, queue order or the reclaim rules.

A rule-based state machine (after Hypothesis's own cache test) drives the ledger over a
random inventory of GPUs (with memory, so shares happen) and pools, and keeps a plain
model beside it: which claims exist, in which state, and what each one holds.  Every
step's events must describe exactly the change it made.  After every step the ledger's
own ``check_invariants`` runs, the model must agree with every query, a second walk of
the queue must change nothing (each walk serves all it can), a claim granted during the
step must not have taken what the first waiter could use, the first waiter must fit once
everything held went to claims ranked after it, and its reclaim requests must be exactly
the few lowest-priority ones it needs.  A ``restart`` rule reloads the ledger from its
own store records.  Checks that known product bugs break are relaxed (``KNOWN_BUGS``).
"""

import copy
import json
import random

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, initialize, invariant, rule

from resourced.core.claims import MODES, ClaimRequest, Demand, ProcessRef
from resourced.core.inventory import Gpu
from resourced.core.ledger import (
    ClaimGranted,
    ClaimQueued,
    ClaimReleased,
    Ledger,
    MembersChanged,
    OwnerDied,
    ReclaimAsked,
    ReclaimWithdrawn,
)
from resourced.core.lifecycle import GRANTED, QUEUED
from resourced.core.pools import Pool
from resourced.daemon.store.claims import claim_from_record, claim_to_record
from resourced.errors import (
    GPUsBusy,
    NoSuchClaim,
    NoSuchPool,
    NotEnoughCapacity,
    NotEnoughGPUs,
)

POOLS = ("cpu", "ram")
RECLAIM_EVENTS = (ReclaimAsked, ReclaimWithdrawn)



def rank(c) -> tuple[int, int]:
    return (-c.priority, c.seq)


class Free:
    """What is free, computed from the claims alone: the model's view, not the ledger's."""

    def __init__(self, ledger: Ledger, busy: frozenset[str]):
        self.memory = {u: g.memory_bytes for u, g in ledger.gpus.items()}
        held, shares = set(), {}
        self.pools = {name: p.capacity for name, p in ledger.pools.items()}
        for c in ledger.claims.values():
            if c.state != GRANTED:
                continue
            if c.shared:
                shares[c.gpus[0]] = shares.get(c.gpus[0], 0) + c.demand.vram
            else:
                held.update(c.gpus)
            for name, amount in c.demand.pools:
                self.pools[name] -= amount
        self.gpus = [u for u in ledger.gpus if u not in held and u not in shares and u not in busy]
        self.vram = {u: self.memory[u] - shares.get(u, 0) for u in ledger.gpus
                     if u not in held and (u in self.gpus or u in shares)}

    def give_back(self, c) -> "Free":
        other = copy.deepcopy(self)
        if c.shared:
            other.vram[c.gpus[0]] += c.demand.vram
        else:
            other.gpus += c.gpus
            other.vram.update((u, other.memory[u]) for u in c.gpus)
        for name, amount in c.demand.pools:
            other.pools[name] += amount
        return other

    def fits(self, d: Demand) -> bool:
        return (len(self.gpus) >= d.gpus
                and all(self.pools[name] >= amount for name, amount in d.pools)
                and (not d.vram or max(self.vram.values(), default=0) >= d.vram))


@st.composite
def demands(draw, pools: tuple[str, ...]) -> Demand:
    kind = draw(st.sampled_from(["gpus", "vram", "none"]))
    chosen = draw(st.lists(st.sampled_from(pools), unique=True, max_size=2)) if pools else []
    if draw(st.integers(0, 19)) == 0:
        chosen.append("licences")  # a pool nobody configured
    if kind == "none" and not chosen:
        kind = "gpus"
    return Demand.of(gpus=draw(st.integers(1, 3)) if kind == "gpus" else 0,
                     vram=draw(st.integers(1, 8)) if kind == "vram" else 0,
                     pools={name: draw(st.integers(1, 6)) for name in chosen})


class LedgerMachine(RuleBasedStateMachine):
    claims = Bundle("claims")

    @initialize(data=st.data())
    def inventory(self, data):
        n = data.draw(st.integers(0, 4), label="gpus")
        memory = data.draw(st.lists(st.sampled_from([0, 4, 8]), min_size=n, max_size=n),
                           label="memory")
        pools = data.draw(st.dictionaries(st.sampled_from(POOLS), st.integers(2, 8)),
                          label="pools")
        self.gpus = [Gpu(index=i, uuid=f"GPU-{i:02d}", memory_bytes=m)
                     for i, m in enumerate(memory)]
        self.pools = [Pool(name, capacity) for name, capacity in sorted(pools.items())]
        order = data.draw(st.permutations(range(n)), label="construction order")
        self.ledger = Ledger([self.gpus[i] for i in order], self.pools)
        self.model: dict[str, dict] = {}  # claim id -> what the model expects of it
        self.busy: frozenset[str] = frozenset()
        self.clock = 0
        self.arrived: dict[str, int] = {}  # claim id -> step it was submitted in
        self.granted: dict[str, int] = {}  # claim id -> step it was granted in

    # -- the model -------------------------------------------------------------------
    def snapshot(self):
        return ({cid: claim_to_record(c) for cid, c in self.ledger.claims.items()},
                [c.id for c in list(self.ledger.waiting)])

    def expect_claims(self):
        return {cid: dict(m) for cid, m in self.model.items()}

    def seen_claims(self):
        return {cid: {"state": c.state, "owner_alive": c.owner_alive, "members": c.members,
                      "mode": c.mode, "demand": c.demand, "priority": c.priority,
                      "reclaimable": c.reclaimable}
                for cid, c in self.ledger.claims.items()}

    def run(self, operation):
        """Do one mutation; check the events against the change they describe."""
        before = {cid: (c.state, c.reclaim_for, c.gpus) for cid, c in self.ledger.claims.items()}
        queued_before = {c.id for c in list(self.ledger.waiting)}
        result = operation()
        events = result[0] if isinstance(result, tuple) else result
        after = self.ledger.claims
        asked = {}  # claim id -> reclaim_for its last reclaim event implies
        for e in events:
            if type(e) is ClaimGranted:
                assert e.claim.id in queued_before or e.claim.id not in before
                assert e.claim.state == GRANTED and after.get(e.claim.id) == e.claim
                self.model[e.claim.id]["state"] = GRANTED
                self.granted[e.claim.id] = self.clock
            elif type(e) is ReclaimAsked:
                asked[e.claim.id] = e.waiter.id
            elif type(e) is ReclaimWithdrawn:
                asked[e.claim.id] = ""
            elif type(e) is ClaimReleased:
                assert e.claim.id not in after
                self.model.pop(e.claim.id)
        for cid, (state, reclaim_for, gpus) in before.items():
            if cid not in after:
                assert any(type(e) is ClaimReleased and e.claim.id == cid for e in events)
                continue
            c = after[cid]
            if state == GRANTED:
                assert c.state == GRANTED and c.gpus == gpus, "a grant changed"
            elif c.state == GRANTED:
                assert ClaimGranted(c) in events
            if c.reclaim_for != reclaim_for:
                assert asked.get(cid) == c.reclaim_for, f"{cid}: reclaim change without event"
        for cid, waiter in asked.items():
            if cid in after:
                assert after[cid].reclaim_for == waiter, f"{cid}: event and state disagree"
        self.check_grants_took_nothing_an_earlier_waiter_could_use(events)
        return result

    def check_grants_took_nothing_an_earlier_waiter_could_use(self, events):
        queue = list(self.ledger.waiting)
        if not queue:
            return
        first = queue[0]  # nothing reserved ahead of it: its view is all that is free
        free = Free(self.ledger, self.busy)
        later = [e.claim for e in events if type(e) is ClaimGranted and rank(e.claim) > rank(first)]
        for c in later:
            assert not free.give_back(c).fits(first.demand), \
                f"{c.id} took what earlier waiter {first.id} could use"
        at_its_turn = free
        for c in later:
            at_its_turn = at_its_turn.give_back(c)
        d = first.demand
        assert len(free.gpus) >= min(d.gpus, len(at_its_turn.gpus)), \
            f"{[c.id for c in later]} took GPUs earlier waiter {first.id} could use"
        for name, amount in d.pools:
            assert free.pools[name] >= min(amount, at_its_turn.pools[name]), \
                f"{[c.id for c in later]} took {name} earlier waiter {first.id} could use"

    # -- rules -----------------------------------------------------------------------
    @rule(target=claims, data=st.data(), mode=st.sampled_from(MODES), wait=st.booleans(),
          priority=st.integers(0, 2), reclaimable=st.booleans())
    def submit(self, data, mode, wait, priority, reclaimable):
        pools = tuple(p.name for p in self.pools)
        demand = data.draw(demands(pools), label="demand")
        self.clock += 1
        claim_id = f"c{self.clock}"
        request = ClaimRequest(demand=demand, mode=mode, owner=ProcessRef(self.clock, 1),
                               uid=1000, priority=priority, reclaimable=reclaimable)
        before = self.snapshot()
        if self.never_fits(demand):
            try:
                self.ledger.submit(request, claim_id, self.clock, self.busy, wait)
            except (NotEnoughGPUs, NotEnoughCapacity, NoSuchPool):
                assert self.snapshot() == before
                return claim_id
            raise AssertionError(f"{demand} can never be granted but was not refused at once")

        raw = Free(self.ledger, self.busy)
        ahead = [c for c in list(self.ledger.waiting) if c.priority >= priority]
        self.arrived[claim_id] = self.clock
        self.model[claim_id] = {"state": QUEUED, "owner_alive": True, "members": frozenset(),
                                "mode": mode, "demand": demand, "priority": priority,
                                "reclaimable": reclaimable}
        events, refusal = self.run(
            lambda: self.ledger.submit(request, claim_id, self.clock, self.busy, wait))
        claim = self.ledger.claims.get(claim_id)
        rest = [e for e in events[1:] if not isinstance(e, RECLAIM_EVENTS)]
        assert rest == [], "a request served someone else with nothing freed"
        if claim is not None and claim.state == GRANTED:
            assert refusal is None and events[0] == ClaimGranted(claim)
            if not ahead and demand.gpus:
                assert claim.gpus == tuple(raw.gpus[: demand.gpus]), "not the lowest indices"
        elif wait:
            assert refusal is None and events[0] == ClaimQueued(claim)
            assert claim.state == QUEUED and claim.gpus == ()
        else:
            del self.model[claim_id]
            assert claim is None
            assert events == []
            assert self.snapshot() == before, "a refused request changed something"
            self.check_refusal(refusal, demand, raw, ahead)
        return claim_id

    def never_fits(self, d: Demand) -> bool:
        capacity = {p.name: p.capacity for p in self.pools}
        return (d.gpus > len(self.gpus)
                or any(amount > capacity.get(name, 0) for name, amount in d.pools)
                or d.vram > max((g.memory_bytes for g in self.gpus), default=0))

    def check_refusal(self, refusal, d: Demand, raw: Free, ahead):
        assert isinstance(refusal, (NotEnoughGPUs, GPUsBusy, NotEnoughCapacity))
        if raw.fits(d):
            assert ahead, "refused although it fits and nobody waits ahead of it"
            assert "ahead" in refusal.message, f"the refusal hides the waiters: {refusal}"
            return
        if ahead:
            return
        unheld = len(raw.gpus) + len([u for u in self.busy if u in self.ledger.gpus
                                      and not self.ledger.claims_on(u)])
        if len(raw.gpus) < d.gpus:
            assert type(refusal) is (GPUsBusy if unheld >= d.gpus else NotEnoughGPUs)
            return
        short_of_pools = any(raw.pools.get(name, 0) < amount for name, amount in d.pools)
        busy_room = any(u in self.busy and not self.ledger.claims_on(u)
                        and u not in self.ledger.slurm and raw.memory[u] >= d.vram
                        for u in self.ledger.gpus)
        if d.vram and not short_of_pools and busy_room:  # its room is where strangers run
            assert type(refusal) is GPUsBusy
        else:
            assert type(refusal) is NotEnoughCapacity

    @rule(claim_id=claims, reason=st.sampled_from(["released", "forced", "cancelled", "timeout"]))
    def release(self, claim_id, reason):
        if claim_id not in self.model:
            before = self.snapshot()
            try:
                self.ledger.release(claim_id)
            except NoSuchClaim:
                assert self.snapshot() == before
                return
            raise AssertionError("released a claim that is gone")
        claim = self.ledger.get(claim_id)
        events = self.run(lambda: self.ledger.release(claim_id, reason, self.busy))
        assert events[0] == ClaimReleased(claim, reason)

    @rule(claim_id=claims)
    def owner_died(self, claim_id):
        expected = self.model.get(claim_id)
        self.clock += 1
        events = self.run(lambda: self.ledger.owner_died(claim_id, self.clock, self.busy))
        if expected is None or not expected["owner_alive"]:
            assert events == []
        elif expected["state"] == QUEUED or (expected["mode"] == "run" and not expected["members"]):
            assert (type(events[0]), events[0].claim.id, events[0].reason) == \
                (ClaimReleased, claim_id, "owner-exited")
        else:
            assert events == [OwnerDied(self.ledger.get(claim_id))]
            expected["owner_alive"] = False

    @rule(claim_id=claims, pid=st.integers(1, 3))
    def member_started(self, claim_id, pid):
        ref = ProcessRef(10_000 + pid, 1)
        events = self.run(lambda: self.ledger.add_members(claim_id, [ref]))
        expected = self.model.get(claim_id)
        if expected is None or ref in expected["members"]:
            assert events == []
        else:
            assert events == [MembersChanged(self.ledger.get(claim_id))]
            expected["members"] = expected["members"] | {ref}

    @rule(claim_id=claims, pid=st.integers(1, 3))
    def member_exited(self, claim_id, pid):
        ref = ProcessRef(10_000 + pid, 1)
        expected = self.model.get(claim_id)
        events = self.run(lambda: self.ledger.member_exited(claim_id, ref, self.busy))
        if expected is None or ref not in expected["members"]:
            assert events == []
            return
        expected["members"] = expected["members"] - {ref}
        if expected["mode"] == "run" and not expected["owner_alive"] and not expected["members"]:
            assert events[0] == ClaimReleased(events[0].claim, "owner-exited")
        else:
            assert events == [MembersChanged(self.ledger.get(claim_id))]

    @rule(data=st.data())
    def evidence_changes(self, data):
        names = [g.uuid for g in self.gpus] + ["GPU-not-here"]
        self.busy = data.draw(st.frozensets(st.sampled_from(names)), label="busy")
        events = self.run(self.walk)
        assert all(type(e) in (ClaimGranted, *RECLAIM_EVENTS) for e in events)

    def walk(self):
        return self.ledger.schedule(self.busy)

    @rule()
    def release_unknown(self):
        before = self.snapshot()
        try:
            self.ledger.release("never-granted")
        except NoSuchClaim:
            assert self.snapshot() == before
            return
        raise AssertionError("released a claim that never was")

    @rule(seed=st.integers(0, 2**16))
    def restart(self, seed):
        """A new ledger restored from the store's records holds exactly the same."""
        records = [json.loads(json.dumps(claim_to_record(c))) for c in self.ledger.claims.values()]
        random.Random(seed).shuffle(records)
        reloaded = Ledger(random.Random(seed).sample(self.gpus, len(self.gpus)), self.pools)
        assert reloaded.restore(claim_from_record(r) for r in records) == []
        assert self.snapshot() == (
            {cid: claim_to_record(c) for cid, c in reloaded.claims.items()},
            [c.id for c in list(reloaded.waiting)])
        reloaded.check_invariants()
        self.ledger = reloaded

    # -- invariants ------------------------------------------------------------------
    @invariant()
    def capacity_and_exclusivity_hold(self):
        self.ledger.check_invariants()
        held: dict[str, str] = {}
        shares: dict[str, dict[str, int]] = {}
        used = dict.fromkeys((p.name for p in self.pools), 0)
        for c in self.ledger.claims.values():
            if c.state == QUEUED:
                assert c.gpus == (), f"queued {c.id} holds GPUs"
                continue
            if c.shared:
                assert len(c.gpus) == 1
                shares.setdefault(c.gpus[0], {})[c.id] = c.demand.vram
            else:
                assert len(c.gpus) == c.demand.gpus
                for u in c.gpus:
                    assert u not in held, f"{u} held by {held[u]} and {c.id}"
                    held[u] = c.id
            for name, amount in c.demand.pools:
                used[name] += amount
        for g in self.gpus:
            on = shares.get(g.uuid, {})
            assert not (on and g.uuid in held), f"{g.uuid} held whole and shared"
            assert sum(on.values()) <= g.memory_bytes
            assert self.ledger.vram_used(g.uuid) == sum(on.values())
            holder = self.ledger.holder(g.uuid)
            assert (holder.id if holder else None) == held.get(g.uuid)
            expected_on = [held[g.uuid]] if g.uuid in held else sorted(on)
            assert sorted(c.id for c in self.ledger.claims_on(g.uuid)) == expected_on
        assert [g.uuid for g in self.ledger.free_gpus()] == \
            [g.uuid for g in self.gpus if g.uuid not in held and g.uuid not in shares]
        for p in self.pools:
            assert 0 <= used[p.name] <= p.capacity
            assert self.ledger.pool_free(p.name) == p.capacity - used[p.name]

    @invariant()
    def agrees_with_the_model(self):
        assert self.seen_claims() == self.expect_claims()
        queue = list(self.ledger.waiting)
        assert [c.id for c in queue] == [c.id for c in sorted(queue, key=rank)]
        assert len({c.seq for c in self.ledger.claims.values()}) == len(self.ledger.claims)

    @invariant()
    def a_second_walk_changes_nothing(self):
        events = copy.deepcopy(self.ledger).schedule(self.busy)
        assert events == [], "the last walk left something undone"

    @invariant()
    def the_first_waiter_is_not_starved(self):
        """Once all that is held went to claims ranked after it, granted while it waited,
        the first waiter fits (busy GPUs aside): they had only what it could not use."""
        queue = list(self.ledger.waiting)
        if not queue:
            return
        waiter = queue[0]
        held = [c for c in self.ledger.claims.values() if c.state == GRANTED]
        if not all(rank(c) > rank(waiter) and self.granted[c.id] > self.arrived[waiter.id]
                   for c in held):
            return
        assert Free(self.ledger, frozenset()).fits(waiter.demand), \
            f"{waiter.id} waits behind claims that came after it"

    @invariant()
    def reclaim_requests_are_legal(self):
        claims = self.ledger.claims
        for c in claims.values():
            if c.reclaim_for:
                waiter = claims.get(c.reclaim_for)
                assert waiter is not None and waiter.state == QUEUED, \
                    f"{c.id} is asked back for {c.reclaim_for}, which no longer waits"
                assert c.state == GRANTED and c.reclaimable and c.priority < waiter.priority

    @invariant()
    def the_first_waiter_asks_back_few_and_lowest_first(self):
        queue = list(self.ledger.waiting)
        if not queue:
            return
        waiter = queue[0]
        free = Free(self.ledger, self.busy)
        if free.fits(waiter.demand):
            return  # only the evidence (busy) stands between it and a grant: see above
        asked = [c for c in self.ledger.claims.values() if c.reclaim_for == waiter.id]
        candidates = sorted(
            (c for c in self.ledger.claims.values()
             if c.state == GRANTED and c.reclaimable and c.priority < waiter.priority
             and c.reclaim_for in ("", waiter.id)),
            key=lambda c: (c.priority, -c.seq))

        def fits_without(given_back):
            trial = free
            for c in given_back:
                trial = trial.give_back(c)
            return trial.fits(waiter.demand)

        prefix = next((candidates[:k] for k in range(1, len(candidates) + 1)
                       if fits_without(candidates[:k])), None)
        if prefix is None:
            assert asked == [], f"{waiter.id} asked back claims that cannot make it fit"
            return
        assert asked, f"{waiter.id} could fit by asking back {[c.id for c in prefix]}"
        assert fits_without(asked), f"{waiter.id} would not fit even with what it asked back"
        assert {c.id for c in asked} <= {c.id for c in prefix}, "not the lowest priority first"
        for c in asked:
            assert not fits_without([a for a in asked if a is not c]), f"{c.id} is not needed"


LedgerMachine.TestCase.settings = settings(
    max_examples=150,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestLedger = LedgerMachine.TestCase

