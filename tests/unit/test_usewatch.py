"""No-show and idle reclamation decide on unbroken, known evidence only."""

from hypothesis import given
from hypothesis import strategies as st

from resourced.core.usewatch import UNKNOWN, UNUSED, USED, UseWatch

S = 1_000_000
HOUR = 3600 * S
BOOKING = (HOUR, True)   # a no-show window: once used, never due
IDLE = (HOUR, False)     # an idle window: use starts it again


def sweep(watch, what: str, at: int, window=BOOKING, claim="b1") -> list[str]:
    return watch.observe({claim: what}, at, {claim: window})


def test_a_booking_unused_for_its_whole_window_is_due_and_not_before():
    watch = UseWatch()
    assert sweep(watch, UNUSED, 0) == []
    assert sweep(watch, UNUSED, HOUR - S) == []
    assert sweep(watch, UNUSED, HOUR) == ["b1"]


def test_a_booking_once_used_is_never_a_no_show():
    watch = UseWatch()
    sweep(watch, UNUSED, 0)
    sweep(watch, USED, 60 * S)  # a process at 0 % is use all the same: the sweep says USED
    assert sweep(watch, UNUSED, 3 * HOUR) == []


def test_unknown_evidence_starts_the_window_again():
    watch = UseWatch()
    sweep(watch, UNUSED, 0)
    sweep(watch, UNKNOWN, HOUR - S)  # the driver did not answer, or a process in a container
    assert sweep(watch, UNUSED, HOUR + S) == []
    assert sweep(watch, UNUSED, 2 * HOUR - S) == ["b1"]


def test_an_idle_claim_counts_from_its_last_use():
    watch = UseWatch()
    sweep(watch, USED, 0, IDLE, "c1")
    assert sweep(watch, UNUSED, HOUR - S, IDLE, "c1") == []  # unused since HOUR - S only
    assert sweep(watch, UNUSED, 2 * HOUR - S, IDLE, "c1") == ["c1"]


def test_a_claim_no_longer_watched_is_forgotten():
    watch = UseWatch()
    sweep(watch, UNUSED, 0)
    assert watch.observe({}, HOUR // 2, {}) == []
    assert sweep(watch, UNUSED, HOUR) == []  # its window starts again at HOUR


@given(st.lists(st.tuples(st.sampled_from([USED, UNUSED, UNKNOWN]),
                          st.integers(0, 2 * HOUR)), max_size=30))
def test_due_only_after_a_window_of_unbroken_unused(steps):
    """Whatever the sweeps said, a claim is due only if every sweep of the last window
    (and the one opening it) said UNUSED, and for a booking none ever said USED."""
    watch, at, history = UseWatch(), 0, []
    for what, gap in steps:
        at += gap
        history.append((at, what))
        if sweep(watch, what, at) == ["b1"]:
            assert all(w != USED for _, w in history)
            opened = max((t for t, w in history if w != UNUSED), default=history[0][0])
            assert at - opened >= HOUR and history[-1][1] == UNUSED
