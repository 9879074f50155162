"""Deadlines: earliest first, one per key, cancel and replace."""

from hypothesis import given
from hypothesis import strategies as st

from resourced.core.clock import Deadlines, ManualClock


def test_due_gives_what_is_due_earliest_first_and_forgets_it():
    d = Deadlines()
    d.set("b", 20)
    d.set("a", 10)
    d.set("c", 30)
    assert d.next() == 10
    assert d.due(25) == ["a", "b"]
    assert d.due(25) == []
    assert len(d) == 1 and "c" in d and d.next() == 30


def test_a_key_set_again_moves_and_a_cancelled_key_never_comes():
    d = Deadlines()
    d.set("a", 10)
    d.set("a", 50)
    d.set("b", 20)
    d.cancel("b")
    assert d.due(40) == []
    assert d.due(50) == ["a"]
    assert d.next() is None


def test_a_manual_clock_moves_only_when_told():
    clock = ManualClock(1_000_000)
    assert clock() == 1_000_000
    clock.advance(1.5)
    assert clock() == 2_500_000


@given(st.lists(st.tuples(st.sampled_from("abcdef"), st.integers(0, 100), st.booleans())),
       st.integers(0, 100))
def test_deadlines_agree_with_a_plain_dict(ops, now):
    d, model = Deadlines(), {}
    for key, when, cancel in ops:
        if cancel:
            d.cancel(key)
            model.pop(key, None)
        else:
            d.set(key, when)
            model[key] = when
    expected = sorted((w, k) for k, w in model.items() if w <= now)
    assert sorted((model[k], k) for k in d.due(now)) == expected
    assert d.next() == min((w for w in model.values() if w > now), default=None)


def test_the_simulated_clock_reads_an_instant_with_its_zone_exactly():
    import pytest

    from resourced.protocol.time import parse_instant

    assert parse_instant("1970-01-01T00:00:01.5Z") == 1_500_000
    assert parse_instant("2026-12-01T10:00:00+01:00\n") == parse_instant("2026-12-01T09:00:00Z")
    with pytest.raises(ValueError, match="no zone"):
        parse_instant("2026-12-01T09:00:00")
    with pytest.raises(ValueError, match="ISO-8601"):
        parse_instant("tomorrow")
