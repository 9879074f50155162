"""The ledger and claim requests, driven directly: no bus, no clock, no processes."""

import dataclasses

import pytest

from resourced.core.claims import MODES, Claim, ClaimRequest, Demand, ProcessRef
from resourced.core.inventory import Gpu
from resourced.core.ledger import (
    ClaimGranted,
    ClaimQueued,
    ClaimReleased,
    Ledger,
    OwnerDied,
    ReclaimAsked,
    ReclaimWithdrawn,
)
from resourced.core.lifecycle import GRANTED, QUEUED
from resourced.core.pools import BYTES, Pool
from resourced.errors import (
    GPUsBusy,
    InvalidArgs,
    NoSuchClaim,
    NoSuchPool,
    NotEnoughCapacity,
    NotEnoughGPUs,
    ResourcedError,
)

OWNER = ProcessRef(pid=4242, start_time=1000)
NOW = 1_700_000_000_000_000
GIB = 1 << 30


def uuid(i: int) -> str:
    return f"GPU-{i:02d}"


def inventory(n: int, memory: int = 0) -> list[Gpu]:
    return [Gpu(index=i, uuid=uuid(i), name="Test GPU", memory_bytes=memory, pci_bus_id=f"0:{i}")
            for i in range(n)]


def request(gpus: int = 1, mode: str = "run", uid: int = 1000, *, vram: int = 0,
            pools: dict[str, int] | None = None, priority: int = 0,
            reclaimable: bool = False) -> ClaimRequest:
    return ClaimRequest(demand=Demand.of(gpus, vram, pools), mode=mode, owner=OWNER, uid=uid,
                        user="alice", label="lbl", task_name="task", priority=priority,
                        reclaimable=reclaimable)


def grant(ledger: Ledger, req: ClaimRequest, claim_id: str, now: int = NOW,
          busy: frozenset[str] = frozenset()) -> list:
    """Submit a request that must be granted at once; the events."""
    events, refusal = ledger.submit(req, claim_id, now, busy)
    assert refusal is None, refusal
    assert ledger.get(claim_id).state == GRANTED
    return events


def refusal(ledger: Ledger, req: ClaimRequest, claim_id: str, now: int = NOW,
            busy: frozenset[str] = frozenset()) -> ResourcedError:
    """Submit a request that must be refused, now (returned) or ever (raised); the error."""
    try:
        events, error = ledger.submit(req, claim_id, now, busy)
    except ResourcedError as exc:
        return exc
    assert events == []
    assert error is not None
    return error


def state(ledger: Ledger) -> dict:
    """Everything observable about a ledger, deep-copied so later mutation cannot hide."""
    return {
        "claims": {cid: dataclasses.asdict(c) for cid, c in ledger.claims.items()},
        "holders": {u: (h.id if (h := ledger.holder(u)) else None) for u in ledger.gpus},
        "on": {u: sorted(c.id for c in ledger.claims_on(u)) for u in ledger.gpus},
        "vram": {u: ledger.vram_used(u) for u in ledger.gpus},
        "free": [g.uuid for g in ledger.free_gpus()],
        "pools": {name: ledger.pool_free(name) for name in ledger.pools},
        "queue": [c.id for c in list(ledger.waiting)],
    }


def ids(events) -> list[tuple[str, str]]:
    return [(type(e).__name__, e.claim.id) for e in events]


@pytest.fixture
def ledger() -> Ledger:
    return Ledger(inventory(4))


# -- construction and queries ------------------------------------------------------------


def test_new_ledger_has_every_gpu_free_in_index_order():
    gpus = inventory(4)
    ledger = Ledger([gpus[2], gpus[0], gpus[3], gpus[1]])
    assert ledger.free_gpus() == gpus
    assert ledger.claims == {}
    assert list(ledger.waiting) == []
    assert all(ledger.holder(g.uuid) is None for g in gpus)
    assert all(ledger.claims_on(g.uuid) == [] for g in gpus)
    ledger.check_invariants()


def test_empty_ledger_refuses_every_gpu_request():
    ledger = Ledger([])
    with pytest.raises(NotEnoughGPUs):
        ledger.submit(request(1), "c1", NOW)
    with pytest.raises(NotEnoughGPUs):
        ledger.submit(request(1), "c1", NOW, wait=True)
    assert state(ledger) == {"claims": {}, "holders": {}, "on": {}, "vram": {}, "free": [],
                             "pools": {}, "queue": []}
    ledger.check_invariants()


def test_holder_of_unknown_gpu_is_none(ledger):
    assert ledger.holder("GPU-nope") is None
    assert ledger.claims_on("GPU-nope") == []


@pytest.mark.parametrize("name", [uuid(2), "gpu2", "2"])
def test_gpu_by_name_accepts_uuid_label_and_index(ledger, name):
    assert ledger.gpu_by_name(name) == inventory(4)[2]


def test_gpu_by_name_accepts_alias():
    ledger = Ledger([Gpu(index=0, uuid="GPU-a", alias="big"), Gpu(index=1, uuid="GPU-b")])
    assert ledger.gpu_by_name("big").uuid == "GPU-a"
    assert ledger.gpu_by_name("gpu1").uuid == "GPU-b"


@pytest.mark.parametrize("name", ["gpu9", "9", "GPU-nope", "", "gpu"])
def test_gpu_by_name_unknown_is_invalid_request(ledger, name):
    with pytest.raises(InvalidArgs):
        ledger.gpu_by_name(name)


def test_get_unknown_claim_raises_no_such_claim(ledger):
    with pytest.raises(NoSuchClaim):
        ledger.get("c-nope")


def test_describe_names_every_amount_in_its_unit():
    ledger = Ledger([], [Pool("ram", 64 * GIB, BYTES), Pool("cpu", 16)])
    assert ledger.describe(Demand.of(gpus=2, pools={"ram": 32 * GIB, "cpu": 8})) == \
        "2 GPU(s), cpu 8, ram 32G"
    assert ledger.describe(Demand.of(vram=8 * GIB)) == "VRAM 8G"


# -- grant -------------------------------------------------------------------------------


def test_an_event_says_what_was_when_it_happened(ledger):
    [granted] = grant(ledger, request(1, "dev"), "c1", NOW)
    ledger.owner_died("c1", NOW + 1)
    assert ledger.get("c1").owner_alive is False
    assert granted.claim.owner_alive is True and granted.claim.state == GRANTED


def test_grant_takes_lowest_indices_first_and_records_the_claim(ledger):
    events = grant(ledger, request(2, "dev"), "c1", NOW)

    claim = Claim(id="c1", mode="dev", demand=Demand.of(gpus=2), owner=OWNER, uid=1000,
                  user="alice", label="lbl", task_name="task", created_usec=NOW,
                  state=GRANTED, seq=1, gpus=(uuid(0), uuid(1)), owner_alive=True)
    assert events == [ClaimGranted(claim)]
    assert type(events[0]) is ClaimGranted
    assert events[0].claim == ledger.get("c1")
    assert events[0].claim is not ledger.get("c1")  # a snapshot: see the next test
    assert state(ledger) == {
        "claims": {"c1": dataclasses.asdict(claim)},
        "holders": {uuid(0): "c1", uuid(1): "c1", uuid(2): None, uuid(3): None},
        "on": {uuid(0): ["c1"], uuid(1): ["c1"], uuid(2): [], uuid(3): []},
        "vram": dict.fromkeys((uuid(i) for i in range(4)), 0),
        "free": [uuid(2), uuid(3)],
        "pools": {},
        "queue": [],
    }
    ledger.check_invariants()


def test_second_grant_gets_the_next_free_gpus(ledger):
    grant(ledger, request(1), "c1")
    grant(ledger, request(2), "c2")
    ledger.release("c1")
    [event] = grant(ledger, request(2), "c3")
    assert event.claim.gpus == (uuid(0), uuid(3))
    ledger.check_invariants()


def test_grant_of_every_gpu_then_one_more_is_refused(ledger):
    grant(ledger, request(4), "c1")
    assert ledger.free_gpus() == []
    assert isinstance(refusal(ledger, request(1), "c2"), NotEnoughGPUs)


def test_grant_skips_busy_gpus_in_favour_of_others(ledger):
    [event] = grant(ledger, request(2), "c1", busy=frozenset({uuid(0), uuid(2)}))
    assert event.claim.gpus == (uuid(1), uuid(3))
    assert [g.uuid for g in ledger.free_gpus()] == [uuid(0), uuid(2)]
    ledger.check_invariants()


def test_busy_gpus_that_are_already_held_do_not_block_a_grant(ledger):
    grant(ledger, request(2, "dev"), "c0")
    [event] = grant(ledger, request(2), "c1", busy=frozenset({uuid(0), uuid(1)}))
    assert event.claim.gpus == (uuid(2), uuid(3))


def test_busy_uuids_outside_the_inventory_are_ignored(ledger):
    [event] = grant(ledger, request(4), "c1", busy=frozenset({"GPU-elsewhere"}))
    assert event.claim.gpus == tuple(uuid(i) for i in range(4))


@pytest.mark.parametrize(
    "held, busy, wanted, error",
    [
        # nothing held: 4 free
        (0, set(), 5, NotEnoughGPUs),
        (0, {0}, 4, GPUsBusy),
        (0, {0, 1, 2, 3}, 1, GPUsBusy),
        (0, {0, 1}, 5, NotEnoughGPUs),  # too few even if nothing were busy
        # GPUs 0 and 1 held: 2 free
        (2, set(), 3, NotEnoughGPUs),
        (2, {2}, 2, GPUsBusy),
        (2, {0, 1}, 3, NotEnoughGPUs),  # busy held GPUs do not turn this into GPUsBusy
        (2, {2, 3}, 3, NotEnoughGPUs),
        (2, {3}, 2, GPUsBusy),
    ],
)
def test_refusal_kind_and_nothing_changes(ledger, held, busy, wanted, error):
    if held:
        grant(ledger, request(held, "dev"), "c0")
    before = state(ledger)

    got = refusal(ledger, request(wanted), "c1", NOW + 1, busy=frozenset(uuid(i) for i in busy))

    assert type(got) is error
    assert state(ledger) == before
    ledger.check_invariants()


def test_a_share_whose_only_room_is_on_busy_gpus_is_gpus_busy():
    ledger = Ledger(inventory(2, memory=80 * GIB))
    grant(ledger, request(1, "dev"), "c0")  # GPU 0 held whole: only GPU 1 could take it

    got = refusal(ledger, request(0, vram=4 * GIB), "c1", busy=frozenset({uuid(1)}))

    assert type(got) is GPUsBusy
    assert "fits only on gpu1" in got.message
    assert type(refusal(ledger, request(0, vram=81 * GIB), "c2",
                        busy=frozenset({uuid(1)}))) is NotEnoughCapacity  # fits nowhere


def test_vram_that_processes_nobody_claimed_hold_is_not_free_to_a_share():
    ledger = Ledger(inventory(1, memory=8 * GIB))
    grant(ledger, request(0, vram=6 * GIB), "c0")
    ledger.foreign_vram = {uuid(0): GIB}

    assert type(refusal(ledger, request(0, vram=GIB + 1), "c1")) is NotEnoughCapacity
    grant(ledger, request(0, vram=GIB), "c2")
    ledger.check_invariants()


def test_refusals_are_not_each_other():
    assert not issubclass(GPUsBusy, NotEnoughGPUs)
    assert not issubclass(NotEnoughGPUs, GPUsBusy)


def test_taken_claim_id_is_invalid_request_and_changes_nothing(ledger):
    grant(ledger, request(1), "c1")
    before = state(ledger)
    with pytest.raises(InvalidArgs):
        ledger.submit(request(1), "c1", NOW + 1)
    with pytest.raises(InvalidArgs):
        ledger.submit(request(1), "c1", NOW + 1, wait=True)
    assert state(ledger) == before


def test_a_refused_request_leaves_no_trace_in_the_arrival_order(ledger):
    grant(ledger, request(4), "c0")
    refusal(ledger, request(1), "c1")
    ledger.release("c0")
    [event] = grant(ledger, request(1), "c2")
    assert event.claim.seq == 3  # arrival numbers are never reused, but nothing is held


# -- pools -------------------------------------------------------------------------------


@pytest.fixture
def pooled() -> Ledger:
    return Ledger(inventory(2), [Pool("cpu", 16), Pool("ram", 64 * GIB, BYTES)])


def test_a_pool_amount_is_held_and_given_back(pooled):
    [event] = grant(pooled, request(0, pools={"cpu": 10, "ram": 8 * GIB}), "c1")
    assert event.claim.gpus == ()
    assert (pooled.pool_free("cpu"), pooled.pool_free("ram")) == (6, 56 * GIB)
    assert len(pooled.free_gpus()) == 2
    pooled.check_invariants()
    pooled.release("c1")
    assert (pooled.pool_free("cpu"), pooled.pool_free("ram")) == (16, 64 * GIB)


def test_pools_and_gpus_are_granted_all_or_nothing(pooled):
    grant(pooled, request(0, pools={"cpu": 10}), "c1")
    before = state(pooled)
    got = refusal(pooled, request(1, pools={"cpu": 8}), "c2")
    assert isinstance(got, NotEnoughCapacity) and "cpu" in got.message
    assert state(pooled) == before  # the GPU it could have had was not taken either
    got = refusal(pooled, request(3, pools={"cpu": 1}), "c3")
    assert isinstance(got, NotEnoughGPUs)
    assert state(pooled) == before


def test_a_pool_can_be_filled_exactly(pooled):
    grant(pooled, request(0, pools={"cpu": 6}), "c1")
    grant(pooled, request(0, pools={"cpu": 10}), "c2")
    assert pooled.pool_free("cpu") == 0
    assert isinstance(refusal(pooled, request(0, pools={"cpu": 1}), "c3"), NotEnoughCapacity)


@pytest.mark.parametrize("wait", [False, True])
@pytest.mark.parametrize("req, error", [
    (request(0, pools={"gpu-slots": 1}), NoSuchPool),
    (request(0, pools={"cpu": 17}), NotEnoughCapacity),
    (request(0, vram=1), NotEnoughCapacity),  # GPUs without memory take no share
    (request(3), NotEnoughGPUs),
])
def test_a_request_that_could_never_be_granted_raises_waiting_or_not(pooled, req, wait, error):
    grant(pooled, request(0, pools={"cpu": 1}), "c0")
    before = state(pooled)
    with pytest.raises(error):
        pooled.submit(req, "c1", NOW, wait=wait)
    assert state(pooled) == before


# -- VRAM shares -------------------------------------------------------------------------


@pytest.fixture
def shared() -> Ledger:
    return Ledger(inventory(3, memory=80 * GIB))


def test_shares_fill_one_gpu_before_taking_another(shared):
    [a] = grant(shared, request(0, vram=30 * GIB), "a")
    [b] = grant(shared, request(0, vram=40 * GIB), "b")
    assert a.claim.gpus == b.claim.gpus == (uuid(0),)
    assert shared.vram_used(uuid(0)) == 70 * GIB
    assert [c.id for c in shared.claims_on(uuid(0))] == ["a", "b"]
    assert shared.holder(uuid(0)) is None
    assert [g.uuid for g in shared.free_gpus()] == [uuid(1), uuid(2)]
    [c] = grant(shared, request(0, vram=20 * GIB), "c")
    assert c.claim.gpus == (uuid(1),)  # 10G left on gpu0 is too little
    [d] = grant(shared, request(0, vram=10 * GIB), "d")
    assert d.claim.gpus == (uuid(0),)  # the tightest fit
    shared.check_invariants()


def test_a_shared_gpu_is_not_free_for_a_whole_claim_until_its_last_share_ends(shared):
    grant(shared, request(0, vram=GIB), "a")
    grant(shared, request(0, vram=GIB), "b")
    [w] = grant(shared, request(2), "w")
    assert w.claim.gpus == (uuid(1), uuid(2))
    assert isinstance(refusal(shared, request(1), "x"), NotEnoughGPUs)
    shared.release("a")
    assert isinstance(refusal(shared, request(1), "x"), NotEnoughGPUs)
    shared.release("b")
    [x] = grant(shared, request(1), "x")
    assert x.claim.gpus == (uuid(0),)
    assert shared.vram_used(uuid(0)) == 0
    shared.check_invariants()


def test_a_gpu_held_whole_takes_no_share(shared):
    grant(shared, request(3), "w")
    got = refusal(shared, request(0, vram=GIB), "s")
    assert isinstance(got, NotEnoughCapacity) and "VRAM" in got.message


def test_a_busy_free_gpu_takes_no_share_but_a_shared_one_still_does(shared):
    busy = frozenset({uuid(0), uuid(1), uuid(2)})
    assert isinstance(refusal(shared, request(0, vram=GIB), "s", busy=busy), GPUsBusy)
    grant(shared, request(0, vram=GIB), "a")
    [b] = grant(shared, request(0, vram=GIB), "b", busy=busy)  # gpu0 runs a's processes
    assert b.claim.gpus == (uuid(0),)


def test_a_share_is_refused_when_no_single_gpu_has_room_even_if_the_sum_would(shared):
    for i, name in enumerate("abc"):
        grant(shared, request(0, vram=50 * GIB), name)
    got = refusal(shared, request(0, vram=40 * GIB), "d")
    assert isinstance(got, NotEnoughCapacity) and "on one GPU" in got.message


# -- the queue ---------------------------------------------------------------------------


def test_a_waiting_request_is_queued_holding_nothing_and_granted_on_release(ledger):
    grant(ledger, request(3), "c1")
    before = state(ledger)
    events, error = ledger.submit(request(2), "w", NOW + 1, wait=True)
    waiter = ledger.get("w")
    assert error is None and events == [ClaimQueued(waiter)]
    assert (waiter.state, waiter.gpus, waiter.seq) == (QUEUED, (), 2)
    assert list(ledger.waiting) == [waiter]
    assert {k: v for k, v in state(ledger).items() if k not in ("claims", "queue")} == \
        {k: v for k, v in before.items() if k not in ("claims", "queue")}
    ledger.check_invariants()

    events = ledger.release("c1")
    assert ids(events) == [("ClaimReleased", "c1"), ("ClaimGranted", "w")]
    assert waiter.state == GRANTED and waiter.gpus == (uuid(0), uuid(1))
    assert list(ledger.waiting) == []
    ledger.check_invariants()


def test_a_waiting_request_that_fits_is_granted_at_once(ledger):
    events, error = ledger.submit(request(1), "w", NOW, wait=True)
    assert error is None and ids(events) == [("ClaimGranted", "w")]


def test_the_queue_is_served_by_priority_then_arrival(ledger):
    grant(ledger, request(4), "all")
    for name, prio in [("low", 0), ("high", 5), ("low2", 0), ("high2", 5)]:
        ledger.submit(request(1, priority=prio), name, NOW, wait=True)
    assert [c.id for c in list(ledger.waiting)] == ["high", "high2", "low", "low2"]
    events = ledger.release("all")
    assert [i for kind, i in ids(events) if kind == "ClaimGranted"] == \
        ["high", "high2", "low", "low2"]


def test_a_queued_claim_can_be_cancelled_and_frees_nothing(ledger):
    grant(ledger, request(4), "all")
    ledger.submit(request(1), "w", NOW, wait=True)
    events = ledger.release("w", "cancelled")
    assert ids(events) == [("ClaimReleased", "w")] and events[0].reason == "cancelled"
    assert list(ledger.waiting) == [] and ledger.holder(uuid(0)).id == "all"
    ledger.check_invariants()


def test_a_queued_claim_whose_owner_dies_is_cancelled(ledger):
    grant(ledger, request(4), "all")
    ledger.submit(request(1, "dev"), "w", NOW, wait=True)
    [event] = ledger.owner_died("w", NOW)
    assert (type(event), event.claim.id, event.reason) == (ClaimReleased, "w", "owner-exited")
    assert "w" not in ledger.claims


def test_a_large_waiter_is_not_overtaken_by_later_small_requests(ledger):
    grant(ledger, request(2), "a")
    grant(ledger, request(1), "b")
    ledger.submit(request(2), "large", NOW, wait=True)   # 1 free, needs 2
    got = refusal(ledger, request(1), "small")
    assert isinstance(got, NotEnoughGPUs) and "ahead" in got.message
    events, _ = ledger.submit(request(1), "small-waiting", NOW, wait=True)
    assert ids(events) == [("ClaimQueued", "small-waiting")]
    events = ledger.release("b")
    assert ids(events) == [("ClaimReleased", "b"), ("ClaimGranted", "large")]
    events = ledger.release("a")
    assert ids(events) == [("ClaimReleased", "a"), ("ClaimGranted", "small-waiting")]


def test_a_later_request_may_take_what_no_waiter_ahead_can_use(pooled):
    grant(pooled, request(2), "gpus")
    pooled.submit(request(1), "w", NOW, wait=True)
    [event] = grant(pooled, request(0, pools={"cpu": 4}), "cpu")
    assert event.claim.id == "cpu"
    assert pooled.get("w").state == QUEUED


def test_schedule_serves_a_waiter_once_its_gpus_are_no_longer_busy(ledger):
    grant(ledger, request(3), "c1")
    busy = frozenset({uuid(3)})
    events, _ = ledger.submit(request(1), "w", NOW, busy, wait=True)
    assert ids(events) == [("ClaimQueued", "w")]
    assert ledger.schedule(busy) == []
    assert ids(ledger.schedule()) == [("ClaimGranted", "w")]


# -- reclaim -----------------------------------------------------------------------------


@pytest.fixture
def cpus() -> Ledger:
    return Ledger([], [Pool("cpu", 10)])


def test_a_higher_priority_waiter_asks_back_a_reclaimable_claim(cpus):
    grant(cpus, request(0, pools={"cpu": 6}, reclaimable=True), "model")
    events, _ = cpus.submit(request(0, pools={"cpu": 8}, priority=5), "w", NOW, wait=True)
    model, w = cpus.get("model"), cpus.get("w")
    assert events == [ClaimQueued(w), ReclaimAsked(model, w)]
    assert model.reclaim_for == "w"
    events = cpus.release("model")
    assert ids(events) == [("ClaimReleased", "model"), ("ClaimGranted", "w")]


@pytest.mark.parametrize("prio, reclaimable", [(0, True), (5, False), (-1, False)])
def test_no_reclaim_from_equal_priority_or_unreclaimable_claims(cpus, prio, reclaimable):
    grant(cpus, request(0, pools={"cpu": 6}, priority=prio, reclaimable=reclaimable), "c")
    events, _ = cpus.submit(request(0, pools={"cpu": 8}, priority=prio), "w", NOW, wait=True)
    assert ids(events) == [("ClaimQueued", "w")]
    assert cpus.get("c").reclaim_for == ""


def test_reclaim_asks_the_lowest_priority_newest_first_and_no_more_than_needed(cpus):
    for name, prio in [("p1-old", 1), ("p0", 0), ("p1-new", 1)]:
        grant(cpus, request(0, pools={"cpu": 3}, priority=prio, reclaimable=True), name)
    events, _ = cpus.submit(request(0, pools={"cpu": 6}, priority=5), "w", NOW, wait=True)
    assert ids(events) == [("ClaimQueued", "w"), ("ReclaimAsked", "p0"),
                           ("ReclaimAsked", "p1-new")]


def test_nothing_is_asked_back_when_reclaiming_cannot_make_room(cpus):
    grant(cpus, request(0, pools={"cpu": 2}, reclaimable=True), "r")
    grant(cpus, request(0, pools={"cpu": 8}), "fixed")
    events, _ = cpus.submit(request(0, pools={"cpu": 5}, priority=5), "w", NOW, wait=True)
    assert ids(events) == [("ClaimQueued", "w")]


def test_a_request_that_does_not_wait_asks_nothing_back(cpus):
    grant(cpus, request(0, pools={"cpu": 6}, reclaimable=True), "model")
    events, error = cpus.submit(request(0, pools={"cpu": 8}, priority=5), "x", NOW)
    assert events == [] and isinstance(error, NotEnoughCapacity)
    assert cpus.get("model").reclaim_for == ""


def test_reclaim_is_withdrawn_when_the_waiter_leaves(cpus):
    grant(cpus, request(0, pools={"cpu": 6}, reclaimable=True), "model")
    cpus.submit(request(0, pools={"cpu": 8}, priority=5), "w", NOW, wait=True)
    events = cpus.release("w", "timeout")
    assert events == [ClaimReleased(events[0].claim, "timeout"),
                      ReclaimWithdrawn(cpus.get("model"))]
    assert cpus.get("model").reclaim_for == ""


def test_reclaim_is_withdrawn_when_the_waiter_is_served_otherwise(cpus):
    grant(cpus, request(0, pools={"cpu": 4}), "other")
    grant(cpus, request(0, pools={"cpu": 4}, reclaimable=True), "model")
    cpus.submit(request(0, pools={"cpu": 6}, priority=5), "w", NOW, wait=True)
    model = cpus.get("model")
    assert model.reclaim_for == "w"
    events = cpus.release("other")
    assert events == [ClaimReleased(events[0].claim, "released"), ClaimGranted(cpus.get("w")),
                      ReclaimWithdrawn(model)]
    assert model.reclaim_for == "" and model.state == GRANTED


def test_what_a_reclaim_frees_goes_to_its_waiter_not_to_a_later_request(cpus):
    grant(cpus, request(0, pools={"cpu": 6}, reclaimable=True), "model")
    grant(cpus, request(0, pools={"cpu": 4}), "fixed")
    cpus.submit(request(0, pools={"cpu": 6}, priority=5), "w", NOW, wait=True)
    cpus.submit(request(0, pools={"cpu": 6}, priority=1), "later", NOW, wait=True)
    assert isinstance(refusal(cpus, request(0, pools={"cpu": 1}, priority=1), "x"),
                      NotEnoughCapacity)
    events = cpus.release("model")
    assert ids(events) == [("ClaimReleased", "model"), ("ClaimGranted", "w")]
    assert cpus.get("later").state == QUEUED


# -- release -----------------------------------------------------------------------------


def test_release_frees_the_gpus_and_returns_the_claim(ledger):
    [granted] = grant(ledger, request(2), "c1")
    events = ledger.release("c1")
    assert events == [ClaimReleased(granted.claim, "released")]
    assert type(events[0]) is ClaimReleased
    assert state(ledger) == {
        "claims": {},
        "holders": {uuid(i): None for i in range(4)},
        "on": {uuid(i): [] for i in range(4)},
        "vram": {uuid(i): 0 for i in range(4)},
        "free": [uuid(i) for i in range(4)],
        "pools": {},
        "queue": [],
    }
    ledger.check_invariants()


def test_release_carries_the_given_reason(ledger):
    grant(ledger, request(1), "c1")
    [event] = ledger.release("c1", "forced")
    assert event.reason == "forced"


def test_release_leaves_other_claims_alone(ledger):
    grant(ledger, request(1), "c1")
    grant(ledger, request(2, "dev"), "c2")
    ledger.release("c1")
    assert list(ledger.claims) == ["c2"]
    assert [g.uuid for g in ledger.free_gpus()] == [uuid(0), uuid(3)]
    ledger.check_invariants()


@pytest.mark.parametrize("claim_id", ["c-never", "", "c1"])
def test_release_of_unknown_id_raises_no_such_claim_and_changes_nothing(ledger, claim_id):
    grant(ledger, request(1), "c2")
    before = state(ledger)
    with pytest.raises(NoSuchClaim):
        ledger.release(claim_id)
    assert state(ledger) == before


def test_release_twice_raises_no_such_claim(ledger):
    grant(ledger, request(1), "c1")
    ledger.release("c1")
    before = state(ledger)
    with pytest.raises(NoSuchClaim):
        ledger.release("c1")
    assert state(ledger) == before


# -- owner death -------------------------------------------------------------------------


def test_owner_died_releases_a_run_claim(ledger):
    [granted] = grant(ledger, request(2, "run"), "c1")
    events = ledger.owner_died("c1")
    assert events == [ClaimReleased(granted.claim, "owner-exited")]
    assert type(events[0]) is ClaimReleased
    assert ledger.claims == {}
    assert len(ledger.free_gpus()) == 4
    ledger.check_invariants()


def test_owner_died_marks_a_dev_claim_dead_and_keeps_it(ledger):
    grant(ledger, request(2, "dev"), "c1")
    events = ledger.owner_died("c1")

    claim = ledger.get("c1")
    assert events == [OwnerDied(claim)]
    assert type(events[0]) is OwnerDied
    assert claim.owner_alive is False
    assert claim.gpus == (uuid(0), uuid(1))
    assert [g.uuid for g in ledger.free_gpus()] == [uuid(2), uuid(3)]
    assert ledger.holder(uuid(0)) is claim
    ledger.check_invariants()


def test_dead_dev_claim_can_still_be_released(ledger):
    grant(ledger, request(1, "dev"), "c1")
    ledger.owner_died("c1")
    [event] = ledger.release("c1")
    assert (event.claim.id, event.reason, event.claim.owner_alive) == ("c1", "released", False)
    assert len(ledger.free_gpus()) == 4


@pytest.mark.parametrize("mode", MODES)
def test_owner_died_twice_yields_no_more_events(ledger, mode):
    grant(ledger, request(1, mode), "c1")
    assert len(ledger.owner_died("c1")) == 1
    before = state(ledger)
    assert ledger.owner_died("c1") == []
    assert state(ledger) == before


def test_owner_died_of_unknown_claim_yields_nothing(ledger):
    grant(ledger, request(1), "c1")
    before = state(ledger)
    assert ledger.owner_died("c-nope") == []
    assert state(ledger) == before


def test_the_death_of_a_run_owner_serves_the_queue(ledger):
    grant(ledger, request(4, "run"), "c1")
    ledger.submit(request(1), "w", NOW, wait=True)
    assert ids(ledger.owner_died("c1")) == [("ClaimReleased", "c1"), ("ClaimGranted", "w")]


def test_events_are_frozen(ledger):
    [event] = grant(ledger, request(1), "c1")
    with pytest.raises(dataclasses.FrozenInstanceError):
        event.claim = None


# -- restore -----------------------------------------------------------------------------


def test_restore_takes_back_claims_and_refuses_what_no_longer_fits(pooled):
    old = Ledger(inventory(2), [Pool("cpu", 16), Pool("ram", 64 * GIB, BYTES)])
    grant(old, request(1, pools={"cpu": 8}), "a")
    old.submit(request(2), "w", NOW, wait=True)
    ghost = dataclasses.replace(old.get("a"), id="ghost", gpus=("GPU-gone",), seq=9)
    twice = dataclasses.replace(old.get("a"), id="twice", seq=10)
    copies = [dataclasses.replace(c) for c in old.claims.values()]
    refused = pooled.restore([twice, ghost, *copies])
    assert sorted((c.id, why) for c, why in refused) == [
        ("ghost", "GPU GPU-gone is gone"), ("twice", f"GPU {uuid(0)} is held twice")]
    assert state(pooled)["holders"] == state(old)["holders"]
    assert pooled.pool_free("cpu") == 8 and [c.id for c in pooled.waiting] == ["w"]
    pooled.check_invariants()
    events, _ = pooled.submit(request(0, pools={"cpu": 1}), "next", NOW)
    assert events[0].claim.seq == 3  # arrival numbers go on after the restored ones


def test_a_claim_asked_back_for_a_waiter_that_is_not_restored_is_asked_no_more():
    old = Ledger(inventory(1), [Pool("licences", 2)])
    grant(old, request(1, reclaimable=True), "model")
    old.submit(request(1, pools={"licences": 1}, priority=5), "w", NOW, wait=True)
    assert old.get("model").reclaim_for == "w"
    new = Ledger(inventory(1))  # the pool left the configuration
    refused = new.restore([dataclasses.replace(c) for c in old.claims.values()])
    assert [(c.id, why) for c, why in refused] == [("w", "its pool is gone")]
    new.schedule()
    new.submit(request(1, priority=5), "w2", NOW, wait=True)
    assert new.get("model").reclaim_for == "w2"  # got: still "w", which is gone


# -- the invariant checker catches what it should ------------------------------------------


def test_check_invariants_catches_a_gpu_held_twice(ledger):
    grant(ledger, request(1), "c1")
    ledger.claims["c2"] = dataclasses.replace(ledger.get("c1"), id="c2")
    with pytest.raises(AssertionError):
        ledger.check_invariants()


def test_check_invariants_catches_an_unknown_gpu(ledger):
    grant(ledger, request(1), "c1")
    ledger.claims["c1"] = dataclasses.replace(ledger.get("c1"), gpus=("GPU-ghost",))
    with pytest.raises(AssertionError):
        ledger.check_invariants()


def test_check_invariants_catches_an_empty_claim(ledger):
    grant(ledger, request(1), "c1")
    ledger.claims["c2"] = dataclasses.replace(ledger.get("c1"), id="c2", gpus=())
    with pytest.raises(AssertionError):
        ledger.check_invariants()


def test_check_invariants_catches_a_queued_claim_that_holds_gpus(ledger):
    grant(ledger, request(1), "c1")
    ledger.get("c1").state = QUEUED
    with pytest.raises(AssertionError):
        ledger.check_invariants()


def test_check_invariants_catches_an_overfull_pool(cpus):
    grant(cpus, request(0, pools={"cpu": 6}), "c1")
    cpus.claims["c2"] = dataclasses.replace(cpus.get("c1"), id="c2")
    with pytest.raises(AssertionError):
        cpus.check_invariants()


def test_check_invariants_catches_an_overfull_gpu():
    ledger = Ledger(inventory(1, memory=10 * GIB))
    grant(ledger, request(0, vram=6 * GIB), "c1")
    ledger.claims["c2"] = dataclasses.replace(ledger.get("c1"), id="c2")
    with pytest.raises(AssertionError):
        ledger.check_invariants()


# -- claim requests ----------------------------------------------------------------------


def test_modes_are_run_and_dev():
    assert MODES == ("run", "dev")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("gpus", [1, 2, 64])
def test_valid_request_is_accepted_as_given(mode, gpus):
    r = ClaimRequest(demand=Demand.of(gpus=gpus), mode=mode, owner=OWNER, uid=0)
    assert (r.demand, r.mode, r.owner, r.uid, r.user, r.label, r.task_name, r.priority,
            r.reclaimable) == (Demand(gpus, 0, ()), mode, OWNER, 0, "", "", "", 0, False)


@pytest.mark.parametrize("mode", ["", "RUN", "booking", "run ", "exclusive"])
def test_unknown_mode_is_invalid_request(mode):
    with pytest.raises(InvalidArgs, match="mode"):
        ClaimRequest(demand=Demand.of(gpus=1), mode=mode, owner=OWNER, uid=0)


@pytest.mark.parametrize("kw, match", [
    ({}, "nothing requested"),
    ({"gpus": 0}, "nothing requested"),
    ({"gpus": -1}, "positive"),
    ({"gpus": -100}, "positive"),
    ({"vram": -1}, "positive"),
    ({"pools": {"cpu": 0}}, "positive"),
    ({"pools": {"cpu": -2}}, "positive"),
    ({"gpus": 1, "vram": GIB}, "not both"),
])
def test_an_empty_negative_or_mixed_demand_is_invalid_request(kw, match):
    with pytest.raises(InvalidArgs, match=match):
        Demand.of(**kw)


def test_demand_pools_are_sorted_by_name():
    assert Demand.of(pools={"ram": 1, "cpu": 2}).pools == (("cpu", 2), ("ram", 1))


def test_request_demand_and_process_ref_are_frozen():
    r = request()
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.demand = None
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.demand.gpus = 0
    with pytest.raises(dataclasses.FrozenInstanceError):
        OWNER.pid = 1


# -- a claim placed on named GPUs, or off excluded ones ----------------------------------------


def test_a_claim_goes_only_on_the_gpus_it_may_use():
    ledger = Ledger(inventory(4, memory=80 * GIB))
    on = dataclasses.replace(request(gpus=1), on=(uuid(2),))
    grant(ledger, on, "c1")
    assert ledger.get("c1").gpus == (uuid(2),)
    assert isinstance(refusal(ledger, on, "c2"), NotEnoughGPUs)  # its one GPU is taken
    share = dataclasses.replace(request(gpus=0, vram=20 * GIB), on=(uuid(3),))
    grant(ledger, share, "c3")
    assert ledger.get("c3").gpus == (uuid(3),)
    off = dataclasses.replace(request(gpus=1), on=(uuid(0), uuid(2), uuid(3)))  # not GPU-01
    grant(ledger, off, "c4")
    assert ledger.get("c4").gpus == (uuid(0),)
    ledger.check_invariants()


def test_more_than_the_gpus_it_may_use_never_fits():
    ledger = Ledger(inventory(4, memory=80 * GIB))
    error = refusal(ledger, dataclasses.replace(request(gpus=2), on=(uuid(1),)), "c1")
    assert isinstance(error, NotEnoughGPUs) and "1 may be used" in str(error)
    big = dataclasses.replace(request(gpus=0, vram=81 * GIB), on=(uuid(1),))
    assert isinstance(refusal(ledger, big, "c2"), NotEnoughCapacity)
    assert ledger.claims == {}
