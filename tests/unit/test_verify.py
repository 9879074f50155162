"""The verify statuses and the ledger's process bookkeeping (members, dead owners)."""

import pytest

from resourced.core.claims import ClaimRequest, Demand, ProcessRef
from resourced.core.inventory import Gpu
from resourced.core.ledger import ClaimReleased, Ledger, MembersChanged, OwnerDied
from resourced.core.verify import (
    FOREIGN_PROCESS,
    IDLE_CLAIM,
    MISSING,
    OK,
    OVERDUE,
    PROBLEMS,
    UNCLAIMED_USE,
    UNKNOWN,
    GpuReport,
    SeenProcess,
    verify,
)

OWNER = ProcessRef(4242, 1000)
WORKER = ProcessRef(4300, 1100)
HELPER = ProcessRef(4301, 1101)
NOW = 1_700_000_000_000_000
SECOND = 1_000_000
GIB = 1 << 30


def uuid(i: int) -> str:
    return f"GPU-{i:02d}"


@pytest.fixture
def ledger() -> Ledger:
    return Ledger([Gpu(index=i, uuid=uuid(i), name="Test GPU", memory_bytes=80 * GIB,
                       alias="big" if i == 3 else "")
                   for i in range(4)])


def grant(ledger: Ledger, claim_id: str, mode: str = "dev", gpus: int = 1, owner=OWNER,
          vram: int = 0, wait: bool = False):
    demand = Demand.of(0 if vram else gpus, vram)
    request = ClaimRequest(demand=demand, mode=mode, owner=owner, uid=1000, user="alice")
    _, refusal = ledger.submit(request, claim_id, NOW, wait=wait)
    assert refusal is None
    return ledger.get(claim_id)


def idle(ledger: Ledger) -> dict[str, list[SeenProcess]]:
    return {u: [] for u in ledger.gpus}


def statuses(reports: list[GpuReport]) -> dict[str, str]:
    return {r.alias: r.status for r in reports}


# -- the statuses -------------------------------------------------------------------------


def test_every_free_idle_gpu_is_ok_in_index_order(ledger):
    reports = verify(ledger, idle(ledger))
    assert reports == [GpuReport(uuid(i), f"gpu{i}" if i < 3 else "big", i, OK, "")
                       for i in range(4)]


def test_a_claimed_gpu_running_only_its_claimants_processes_is_ok(ledger):
    c = grant(ledger, "c1", gpus=2)
    seen = idle(ledger)
    mine = [SeenProcess(4242, 1 << 30, 1000, "alice", "python train.py", claim_id="c1"),
            SeenProcess(4300, 1 << 20, 1000, "alice", "python worker.py", claim_id="c1")]
    seen[c.gpus[0]] = mine
    seen[c.gpus[1]] = mine[1:]
    reports = verify(ledger, seen)
    assert statuses(reports) == {"gpu0": OK, "gpu1": OK, "gpu2": OK, "big": OK}
    assert reports[0].claim_id == "c1" and reports[0].processes == tuple(mine)
    assert reports[1].processes == tuple(mine[1:])


def test_a_claimed_gpu_with_nothing_running_is_an_idle_claim(ledger):
    grant(ledger, "c1")
    [first, *rest] = verify(ledger, idle(ledger))
    assert (first.status, first.claim_id, first.processes) == (IDLE_CLAIM, "c1", ())
    assert [r.status for r in rest] == [OK, OK, OK]


def test_a_process_on_a_gpu_nobody_claimed_is_unclaimed_use(ledger):
    seen = idle(ledger)
    stray = SeenProcess(777, 0, 1001, "bob", "python sneaky.py")
    seen[uuid(2)] = [stray]
    reports = verify(ledger, seen)
    assert statuses(reports)["gpu2"] == UNCLAIMED_USE
    assert reports[2].processes == (stray,) and reports[2].claim_id == ""


def test_a_process_of_another_claim_on_a_gpu_nobody_claimed_is_still_unclaimed_use(ledger):
    grant(ledger, "c1")
    seen = idle(ledger)
    seen[uuid(1)] = [SeenProcess(4242, claim_id="c1")]  # c1 holds gpu0, not gpu1
    assert statuses(verify(ledger, seen))["gpu1"] == UNCLAIMED_USE


@pytest.mark.parametrize("intruder", [
    SeenProcess(777, uid=1001, user="bob", command="python sneaky.py"),
    SeenProcess(778, claim_id="c2"),
    SeenProcess(779, ambiguous="runs in another pid namespace"),
    SeenProcess(780, ambiguous="not visible here: another pid namespace, or already gone"),
], ids=["no-claim", "other-claim", "nested-namespace", "invisible"])
def test_a_process_not_the_claimants_on_a_claimed_gpu_is_foreign(ledger, intruder):
    grant(ledger, "c1")
    grant(ledger, "c2")
    seen = idle(ledger)
    seen[uuid(0)] = [SeenProcess(4242, claim_id="c1"), intruder]
    reports = verify(ledger, seen)
    assert (reports[0].status, reports[0].claim_id) == (FOREIGN_PROCESS, "c1")
    assert reports[0].processes[1] == intruder


def test_an_ambiguous_process_alone_on_a_claimed_gpu_is_foreign(ledger):
    grant(ledger, "c1")
    seen = idle(ledger)
    seen[uuid(0)] = [SeenProcess(779, ambiguous="runs in another pid namespace")]
    assert verify(ledger, seen)[0].status == FOREIGN_PROCESS


# -- shared GPUs ----------------------------------------------------------------------------


def test_a_shared_gpu_names_every_sharing_claim_and_their_processes_are_not_foreign(ledger):
    grant(ledger, "sb", vram=10 * GIB)
    grant(ledger, "sa", vram=10 * GIB)
    seen = idle(ledger)
    seen[uuid(0)] = [SeenProcess(4242, claim_id="sb"), SeenProcess(4300, claim_id="sa")]
    reports = verify(ledger, seen)
    assert (reports[0].status, reports[0].claim_id) == (OK, "sa,sb")
    assert [r.status for r in reports[1:]] == [OK, OK, OK]


def test_a_shared_gpu_running_one_sharers_process_is_ok_and_with_none_is_idle(ledger):
    grant(ledger, "sa", vram=10 * GIB)
    grant(ledger, "sb", vram=10 * GIB)
    seen = idle(ledger)
    assert verify(ledger, seen)[0].status == IDLE_CLAIM
    seen[uuid(0)] = [SeenProcess(4242, claim_id="sb")]
    assert verify(ledger, seen)[0].status == OK


@pytest.mark.parametrize("intruder", [
    SeenProcess(777, uid=1001, user="bob", command="python sneaky.py"),
    SeenProcess(778, claim_id="whole"),
    SeenProcess(779, ambiguous="runs in another pid namespace"),
], ids=["no-claim", "claim-elsewhere", "nested-namespace"])
def test_a_process_of_no_sharing_claim_on_a_shared_gpu_is_foreign(ledger, intruder):
    grant(ledger, "sa", vram=10 * GIB)
    grant(ledger, "whole")
    seen = idle(ledger)
    seen[uuid(0)] = [SeenProcess(4242, claim_id="sa"), intruder]
    reports = verify(ledger, seen)
    assert (reports[0].status, reports[0].claim_id) == (FOREIGN_PROCESS, "sa")
    assert (reports[1].status, reports[1].claim_id) == (IDLE_CLAIM, "whole")


def test_a_queued_claim_is_on_no_gpu_and_its_processes_are_foreign_or_unclaimed(ledger):
    grant(ledger, "all", gpus=3)
    grant(ledger, "w", gpus=2, wait=True)
    seen = idle(ledger)
    seen[uuid(0)] = [SeenProcess(4242, claim_id="w")]
    seen[uuid(3)] = [SeenProcess(4243, claim_id="w")]
    reports = verify(ledger, seen)
    assert [(r.status, r.claim_id) for r in reports] == [
        (FOREIGN_PROCESS, "all"), (IDLE_CLAIM, "all"), (IDLE_CLAIM, "all"), (UNCLAIMED_USE, "")]


def test_every_sharer_is_named_when_the_driver_does_not_answer_or_the_gpu_is_missing(ledger):
    grant(ledger, "sa", vram=10 * GIB)
    grant(ledger, "sb", vram=10 * GIB)
    assert verify(ledger, None, "down")[0].claim_id == "sa,sb"
    seen = idle(ledger)
    del seen[uuid(0)]
    assert (verify(ledger, seen)[0].status, verify(ledger, seen)[0].claim_id) == (MISSING, "sa,sb")


def test_a_managed_gpu_the_driver_does_not_report_is_missing_and_keeps_its_claim(ledger):
    grant(ledger, "c1")
    seen = idle(ledger)
    del seen[uuid(0)], seen[uuid(3)]
    reports = verify(ledger, seen)
    assert [(r.alias, r.status, r.claim_id) for r in reports] == [
        ("gpu0", MISSING, "c1"), ("gpu1", OK, ""), ("gpu2", OK, ""), ("big", MISSING, "")]
    assert reports[0].detail and reports[0].processes == ()


def test_a_configured_gpu_that_is_absent_is_missing(ledger):
    reports = verify(ledger, idle(ledger), configured_missing=[("GPU-ghost", "ghost", 7)])
    assert reports[-1] == GpuReport("GPU-ghost", "ghost", 7, MISSING, "",
                                    detail="configured, but the driver does not report it")
    assert [r.status for r in reports[:-1]] == [OK] * 4


def test_every_gpu_is_unknown_with_the_reason_when_the_driver_did_not_answer(ledger):
    grant(ledger, "c1")
    reports = verify(ledger, None, "the GPU driver did not answer within 1 s",
                     configured_missing=[("GPU-ghost", "ghost", 7)])
    assert [(r.status, r.claim_id) for r in reports[:4]] == [
        (UNKNOWN, "c1"), (UNKNOWN, ""), (UNKNOWN, ""), (UNKNOWN, "")]
    assert all(r.detail == "the GPU driver did not answer within 1 s" for r in reports[:4])
    assert reports[4].status == MISSING


def test_processes_on_gpus_outside_the_inventory_are_ignored(ledger):
    seen = idle(ledger)
    seen["GPU-unmanaged"] = [SeenProcess(1)]
    assert [r.uuid for r in verify(ledger, seen)] == [uuid(i) for i in range(4)]


def test_problems_are_exactly_the_statuses_that_need_a_person():
    assert PROBLEMS == {UNCLAIMED_USE, FOREIGN_PROCESS, OVERDUE, MISSING, UNKNOWN}
    assert OK not in PROBLEMS and IDLE_CLAIM not in PROBLEMS


def test_an_empty_inventory_gives_no_reports():
    assert verify(Ledger([]), {}) == []
    assert verify(Ledger([]), None, "down") == []


# -- members ------------------------------------------------------------------------------


def test_add_members_records_new_processes_once(ledger):
    c = grant(ledger, "c1")
    assert ledger.add_members("c1", [WORKER]) == [MembersChanged(c)]
    assert c.members == {WORKER}
    assert ledger.add_members("c1", [WORKER]) == []          # nothing new
    assert ledger.add_members("c1", [OWNER]) == []           # the owner is not a member
    assert ledger.add_members("c1", [WORKER, HELPER]) == [MembersChanged(c)]
    assert c.members == {WORKER, HELPER}
    assert c.processes() == {OWNER, WORKER, HELPER}
    ledger.check_invariants()


def test_add_members_to_an_unknown_claim_does_nothing(ledger):
    assert ledger.add_members("nope", [WORKER]) == []


def test_member_exited_forgets_only_that_member(ledger):
    c = grant(ledger, "c1")
    ledger.add_members("c1", [WORKER, HELPER])
    assert ledger.member_exited("c1", WORKER) == [MembersChanged(c)]
    assert c.members == {HELPER}
    assert ledger.member_exited("c1", WORKER) == []          # already gone
    assert ledger.member_exited("c1", ProcessRef(4301, 5)) == []  # not this process
    assert ledger.member_exited("nope", HELPER) == []
    assert c.members == {HELPER}


def test_a_run_claim_stays_while_members_live_and_ends_with_the_last(ledger):
    c = grant(ledger, "r1", mode="run")
    ledger.add_members("r1", [WORKER, HELPER])

    assert ledger.owner_died("r1", NOW) == [OwnerDied(c)]
    assert "r1" in ledger.claims and not c.owner_alive
    assert c.processes() == {WORKER, HELPER}
    assert ledger.member_exited("r1", WORKER) == [MembersChanged(c)]
    assert "r1" in ledger.claims

    [released] = ledger.member_exited("r1", HELPER)
    assert released == ClaimReleased(c, "owner-exited")
    assert ledger.claims == {} and len(ledger.free_gpus()) == 4
    ledger.check_invariants()


def test_a_run_claim_whose_members_exit_before_the_owner_ends_with_the_owner(ledger):
    c = grant(ledger, "r1", mode="run")
    ledger.add_members("r1", [WORKER])
    assert ledger.member_exited("r1", WORKER) == [MembersChanged(c)]
    assert "r1" in ledger.claims   # the owner lives
    assert ledger.owner_died("r1", NOW) == [ClaimReleased(c, "owner-exited")]


def test_a_dev_claim_stays_after_its_owner_and_last_member_are_gone(ledger):
    c = grant(ledger, "d1")
    ledger.add_members("d1", [WORKER])
    assert ledger.owner_died("d1", NOW) == [OwnerDied(c)]
    assert c.owner_died_usec == NOW
    assert ledger.member_exited("d1", WORKER) == [MembersChanged(c)]
    assert "d1" in ledger.claims and c.processes() == frozenset()


# -- dead owners --------------------------------------------------------------------------


def test_dead_owner_claims_are_dev_claims_dead_for_at_least_the_grace(ledger):
    alive = grant(ledger, "alive")
    dev = grant(ledger, "dev")
    run = grant(ledger, "run", mode="run")
    ledger.add_members("run", [WORKER])  # keeps the run claim after its owner
    ledger.owner_died("dev", NOW)
    ledger.owner_died("run", NOW)
    grace = 10 * SECOND

    assert ledger.dead_owner_claims(NOW, grace) == []
    assert ledger.dead_owner_claims(NOW + grace - 1, grace) == []
    assert ledger.dead_owner_claims(NOW + grace, grace) == [dev]   # inclusive
    assert ledger.dead_owner_claims(NOW + 100 * grace, grace) == [dev]
    assert alive.owner_alive and not run.owner_alive


@pytest.mark.parametrize("grace", [0, -1])
def test_a_grace_of_zero_never_releases_a_dead_owners_claim(ledger, grace):
    grant(ledger, "dev")
    ledger.owner_died("dev", NOW)
    assert ledger.dead_owner_claims(NOW + 10**12, grace) == []


def test_a_dead_owners_shared_claim_is_due_like_a_whole_one(ledger):
    shared = grant(ledger, "shared", vram=GIB)
    ledger.owner_died("shared", NOW)
    assert ledger.dead_owner_claims(NOW + SECOND, SECOND) == [shared]


def test_dead_owner_claims_are_none_without_claims(ledger):
    assert ledger.dead_owner_claims(NOW, SECOND) == []
