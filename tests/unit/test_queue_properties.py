"""The queue's promises, each as a property over random inventories and request streams:
priority then arrival order, no starvation of a large request by small ones, requests
that do not wait never taking what a waiter ahead can use, and reclaim asking back few,
lowest priority first, for the waiter that gets what they free.

The examples at the end are the smallest cases of bugs these properties found (all fixed).
"""

from dataclasses import dataclass

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from resourced.core.claims import Claim, ClaimRequest, Demand, ProcessRef
from resourced.core.inventory import Gpu
from resourced.core.ledger import (
    ClaimGranted,
    ClaimQueued,
    ClaimReleased,
    Ledger,
    ReclaimAsked,
    ReclaimWithdrawn,
)
from resourced.core.lifecycle import GRANTED, QUEUED
from resourced.core.pools import Pool
from resourced.errors import GPUsBusy, NotEnoughCapacity, NotEnoughGPUs

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def request(demand: Demand, priority: int = 0, reclaimable: bool = False, pid: int = 1):
    return ClaimRequest(demand=demand, mode="dev", owner=ProcessRef(pid, 1), uid=1000,
                        priority=priority, reclaimable=reclaimable)


def rank(c: Claim) -> tuple[int, int]:
    return (-c.priority, c.seq)


def granted(events) -> list[str]:
    return [e.claim.id for e in events if type(e) is ClaimGranted]


@dataclass
class Free:
    """What is free for a request, from the ledger's queries (no busy GPUs here)."""

    gpus: list[str]
    pools: dict[str, int]

    @classmethod
    def of(cls, ledger: Ledger) -> "Free":
        return cls([g.uuid for g in ledger.free_gpus()],
                   {name: ledger.pool_free(name) for name in ledger.pools})

    def fits(self, d: Demand) -> bool:
        return len(self.gpus) >= d.gpus and all(self.pools[n] >= a for n, a in d.pools)

    def plus(self, *claims: Claim) -> "Free":
        pools = dict(self.pools)
        for c in claims:
            for name, amount in c.demand.pools:
                pools[name] += amount
        return Free(self.gpus + [u for c in claims for u in c.gpus], pools)

    def minus_reserved(self, d: Demand) -> "Free":
        """What a waiter that does not fit leaves to those after it: all but its demand."""
        return Free(self.gpus[d.gpus:],
                    {n: a - min(a, dict(d.pools).get(n, 0)) for n, a in self.pools.items()})


@st.composite
def demands(draw, gpus: int, pools: dict[str, int]) -> Demand:
    """A demand for whole GPUs and/or pool amounts that could be granted on an empty ledger."""
    n = draw(st.integers(0, gpus))
    amounts = {name: draw(st.integers(1, cap)) for name, cap in pools.items()
               if draw(st.booleans())}
    if not (n or amounts):
        name = draw(st.sampled_from(sorted(pools)))
        amounts[name] = draw(st.integers(1, pools[name]))
    return Demand.of(gpus=n, pools=amounts)


inventories = st.tuples(st.integers(0, 4), st.dictionaries(st.sampled_from(["cpu", "ram"]),
                                                           st.integers(1, 8), min_size=1))


def ledger_of(gpus: int, pools: dict[str, int]) -> Ledger:
    return Ledger([Gpu(index=i, uuid=f"GPU-{i}") for i in range(gpus)],
                  [Pool(name, cap) for name, cap in pools.items()])


# -- priority, then arrival ------------------------------------------------------------


@SETTINGS
@given(cap=st.integers(1, 10), data=st.data())
def test_in_one_pool_claims_are_granted_strictly_by_priority_then_arrival(cap, data):
    ledger = Ledger([], [Pool("cpu", cap)])
    amounts = st.integers(1, cap)
    for i, amount in enumerate(data.draw(st.lists(amounts, max_size=4), label="held")):
        ledger.submit(request(Demand.of(pools={"cpu": amount})), f"h{i}", 0)
    waiters = data.draw(st.lists(st.tuples(amounts, st.integers(0, 2)), max_size=8),
                        label="waiters (amount, priority)")

    def check(events):
        for claim_id in granted(events):
            g = ledger.get(claim_id)
            assert all(rank(q) > rank(g) for q in list(ledger.waiting)), \
                f"{claim_id} was served before an earlier-ranked waiter"
        queue = list(ledger.waiting)
        assert not queue or queue[0].demand.pools[0][1] > ledger.pool_free("cpu"), \
            "the first waiter fits but waits"
        ledger.check_invariants()

    for i, (amount, priority) in enumerate(waiters):
        events, _ = ledger.submit(request(Demand.of(pools={"cpu": amount}), priority), f"w{i}",
                                  0, wait=True)
        check(events)
    while ledger.claims:
        held = sorted(c.id for c in ledger.claims.values() if c.state == GRANTED)
        check(ledger.release(data.draw(st.sampled_from(held), label="release")))


# -- no starvation -----------------------------------------------------------------------


@SETTINGS
@given(inventory=inventories, data=st.data())
def test_small_requests_arriving_later_never_starve_a_large_waiter(inventory, data):
    n, pools = inventory
    ledger = ledger_of(n, pools)
    demand = demands(n, pools)
    for i, d in enumerate(data.draw(st.lists(demand, min_size=1, max_size=4), label="held")):
        ledger.submit(request(d), f"h{i}", 0)
    earlier = {c.id for c in ledger.claims.values()}
    large = data.draw(demand, label="large")
    events, _ = ledger.submit(request(large), "large", 0, wait=True)
    assume(ledger.get("large").state == QUEUED)
    waiter = ledger.get("large")

    step = 0
    while waiter.state == QUEUED:
        step += 1
        action = data.draw(st.sampled_from(["release-earlier", "small", "small-waits",
                                            "release-small"]), label="action")
        smalls = sorted(c.id for c in ledger.claims.values()
                        if c.id not in earlier and c.id != "large" and c.state == GRANTED)
        if action.startswith("small") and step < 30:
            small = data.draw(demand, label="small")
            events, _ = ledger.submit(request(small), f"s{step}", 0,
                                      wait=action == "small-waits")
        elif action == "release-small" and smalls:
            events = ledger.release(data.draw(st.sampled_from(smalls), label="small id"))
        else:
            events = ledger.release(sorted(earlier).pop(0))
            earlier -= {events[0].claim.id}
            if not earlier:
                assert waiter.state == GRANTED, "all that was held before it is gone, yet it waits"
        served = granted(events)
        if "large" in served:
            assert served[0] == "large", "a later request was served first"
        else:
            free = Free.of(ledger)
            for claim_id in served:
                assert not free.plus(ledger.get(claim_id)).fits(large), \
                    f"{claim_id} took what the large waiter could use"
        ledger.check_invariants()


# -- requests that do not wait -----------------------------------------------------------


@SETTINGS
@given(inventory=inventories, data=st.data())
def test_a_request_that_does_not_wait_takes_only_what_no_waiter_ahead_can_use(inventory, data):
    n, pools = inventory
    ledger = ledger_of(n, pools)
    demand = demands(n, pools)
    for i, d in enumerate(data.draw(st.lists(demand, max_size=4), label="held")):
        ledger.submit(request(d), f"h{i}", 0)
    wait_demand = data.draw(demand, label="waiter")
    wait_priority = data.draw(st.integers(0, 2), label="waiter priority")
    ledger.submit(request(wait_demand, wait_priority), "w", 0, wait=True)
    assume(ledger.get("w").state == QUEUED)
    x, priority = data.draw(demand, label="request"), data.draw(st.integers(0, 2), label="prio")
    free = Free.of(ledger)
    ahead = priority <= wait_priority
    expect = free.minus_reserved(wait_demand).fits(x) if ahead else free.fits(x)

    events, refusal = ledger.submit(request(x, priority), "x", 0)

    if expect:
        assert refusal is None and granted(events) == ["x"]
        assert not Free.of(ledger).fits(wait_demand)
        if ahead:
            assert set(ledger.get("x").gpus).isdisjoint(free.gpus[:wait_demand.gpus])
    else:
        assert events == [] and "x" not in ledger.claims
        assert isinstance(refusal, (NotEnoughGPUs, NotEnoughCapacity))
        if free.fits(x):
            assert "ahead" in refusal.message, "the refusal does not say a waiter is ahead"
    assert ledger.get("w").state == QUEUED
    ledger.check_invariants()


# -- reclaim -----------------------------------------------------------------------------


@st.composite
def reclaim_setups(draw):
    """A full cpu pool held by claims of random priority, some reclaimable, and a waiter."""
    cap = draw(st.integers(2, 12))
    held, left = [], cap
    while left:
        amount = draw(st.integers(1, left))
        held.append((amount, draw(st.integers(0, 3)), draw(st.booleans())))
        left -= amount
    free = draw(st.integers(0, min(held[-1][0], cap - 1)))  # the last one never came
    held[-1] = (held[-1][0] - free, *held[-1][1:])
    held = [h for h in held if h[0]]
    want = draw(st.integers(free + 1, cap))
    return cap, held, want, draw(st.integers(1, 4))


def cpu(claim: Claim) -> int:
    return dict(claim.demand.pools)["cpu"]


@SETTINGS
@given(setup=reclaim_setups(), data=st.data())
def test_reclaim_asks_back_few_lowest_priority_claims_and_gives_what_they_free_to_the_waiter(
        setup, data):
    cap, held, want, priority = setup
    ledger = Ledger([], [Pool("cpu", cap)])
    for i, (amount, prio, reclaimable) in enumerate(held):
        ledger.submit(request(Demand.of(pools={"cpu": amount}), prio, reclaimable), f"h{i}", 0)
    free = ledger.pool_free("cpu")

    events, _ = ledger.submit(request(Demand.of(pools={"cpu": want}), priority), "w", 0, wait=True)

    waiter = ledger.get("w")
    assert events[0] == ClaimQueued(waiter)
    asked = [e.claim for e in events[1:]]
    assert all(e == ReclaimAsked(e.claim, waiter) for e in events[1:])
    assert {c.id for c in ledger.claims.values() if c.reclaim_for} == {c.id for c in asked}
    candidates = sorted((c for c in ledger.claims.values()
                         if c.reclaimable and c.priority < priority and c.id != "w"),
                        key=lambda c: (c.priority, -c.seq))
    prefix = next((candidates[:k] for k in range(len(candidates) + 1)
                   if free + sum(map(cpu, candidates[:k])) >= want), None)
    if prefix is None:
        assert asked == [], "asked back claims that cannot make room"
        return
    assert free + sum(map(cpu, asked)) >= want, "what it asked back is not enough"
    assert {c.id for c in asked} <= {c.id for c in prefix}, "not the lowest priority first"
    for c in asked:
        assert free + sum(map(cpu, asked)) - cpu(c) < want, f"{c.id} was asked back needlessly"

    # Later, lower-ranked requests arrive while the asked claims give back one by one.
    for i, c in enumerate(data.draw(st.permutations(asked), label="release order")):
        later = data.draw(st.integers(1, cap), label="later amount")
        events, _ = ledger.submit(request(Demand.of(pools={"cpu": later}),
                                          data.draw(st.integers(0, priority))), f"l{i}", 0,
                                  wait=data.draw(st.booleans(), label="later waits"))
        assert granted(events) == [], "a later request took what was asked back for the waiter"
        events = ledger.release(c.id)
        last = i == len(asked) - 1
        assert granted(events)[:1] == (["w"] if last else [])
        ledger.check_invariants()
    assert waiter.state == GRANTED
    assert not any(c.reclaim_for == "w" for c in ledger.claims.values())


@SETTINGS
@given(setup=reclaim_setups(), how=st.sampled_from(["timeout", "cancelled", "owner"]))
def test_reclaim_requests_are_withdrawn_when_the_waiter_leaves(setup, how):
    cap, held, want, priority = setup
    ledger = Ledger([], [Pool("cpu", cap)])
    for i, (amount, prio, reclaimable) in enumerate(held):
        ledger.submit(request(Demand.of(pools={"cpu": amount}), prio, reclaimable), f"h{i}", 0)
    ledger.submit(request(Demand.of(pools={"cpu": want}), priority), "w", 0, wait=True)
    asked = [c for c in ledger.claims.values() if c.reclaim_for == "w"]

    events = (ledger.owner_died("w", 1) if how == "owner" else ledger.release("w", how))

    reason = "owner-exited" if how == "owner" else how
    assert events[0] == ClaimReleased(events[0].claim, reason)
    assert events[1:] == [ReclaimWithdrawn(c) for c in asked]
    assert not any(c.reclaim_for for c in ledger.claims.values())
    ledger.check_invariants()


# -- bugs found here, as the smallest examples Hypothesis gave ---------------------------

O = ProcessRef(1, 1)


def share(claim_id: str, seq: int, vram: int, gpu: str, reclaimable: bool = False) -> Claim:
    return Claim(id=claim_id, mode="dev", demand=Demand.of(vram=vram), owner=O, uid=1000,
                 user="", label="", task_name="", created_usec=0, seq=seq, gpus=(gpu,),
                 reclaimable=reclaimable)


def test_shares_arriving_later_do_not_keep_a_whole_gpu_waiter_waiting():
    ledger = Ledger([Gpu(i, f"GPU-{i}", memory_bytes=100) for i in range(2)])
    ledger.submit(request(Demand.of(vram=10)), "s1", 0)
    ledger.submit(request(Demand.of(gpus=2)), "large", 0, wait=True)
    for i in range(2, 5):  # each share ends after the next one started
        ledger.submit(request(Demand.of(vram=10)), f"s{i}", 0)
        if f"s{i - 1}" in ledger.claims:
            ledger.release(f"s{i - 1}")
    assert ledger.get("large").state == GRANTED  # got: queued, s4 shares GPU-0


def test_shares_arriving_later_do_not_keep_a_share_waiter_waiting():
    ledger = Ledger([Gpu(i, f"GPU-{i}", memory_bytes=8) for i in range(2)])
    ledger.restore([share("e1", 1, 6, "GPU-0"), share("e2", 2, 5, "GPU-1")])
    ledger.submit(request(Demand.of(vram=7)), "large", 0, wait=True)
    ledger.submit(request(Demand.of(vram=2)), "g1", 0)
    ledger.release("e1")
    ledger.submit(request(Demand.of(vram=3)), "g2", 0)
    ledger.release("e2")  # all that was there before it is gone
    assert ledger.get("large").state == GRANTED


def test_a_refused_request_changes_no_reclaim_request():
    ledger = Ledger([], [Pool("cpu", 10)])
    ledger.submit(request(Demand.of(pools={"cpu": 4})), "h", 0)
    for name in ("r1", "r2"):
        ledger.submit(request(Demand.of(pools={"cpu": 2}), reclaimable=True), name, 0)
    ledger.submit(request(Demand.of(pools={"cpu": 4}), priority=5), "w", 0, wait=True)
    assert ledger.get("r2").reclaim_for == "w" and ledger.get("r1").reclaim_for == ""

    events, refusal = ledger.submit(request(Demand.of(pools={"cpu": 3}), priority=9), "x", 0)

    assert isinstance(refusal, NotEnoughCapacity)
    assert events == []  # got: [ReclaimAsked(r1, w)]: r1 asked back for nothing


def test_the_first_waiter_asks_back_a_claim_asked_for_a_later_one():
    ledger = Ledger([Gpu(i, f"GPU-{i}") for i in range(4)], [Pool("cpu", 2)])
    ledger.submit(request(Demand.of(gpus=1), reclaimable=True), "r", 0)
    ledger.submit(request(Demand.of(gpus=1)), "h", 0)
    ledger.submit(request(Demand.of(gpus=3, pools={"cpu": 1}), 1), "w1", 0, wait=True)
    assert ledger.get("r").reclaim_for == "w1"

    events, _ = ledger.submit(request(Demand.of(gpus=3), 2), "w2", 0, wait=True)

    # got: [ClaimQueued(w2), ReclaimWithdrawn(r)], and nobody asks r back until the next walk
    r, w2 = ledger.get("r"), ledger.get("w2")
    assert events == [ClaimQueued(w2), ReclaimAsked(r, w2)]
    assert r.reclaim_for == "w2"


def test_what_a_share_reclaim_frees_goes_to_its_waiter():
    ledger = Ledger([Gpu(i, f"GPU-{i}", memory_bytes=80) for i in range(2)])
    ledger.restore([share("a", 1, 30, "GPU-0"), share("model", 2, 30, "GPU-1", reclaimable=True),
                    share("b", 3, 10, "GPU-1")])
    ledger.submit(request(Demand.of(vram=60), priority=5), "w", 0, wait=True)
    assert ledger.get("model").reclaim_for == "w"

    events, refusal = ledger.submit(request(Demand.of(vram=20)), "later", 0)

    assert events == [] and refusal is not None  # got: granted on GPU-1, the model's GPU
    assert "ClaimGranted" in [type(e).__name__ for e in ledger.release("model")]


def test_a_refusal_because_of_a_waiter_ahead_says_so_even_with_busy_gpus():
    ledger = Ledger([Gpu(i, f"GPU-{i}") for i in range(2)])
    busy = frozenset({"GPU-0"})
    ledger.submit(request(Demand.of(gpus=2)), "w", 0, busy, wait=True)
    events, refusal = ledger.submit(request(Demand.of(gpus=1)), "x", 0, busy)
    assert events == [] and refusal is not None
    assert not isinstance(refusal, GPUsBusy) or "ahead" in refusal.message
    assert "ahead" in refusal.message  # got: "1 GPU(s) requested, 1 unclaimed but 1 of them ..."
