"""Which claim a process belongs to, from process-table rows: no /proc, no clock."""

from hypothesis import given, settings
from hypothesis import strategies as st

from resourced.core.attribution import (
    Attribution,
    ProcInfo,
    attribute,
    claim_processes,
    descendants,
)
from resourced.core.claims import Claim, Demand, ProcessRef


def table(*rows: ProcInfo) -> dict[int, ProcInfo]:
    return {r.pid: r for r in rows}


def proc(pid: int, ppid: int, start: int | None = None, nested: bool = False) -> ProcInfo:
    return ProcInfo(pid=pid, ppid=ppid, start_time=pid * 10 if start is None else start,
                    uid=1000, nested_namespace=nested)


def ref(pid: int, start: int | None = None) -> ProcessRef:
    return ProcessRef(pid, pid * 10 if start is None else start)


def claim(claim_id: str, owner: ProcessRef, members=(), owner_alive=True, mode="dev") -> Claim:
    return Claim(id=claim_id, mode=mode, demand=Demand.of(gpus=1), owner=owner, uid=1000,
                 user="alice", label="", task_name="", created_usec=0, gpus=("GPU-0",),
                 owner_alive=owner_alive, members=frozenset(members))


# init(1) -> shell(10) -> python(11) -> worker(12), worker(13) -> grandchild(14); other(20)
TREE = table(proc(1, 0), proc(10, 1), proc(11, 10), proc(12, 11), proc(13, 11),
             proc(14, 13), proc(20, 1))


# -- descendants ------------------------------------------------------------------------


def test_descendants_are_every_process_below_the_root_but_not_the_root():
    assert descendants(TREE, [ref(11)]) == {ref(12), ref(13), ref(14)}
    assert descendants(TREE, [ref(10)]) == {ref(11), ref(12), ref(13), ref(14)}


def test_a_leaf_has_no_descendants():
    assert descendants(TREE, [ref(14)]) == set()


def test_descendants_of_several_roots_are_their_union():
    assert descendants(TREE, [ref(13), ref(1)]) == {ref(p) for p in (10, 11, 12, 13, 14, 20)}
    assert descendants(TREE, [ref(12), ref(13)]) == {ref(14)}


def test_no_roots_give_no_descendants():
    assert descendants(TREE, []) == set()


def test_a_root_that_is_gone_is_skipped():
    assert descendants(TREE, [ref(99)]) == set()


def test_a_root_whose_pid_was_reused_is_skipped():
    """pid 11 runs, but it is not the process the root names (another start time)."""
    assert descendants(TREE, [ref(11, start=5)]) == set()


def test_descendants_of_an_empty_table_are_none():
    assert descendants({}, [ref(1)]) == set()


# -- claim_processes ----------------------------------------------------------------------


def test_claim_processes_are_owners_and_members_by_claim():
    c1 = claim("c1", ref(11), members=[ref(13)])
    c2 = claim("c2", ref(20))
    assert claim_processes([c1, c2]) == {ref(11): ("c1",), ref(13): ("c1",), ref(20): ("c2",)}


def test_a_dead_owner_is_not_a_claim_process_but_its_members_are():
    c = claim("c1", ref(11), members=[ref(13), ref(14)], owner_alive=False)
    assert claim_processes([c]) == {ref(13): ("c1",), ref(14): ("c1",)}


def test_a_process_of_two_claims_is_listed_with_the_one_it_owns_first():
    outer = claim("outer", ref(11), members=[ref(12), ref(13)])  # a shell, and what it ran
    inner = claim("inner", ref(12), members=[ref(13)])  # its child, owning a claim of its own
    assert claim_processes([outer, inner]) == {
        ref(11): ("outer",), ref(12): ("inner", "outer"), ref(13): ("outer", "inner")}


def test_no_claims_have_no_processes():
    assert claim_processes([]) == {}


# -- attribute ----------------------------------------------------------------------------


def chain(tab: dict[int, ProcInfo], pid: int) -> list[ProcInfo]:
    """The process and its ancestors, as evidence.proctable.ancestry reads them from /proc."""
    found = []
    while pid in tab:
        found.append(tab[pid])
        pid = tab[pid].ppid
    return found


def who(tab, pid, *claims) -> Attribution:
    return attribute(chain(tab, pid), claim_processes(claims))


def test_a_process_of_two_claims_is_the_one_whose_gpu_it_runs_on():
    """The same attribution for verify and a release's check: a process that owns a claim
    below a shell that owns another is the first claim's on its GPUs, the shell's on the
    shell's, and the one it owns elsewhere."""
    tab = table(proc(1, 0), proc(11, 1), proc(12, 11), proc(13, 12))
    outer = claim("outer", ref(11), members=[ref(12), ref(13)])
    inner = claim("inner", ref(12), members=[ref(13)])
    owned = claim_processes([outer, inner])
    for pid in (12, 13):
        assert attribute(chain(tab, pid), owned, holders={"inner"}).claim_id == "inner"
        assert attribute(chain(tab, pid), owned, holders={"outer"}).claim_id == "outer"
    assert attribute(chain(tab, 12), owned).claim_id == "inner"  # the claim it owns
    assert attribute(chain(tab, 11), owned, holders={"inner"}).claim_id == "outer"


def test_the_owner_a_child_and_a_grandchild_are_attributed():
    c = claim("c1", ref(11))
    for pid in (11, 12, 14):
        assert who(TREE, pid, c) == Attribution(claim_id="c1")


def test_an_unrelated_process_is_attributed_to_no_claim_and_is_not_ambiguous():
    c = claim("c1", ref(11))
    assert who(TREE, 20, c) == Attribution()
    assert who(TREE, 10, c) == Attribution()  # the owner's parent is not the claim's
    assert who(TREE, 1, c) == Attribution()


def test_each_claim_gets_its_own_subtree_and_the_nearest_claim_wins():
    outer, inner = claim("outer", ref(11)), claim("inner", ref(13))
    assert who(TREE, 12, outer, inner).claim_id == "outer"
    assert who(TREE, 13, outer, inner).claim_id == "inner"
    assert who(TREE, 14, outer, inner).claim_id == "inner"  # the first claim up its chain


def test_a_reused_pid_is_not_attributed():
    """Same pid as the owner, another start time: another process, no claim."""
    reused = table(proc(1, 0), proc(11, 1, start=12345), proc(12, 11, start=12346))
    c = claim("c1", ref(11))
    assert who(reused, 11, c) == Attribution()
    assert who(reused, 12, c) == Attribution()


def test_a_reused_member_pid_is_not_attributed():
    after = table(proc(1, 0), proc(30, 1), proc(13, 1, start=777), proc(16, 13))
    c = claim("c1", ref(30), members=[ref(13)])
    assert who(after, 13, c) == Attribution()
    assert who(after, 16, c) == Attribution()


def test_a_process_that_is_not_visible_is_ambiguous():
    who_ = who(TREE, 4242, claim("c1", ref(11)))
    assert who_.claim_id == "" and "not visible" in who_.ambiguous
    assert attribute([], {}) == who_


def test_a_process_in_a_container_below_the_owner_is_the_claims():
    """Our table sees a container's real parents: below the owner is the claim's."""
    tab = table(proc(1, 0), proc(11, 1), proc(12, 11, nested=True), proc(13, 12, nested=True))
    assert who(tab, 13, claim("c1", ref(11))) == Attribution(claim_id="c1")


def test_a_process_in_a_container_elsewhere_is_ambiguous_unless_started_for_a_claim():
    tab = table(proc(1, 0), proc(11, 1), proc(30, 1), proc(31, 30, nested=True))
    c = claim("c1", ref(11))
    inside = chain(tab, 31)
    found = attribute(inside, claim_processes([c]))
    assert found.claim_id == "" and "namespace" in found.ambiguous
    assert attribute(inside, claim_processes([c]), started_for="c1") == Attribution(claim_id="c1")
    outside = attribute(chain(tab, 30), claim_processes([c]), started_for="c1")
    assert outside == Attribution()  # the environment counts only inside a container


def test_members_stay_the_claims_after_reparenting_to_init():
    """A worker adopted as a member keeps belonging once its parent exits (ppid 1)."""
    c = claim("c1", ref(11))
    c.members = frozenset(descendants(TREE, c.processes()))
    after = table(proc(1, 0), proc(10, 1), proc(11, 10), proc(13, 1), proc(14, 13),
                  proc(20, 1))  # 12 exited; 13 was re-parented to init
    assert who(after, 13, c) == Attribution(claim_id="c1")
    assert who(after, 14, c) == Attribution(claim_id="c1")
    assert who(after, 20, c) == Attribution()


def test_members_stay_the_claims_after_the_owner_died_too():
    c = claim("c1", ref(11), members=[ref(12)], owner_alive=False)
    after = table(proc(1, 0), proc(12, 1), proc(15, 12))
    assert who(after, 12, c).claim_id == "c1"
    assert who(after, 15, c).claim_id == "c1"  # started after the members were recorded


def test_a_dead_owners_pid_alone_attributes_nothing():
    c = claim("c1", ref(11), owner_alive=False)
    assert who(TREE, 11, c) == Attribution()
    assert who(TREE, 12, c) == Attribution()


# -- random process forests -------------------------------------------------------------


@st.composite
def forests(draw):
    """A process table in which every parent has a lower pid (pid 1 the only root), and
    a few pids chosen as claim processes."""
    n = draw(st.integers(1, 40))
    parents = [0] + [draw(st.integers(1, pid - 1)) for pid in range(2, n + 1)]
    tab = {pid: proc(pid, parents[pid - 1]) for pid in range(1, n + 1)}
    roots = draw(st.sets(st.integers(1, n), max_size=4))
    return tab, roots


def reference_descendants(tab, root_pids) -> set[ProcessRef]:
    """Descendants the slow way: walk each process's parents up to the top."""
    found = set()
    for info in tab.values():
        p = info.ppid
        while p in tab:
            if p in root_pids:
                found.add(info.ref)
                break
            p = tab[p].ppid
    return found


@settings(max_examples=200, deadline=None)
@given(forests())
def test_descendants_agree_with_walking_up_the_parents(forest):
    tab, roots = forest
    assert descendants(tab, [tab[p].ref for p in roots]) == reference_descendants(tab, roots)


@settings(max_examples=200, deadline=None)
@given(forests(), st.data())
def test_attribute_gives_the_claim_to_exactly_its_processes_and_their_descendants(forest, data):
    tab, roots = forest
    c = claim("c1", ref(10_000), members=[tab[p].ref for p in roots])
    inside = descendants(tab, c.processes()) | c.processes()
    for pid, info in tab.items():
        got = attribute(chain(tab, pid), claim_processes([c]))
        assert got.ambiguous == ""
        assert (got.claim_id == "c1") == (info.ref in inside)
    # The same pids with other start times (every pid reused) belong to nobody.
    reused = {pid: proc(pid, info.ppid, start=info.start_time + 1) for pid, info in tab.items()}
    pid = data.draw(st.sampled_from(sorted(tab)))
    assert attribute(chain(reused, pid), claim_processes([c])) == Attribution()
