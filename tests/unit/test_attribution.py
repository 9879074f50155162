"""Which claim a process belongs to, from a process-table snapshot: no /proc, no clock."""

from hypothesis import given, settings
from hypothesis import strategies as st

from resourced.core.attribution import (
    Attribution, ProcInfo, attribute, descendants, owners_by_process,
)
from resourced.core.claims import Claim, ProcessRef


def table(*rows: ProcInfo) -> dict[int, ProcInfo]:
    return {r.pid: r for r in rows}


def proc(pid: int, ppid: int, start: int | None = None, nested: bool = False) -> ProcInfo:
    return ProcInfo(pid=pid, ppid=ppid, start_time=pid * 10 if start is None else start,
                    uid=1000, nested_namespace=nested)


def ref(pid: int, start: int | None = None) -> ProcessRef:
    return ProcessRef(pid, pid * 10 if start is None else start)


def claim(claim_id: str, owner: ProcessRef, members=(), owner_alive=True, mode="dev") -> Claim:
    return Claim(id=claim_id, mode=mode, gpus=("GPU-0",), owner=owner, uid=1000, user="alice",
                 label="", task_name="", created_usec=0, owner_alive=owner_alive,
                 members=frozenset(members))


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


# -- owners_by_process ------------------------------------------------------------------


def test_owner_and_its_descendants_belong_to_the_claim():
    owned = owners_by_process(TREE, [claim("c1", ref(11))])
    assert owned == {ref(p): "c1" for p in (11, 12, 13, 14)}


def test_each_claim_owns_its_own_subtree():
    owned = owners_by_process(TREE, [claim("c1", ref(12)), claim("c2", ref(13))])
    assert owned == {ref(12): "c1", ref(13): "c2", ref(14): "c2"}


def test_a_dead_owner_owns_nothing_but_its_members_still_do():
    # The owner's pid 11 now names another process (reused): nothing follows from it.
    after = table(proc(1, 0), proc(11, 1, start=999), proc(12, 1), proc(13, 1), proc(14, 13))
    c = claim("c1", ref(11), members=[ref(13)], owner_alive=False)
    assert owners_by_process(after, [c]) == {ref(13): "c1", ref(14): "c1"}


def test_no_claims_own_nothing():
    assert owners_by_process(TREE, []) == {}


def test_members_and_their_descendants_belong_to_the_claim():
    c = claim("c1", ref(20), members=[ref(13)])
    assert owners_by_process(TREE, [c]) == {ref(20): "c1", ref(13): "c1", ref(14): "c1"}


# -- attribute --------------------------------------------------------------------------


def owned_by(tab, *claims):
    return owners_by_process(tab, claims)


def test_the_owner_a_child_and_a_grandchild_are_attributed():
    owned = owned_by(TREE, claim("c1", ref(11)))
    for pid in (11, 12, 14):
        assert attribute(pid, TREE, owned) == Attribution(claim_id="c1")


def test_an_unrelated_process_is_attributed_to_no_claim_and_is_not_ambiguous():
    owned = owned_by(TREE, claim("c1", ref(11)))
    assert attribute(20, TREE, owned) == Attribution()
    assert attribute(10, TREE, owned) == Attribution()  # the owner's parent is not the claim's


def test_a_reused_pid_is_not_attributed():
    """Same pid as the owner, another start time: another process, no claim."""
    reused = table(proc(1, 0), proc(11, 1, start=12345), proc(12, 11, start=12346))
    owned = owned_by(reused, claim("c1", ref(11)))
    assert attribute(11, reused, owned) == Attribution()
    assert attribute(12, reused, owned) == Attribution()


def test_a_reused_member_pid_is_not_attributed():
    after = table(proc(1, 0), proc(30, 1), proc(13, 1, start=777))
    owned = owned_by(after, claim("c1", ref(30), members=[ref(13)]))
    assert attribute(13, after, owned) == Attribution()


def test_a_pid_missing_from_the_table_is_ambiguous():
    owned = owned_by(TREE, claim("c1", ref(11)))
    who = attribute(4242, TREE, owned)
    assert who.claim_id == "" and "not visible" in who.ambiguous


def test_a_process_in_a_nested_pid_namespace_is_ambiguous_even_below_the_owner():
    tab = table(proc(1, 0), proc(11, 1), proc(12, 11, nested=True))
    owned = owned_by(tab, claim("c1", ref(11)))
    who = attribute(12, tab, owned)
    assert who.claim_id == "" and "namespace" in who.ambiguous


def test_members_stay_the_claims_after_reparenting_to_init():
    """A worker adopted as a member keeps belonging once its parent exits (ppid 1)."""
    before = TREE
    c = claim("c1", ref(11))
    c.members = frozenset(descendants(before, c.processes()))
    after = table(proc(1, 0), proc(11, 10), proc(13, 1), proc(14, 13), proc(20, 1))  # 12 exited
    owned = owned_by(after, c)
    assert attribute(13, after, owned) == Attribution(claim_id="c1")
    assert attribute(14, after, owned) == Attribution(claim_id="c1")
    assert attribute(20, after, owned) == Attribution()


def test_members_stay_the_claims_after_the_owner_died_too():
    c = claim("c1", ref(11), members=[ref(12)], owner_alive=False)
    after = table(proc(1, 0), proc(12, 1), proc(15, 12))
    owned = owned_by(after, c)
    assert attribute(12, after, owned).claim_id == "c1"
    assert attribute(15, after, owned).claim_id == "c1"


def test_a_process_new_since_the_members_were_recorded_but_below_one_is_attributed():
    c = claim("c1", ref(11), members=[ref(13)], owner_alive=False)
    after = table(proc(1, 0), proc(13, 1), proc(16, 13))
    assert attribute(16, after, owned_by(after, c)).claim_id == "c1"


# -- random process forests -------------------------------------------------------------


@st.composite
def forests(draw):
    """A process table in which every parent has a lower pid (pid 1 the only root), and
    a few pids chosen as claim roots."""
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
def test_attribute_gives_the_claim_to_exactly_its_roots_and_their_subtrees(forest, data):
    tab, roots = forest
    c = claim("c1", ref(min(roots)) if roots else ref(10_000),
              members=[tab[p].ref for p in roots])
    owned = owners_by_process(tab, [c])
    inside = reference_descendants(tab, roots) | {tab[p].ref for p in roots}
    for pid, info in tab.items():
        who = attribute(pid, tab, owned)
        assert who.ambiguous == ""
        assert (who.claim_id == "c1") == (info.ref in inside)
    # The same pids with other start times (every pid reused) belong to nobody.
    reused = {pid: proc(pid, info.ppid, start=info.start_time + 1) for pid, info in tab.items()}
    owned = owners_by_process(reused, [c])
    pid = data.draw(st.sampled_from(sorted(tab)))
    assert attribute(pid, reused, owned) == Attribution()
