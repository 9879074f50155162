"""The ledger and claim requests, driven directly: no bus, no clock, no processes."""

import dataclasses

import pytest

from resourced.core.claims import MODES, Claim, ClaimRequest, ProcessRef
from resourced.core.inventory import Gpu
from resourced.core.ledger import ClaimGranted, ClaimReleased, Ledger, OwnerDied
from resourced.errors import GPUsBusy, InvalidRequest, NoSuchClaim, NotEnoughGPUs

OWNER = ProcessRef(pid=4242, start_time=1000)
NOW = 1_700_000_000_000_000


def uuid(i: int) -> str:
    return f"GPU-{i:02d}"


def inventory(n: int) -> list[Gpu]:
    return [Gpu(index=i, uuid=uuid(i), name="Test GPU", pci_bus_id=f"0:{i}") for i in range(n)]


def request(gpus: int = 1, mode: str = "run", uid: int = 1000) -> ClaimRequest:
    return ClaimRequest(gpus=gpus, mode=mode, owner=OWNER, uid=uid, user="alice",
                        label="lbl", task_name="task")


def state(ledger: Ledger) -> dict:
    """Everything observable about a ledger, deep-copied so later mutation cannot hide."""
    return {
        "claims": {cid: dataclasses.asdict(c) for cid, c in ledger.claims.items()},
        "holders": {u: (h.id if (h := ledger.holder(u)) else None) for u in ledger.gpus},
        "free": [g.uuid for g in ledger.free_gpus()],
    }


@pytest.fixture
def ledger() -> Ledger:
    return Ledger(inventory(4))


# -- construction and queries ------------------------------------------------------------


def test_new_ledger_has_every_gpu_free_in_index_order():
    gpus = inventory(4)
    ledger = Ledger([gpus[2], gpus[0], gpus[3], gpus[1]])
    assert ledger.free_gpus() == gpus
    assert ledger.claims == {}
    assert all(ledger.holder(g.uuid) is None for g in gpus)
    ledger.check_invariants()


def test_empty_ledger_refuses_every_request():
    ledger = Ledger([])
    with pytest.raises(NotEnoughGPUs):
        ledger.grant(request(1), "c1", NOW)
    assert state(ledger) == {"claims": {}, "holders": {}, "free": []}
    ledger.check_invariants()


def test_holder_of_unknown_gpu_is_none(ledger):
    assert ledger.holder("GPU-nope") is None


@pytest.mark.parametrize("name", [uuid(2), "gpu2", "2"])
def test_gpu_by_name_accepts_uuid_label_and_index(ledger, name):
    assert ledger.gpu_by_name(name) == inventory(4)[2]


def test_gpu_by_name_accepts_alias():
    ledger = Ledger([Gpu(index=0, uuid="GPU-a", alias="big"), Gpu(index=1, uuid="GPU-b")])
    assert ledger.gpu_by_name("big").uuid == "GPU-a"
    assert ledger.gpu_by_name("gpu1").uuid == "GPU-b"


@pytest.mark.parametrize("name", ["gpu9", "9", "GPU-nope", "", "gpu"])
def test_gpu_by_name_unknown_is_invalid_request(ledger, name):
    with pytest.raises(InvalidRequest):
        ledger.gpu_by_name(name)


def test_get_unknown_claim_raises_no_such_claim(ledger):
    with pytest.raises(NoSuchClaim):
        ledger.get("c-nope")


# -- grant -------------------------------------------------------------------------------


def test_grant_takes_lowest_indices_first_and_records_the_claim(ledger):
    events = ledger.grant(request(2, "dev"), "c1", NOW)

    claim = Claim(id="c1", mode="dev", gpus=(uuid(0), uuid(1)), owner=OWNER, uid=1000,
                  user="alice", label="lbl", task_name="task", created_usec=NOW,
                  owner_alive=True)
    assert events == [ClaimGranted(claim)]
    assert type(events[0]) is ClaimGranted
    assert events[0].claim is ledger.get("c1")
    assert state(ledger) == {
        "claims": {"c1": dataclasses.asdict(claim)},
        "holders": {uuid(0): "c1", uuid(1): "c1", uuid(2): None, uuid(3): None},
        "free": [uuid(2), uuid(3)],
    }
    ledger.check_invariants()


def test_second_grant_gets_the_next_free_gpus(ledger):
    ledger.grant(request(1), "c1", NOW)
    ledger.grant(request(2), "c2", NOW)
    ledger.release("c1")
    [event] = ledger.grant(request(2), "c3", NOW)
    assert event.claim.gpus == (uuid(0), uuid(3))
    ledger.check_invariants()


def test_grant_of_every_gpu_then_one_more_is_refused(ledger):
    ledger.grant(request(4), "c1", NOW)
    assert ledger.free_gpus() == []
    with pytest.raises(NotEnoughGPUs):
        ledger.grant(request(1), "c2", NOW)


def test_grant_skips_busy_gpus_in_favour_of_others(ledger):
    [event] = ledger.grant(request(2), "c1", NOW, busy=frozenset({uuid(0), uuid(2)}))
    assert event.claim.gpus == (uuid(1), uuid(3))
    assert [g.uuid for g in ledger.free_gpus()] == [uuid(0), uuid(2)]
    ledger.check_invariants()


def test_busy_gpus_that_are_already_held_do_not_block_a_grant(ledger):
    ledger.grant(request(2, "dev"), "c0", NOW)
    [event] = ledger.grant(request(2), "c1", NOW, busy=frozenset({uuid(0), uuid(1)}))
    assert event.claim.gpus == (uuid(2), uuid(3))


def test_busy_uuids_outside_the_inventory_are_ignored(ledger):
    [event] = ledger.grant(request(4), "c1", NOW, busy=frozenset({"GPU-elsewhere"}))
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
        ledger.grant(request(held, "dev"), "c0", NOW)
    before = state(ledger)

    with pytest.raises(error):
        ledger.grant(request(wanted), "c1", NOW + 1, busy=frozenset(uuid(i) for i in busy))

    assert state(ledger) == before
    ledger.check_invariants()


def test_refusals_are_not_each_other():
    assert not issubclass(GPUsBusy, NotEnoughGPUs)
    assert not issubclass(NotEnoughGPUs, GPUsBusy)


def test_taken_claim_id_is_invalid_request_and_changes_nothing(ledger):
    ledger.grant(request(1), "c1", NOW)
    before = state(ledger)
    with pytest.raises(InvalidRequest):
        ledger.grant(request(1), "c1", NOW + 1)
    assert state(ledger) == before


# -- release -----------------------------------------------------------------------------


def test_release_frees_the_gpus_and_returns_the_claim(ledger):
    [granted] = ledger.grant(request(2), "c1", NOW)
    events = ledger.release("c1")
    assert events == [ClaimReleased(granted.claim, "released")]
    assert type(events[0]) is ClaimReleased
    assert state(ledger) == {
        "claims": {},
        "holders": {uuid(i): None for i in range(4)},
        "free": [uuid(i) for i in range(4)],
    }
    ledger.check_invariants()


def test_release_carries_the_given_reason(ledger):
    ledger.grant(request(1), "c1", NOW)
    [event] = ledger.release("c1", "forced")
    assert event.reason == "forced"


def test_release_leaves_other_claims_alone(ledger):
    ledger.grant(request(1), "c1", NOW)
    ledger.grant(request(2, "dev"), "c2", NOW)
    ledger.release("c1")
    assert list(ledger.claims) == ["c2"]
    assert [g.uuid for g in ledger.free_gpus()] == [uuid(0), uuid(3)]
    ledger.check_invariants()


@pytest.mark.parametrize("claim_id", ["c-never", "", "c1"])
def test_release_of_unknown_id_raises_no_such_claim_and_changes_nothing(ledger, claim_id):
    ledger.grant(request(1), "c2", NOW)
    before = state(ledger)
    with pytest.raises(NoSuchClaim):
        ledger.release(claim_id)
    assert state(ledger) == before


def test_release_twice_raises_no_such_claim(ledger):
    ledger.grant(request(1), "c1", NOW)
    ledger.release("c1")
    before = state(ledger)
    with pytest.raises(NoSuchClaim):
        ledger.release("c1")
    assert state(ledger) == before


# -- owner death -------------------------------------------------------------------------


def test_owner_died_releases_a_run_claim(ledger):
    [granted] = ledger.grant(request(2, "run"), "c1", NOW)
    events = ledger.owner_died("c1")
    assert events == [ClaimReleased(granted.claim, "owner-exited")]
    assert type(events[0]) is ClaimReleased
    assert ledger.claims == {}
    assert len(ledger.free_gpus()) == 4
    ledger.check_invariants()


def test_owner_died_marks_a_dev_claim_dead_and_keeps_it(ledger):
    ledger.grant(request(2, "dev"), "c1", NOW)
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
    ledger.grant(request(1, "dev"), "c1", NOW)
    ledger.owner_died("c1")
    [event] = ledger.release("c1")
    assert (event.claim.id, event.reason, event.claim.owner_alive) == ("c1", "released", False)
    assert len(ledger.free_gpus()) == 4


@pytest.mark.parametrize("mode", MODES)
def test_owner_died_twice_yields_no_more_events(ledger, mode):
    ledger.grant(request(1, mode), "c1", NOW)
    assert len(ledger.owner_died("c1")) == 1
    before = state(ledger)
    assert ledger.owner_died("c1") == []
    assert state(ledger) == before


def test_owner_died_of_unknown_claim_yields_nothing(ledger):
    ledger.grant(request(1), "c1", NOW)
    before = state(ledger)
    assert ledger.owner_died("c-nope") == []
    assert state(ledger) == before


def test_events_are_frozen(ledger):
    [event] = ledger.grant(request(1), "c1", NOW)
    with pytest.raises(dataclasses.FrozenInstanceError):
        event.claim = None


# -- the invariant checker catches what it should ------------------------------------------


def test_check_invariants_catches_a_gpu_held_twice(ledger):
    ledger.grant(request(1), "c1", NOW)
    ledger.claims["c2"] = dataclasses.replace(ledger.get("c1"), id="c2")
    with pytest.raises(AssertionError):
        ledger.check_invariants()


def test_check_invariants_catches_an_unknown_gpu(ledger):
    ledger.grant(request(1), "c1", NOW)
    ledger.claims["c1"] = dataclasses.replace(ledger.get("c1"), gpus=("GPU-ghost",))
    with pytest.raises(AssertionError):
        ledger.check_invariants()


def test_check_invariants_catches_an_empty_claim(ledger):
    ledger.grant(request(1), "c1", NOW)
    ledger.claims["c2"] = dataclasses.replace(ledger.get("c1"), id="c2", gpus=())
    with pytest.raises(AssertionError):
        ledger.check_invariants()


# -- claim requests ----------------------------------------------------------------------


def test_modes_are_run_and_dev():
    assert MODES == ("run", "dev")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("gpus", [1, 2, 64])
def test_valid_request_is_accepted_as_given(mode, gpus):
    r = ClaimRequest(gpus=gpus, mode=mode, owner=OWNER, uid=0)
    assert (r.gpus, r.mode, r.owner, r.uid, r.user, r.label, r.task_name) == (
        gpus, mode, OWNER, 0, "", "", "")


@pytest.mark.parametrize("mode", ["", "RUN", "booking", "run ", "exclusive"])
def test_unknown_mode_is_invalid_request(mode):
    with pytest.raises(InvalidRequest, match="mode"):
        ClaimRequest(gpus=1, mode=mode, owner=OWNER, uid=0)


@pytest.mark.parametrize("gpus", [0, -1, -100])
def test_fewer_than_one_gpu_is_invalid_request(gpus):
    with pytest.raises(InvalidRequest, match="at least 1"):
        ClaimRequest(gpus=gpus, mode="run", owner=OWNER, uid=0)


def test_request_and_process_ref_are_frozen():
    r = request()
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.gpus = 0
    with pytest.raises(dataclasses.FrozenInstanceError):
        OWNER.pid = 1
