"""The timeline against a plain per-instant model: what is free throughout an interval,
capacity at every instant, half-open edges, and earliest fit being the earliest."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from resourced.core.claims import Demand
from resourced.core.timeline import Hold, Timeline

GPUS = {"g0": 16, "g1": 16, "g2": 32}
POOLS = {"cpu": 8}
HORIZON = 200  # past every start and end any test makes, nothing changes any more


def timeline(*holds: Hold) -> Timeline:
    t = Timeline(GPUS, POOLS)
    for h in holds:
        t.add(h)
    return t


# -- a plain model: every instant on its own ----------------------------------------------


def instants(start: int, end: int | None) -> range:
    return range(start, HORIZON if end is None else end)


def at(holds, t: int) -> list[Hold]:
    return [h for h in holds if h.start <= t and (h.end is None or t < h.end)]


def model_view(holds, start: int, end: int | None) -> tuple[list, dict, dict]:
    free, vram = [], {}
    for uuid, memory in GPUS.items():
        on = [[h for h in at(holds, t) if uuid in h.gpus()] for t in instants(start, end)]
        if not any(on):
            free.append(uuid)
            vram[uuid] = memory
        elif not any(h.whole for hs in on for h in hs):
            vram[uuid] = memory - max(sum(h.vram for h in hs) for hs in on)
    pools = {name: cap - max(sum(dict(h.pools).get(name, 0) for h in at(holds, t))
                             for t in instants(start, end))
             for name, cap in POOLS.items()}
    return free, vram, pools


def model_fits(holds, demand: Demand, start: int, end: int | None) -> bool:
    free, vram, pools = model_view(holds, start, end)
    return (len(free) >= demand.gpus
            and all(pools[n] >= a for n, a in demand.pools)
            and (not demand.vram or any(v >= demand.vram for v in vram.values())))


# -- strategies ------------------------------------------------------------------------------


@st.composite
def holds(draw, n=st.integers(0, 6)):
    out = []
    for i in range(draw(n)):
        start = draw(st.integers(0, 29))
        end = draw(st.one_of(st.none(), st.integers(start + 1, 35)))
        kind = draw(st.sampled_from(["whole", "share", "pool"]))
        pools = (("cpu", draw(st.integers(1, 8))),) if draw(st.booleans()) else ()
        if kind == "whole":
            gpus = tuple(sorted(draw(st.sets(st.sampled_from(sorted(GPUS)), min_size=1))))
            out.append(Hold(f"h{i}", start, end, whole=gpus, pools=pools))
        elif kind == "share":
            out.append(Hold(f"h{i}", start, end, share=draw(st.sampled_from(sorted(GPUS))),
                            vram=draw(st.integers(1, 16)), pools=pools))
        else:
            out.append(Hold(f"h{i}", start, end, pools=pools or (("cpu", 1),)))
    return out


demands = st.one_of(
    st.builds(lambda n, c: Demand.of(gpus=n, pools={"cpu": c} if c else None),
              st.integers(1, 3), st.integers(0, 4)),
    st.builds(lambda v: Demand.of(vram=v), st.integers(1, 32)),
    st.builds(lambda c: Demand.of(pools={"cpu": c}), st.integers(1, 8)),
)


# -- the view ----------------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(holds(), st.integers(0, 35), st.one_of(st.none(), st.integers(1, 10)))
def test_the_view_is_what_is_free_at_every_instant_of_the_interval(hs, start, length):
    end = None if length is None else start + length
    view = timeline(*hs).view(start, end)
    assert (view.free, view.vram, view.pools) == model_view(hs, start, end)


def test_back_to_back_is_no_overlap():
    t = timeline(Hold("a", 0, 10, whole=("g0",)), Hold("b", 20, 30, whole=("g0",)))
    assert "g0" in t.view(10, 20).free
    assert "g0" not in t.view(9, 20).free and "g0" not in t.view(10, 21).free


def test_an_open_ended_hold_holds_for_good():
    t = timeline(Hold("claim", 5, None, whole=("g0", "g1", "g2")))
    assert t.view(0, 5).free == ["g0", "g1", "g2"]
    assert t.view(1_000_000, 1_000_001).free == []
    assert t.earliest(Demand.of(gpus=1), 5, 0) == (0, ("g0",), "")
    assert t.earliest(Demand.of(gpus=1), 6, 0) is None


def test_shares_peak_not_sum_over_the_interval():
    t = timeline(Hold("a", 0, 10, share="g2", vram=20), Hold("b", 10, 20, share="g2", vram=20))
    assert t.view(0, 20).vram["g2"] == 12  # never both at once
    assert t.view(5, 15).vram["g2"] == 12


def test_an_ignored_hold_is_as_if_gone_and_allowed_limits_the_gpus():
    t = timeline(Hold("a", 0, 10, whole=("g0",)))
    assert "g0" in t.view(0, 10, ignore=frozenset({"a"})).free
    assert t.view(0, 10, allowed=frozenset({"g1"})).free == ["g1"]


def test_an_empty_or_backward_hold_is_refused():
    with pytest.raises(ValueError):
        Hold("x", 5, 5)


# -- admission, as the calendar will do it -------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(demands, st.integers(0, 25), st.one_of(st.none(), st.integers(1, 10))),
                max_size=12))
def test_admitting_at_the_earliest_fit_keeps_capacity_and_is_the_earliest(requests):
    t = Timeline(GPUS, POOLS)
    for i, (demand, not_before, duration) in enumerate(requests):
        found = t.earliest(demand, duration, not_before)
        hs = list(t.holds.values())
        # No earlier instant fits, in the model.
        settled = max([not_before, *(h.end for h in hs if h.end is not None)]) + 1
        stop = settled if found is None else found[0]  # past the last end nothing changes
        for s in range(not_before, stop):
            assert not model_fits(hs, demand, s, None if duration is None else s + duration)
        if found is None:
            continue
        start, whole, share = found
        end = None if duration is None else start + duration
        assert model_fits(hs, demand, start, end)
        t.add(Hold(f"b{i}", start, end, whole=whole, share=share, vram=demand.vram,
                   pools=demand.pools))
        t.check_invariants()


def test_check_invariants_finds_a_gpu_held_twice():
    t = timeline(Hold("a", 0, 10, whole=("g0",)), Hold("b", 5, 15, whole=("g0",)))
    with pytest.raises(AssertionError, match="g0"):
        t.check_invariants()


def test_check_invariants_finds_a_pool_over_capacity_at_one_instant():
    t = timeline(Hold("a", 0, 10, pools=(("cpu", 5),)), Hold("b", 9, 15, pools=(("cpu", 4),)))
    with pytest.raises(AssertionError, match="cpu"):
        t.check_invariants()
    t.remove("b")
    t.add(Hold("b", 10, 15, pools=(("cpu", 4),)))
    t.check_invariants()
