"""The calendar core: bookings admitted over their interval, changed, ended, on a clock."""

from dataclasses import replace

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from resourced.core.calendar import Blackout, BookingRequest, Calendar, Limits
from resourced.core.claims import Demand
from resourced.core.lifecycle import ACTIVE, ENDED, SCHEDULED
from resourced.core.timeline import Timeline
from resourced.errors import (
    InvalidArgs,
    NoSuchClaim,
    NotClaimOwner,
    NotEnoughCapacity,
    NotEnoughGPUs,
)

S = 1_000_000  # a second, in microseconds
H = 3600 * S
NOW = 1_800_000_000 * S
GPUS = {"g0": 16 << 30, "g1": 16 << 30, "g2": 80 << 30}
ALICE, BOB = 1000, 1001


def calendar(**limits) -> Calendar:
    return Calendar(Timeline(GPUS, {"cpu": 8}), Limits(**limits))


def ask(gpus=0, vram=0, hours=1, at=None, cpu=0, **kw) -> BookingRequest:
    return BookingRequest(Demand.of(gpus, vram, {"cpu": cpu} if cpu else None), hours * H,
                          None if at is None else NOW + int(at * H), **kw)


def book(cal, request, booking_id, uid=ALICE, op_id=""):
    booking, status, _ = cal.book(request, booking_id, uid, f"u{uid}", NOW, op_id)
    return booking, status


# -- admission -------------------------------------------------------------------------------


def test_an_exact_start_is_taken_exactly_or_refused_with_the_nearest_fit():
    cal = calendar()
    book(cal, ask(gpus=3, at=1, hours=2), "a")          # every GPU, 1h..3h from now
    b, _ = book(cal, ask(gpus=1, at=0, hours=1), "b")  # back to back before it: fits
    assert (b.start_usec, b.end_usec) == (NOW, NOW + H)
    with pytest.raises(NotEnoughCapacity, match="nearest start that fits: .* on g0") as info:
        book(cal, ask(gpus=1, at=2, hours=1), "c")
    assert "2027-01-15T11:00:00Z" in str(info.value)  # 3h from now, where "a" ends
    assert set(cal.bookings) == {"a", "b"}
    cal.check_invariants()


def test_without_a_start_it_takes_the_earliest_fit():
    cal = calendar()
    book(cal, ask(gpus=3, at=0, hours=2), "a")
    b, _ = book(cal, ask(gpus=2, hours=1), "b")
    assert b.start_usec == NOW + 2 * H and b.gpus == ("g0", "g1")


def test_shares_fit_beside_each_other_and_exclusive_takes_the_gpu_whole():
    cal = calendar()
    a, _ = book(cal, ask(vram=40 << 30, at=0), "a")
    b, _ = book(cal, ask(vram=40 << 30, at=0), "b")
    assert a.gpus == b.gpus == ("g2",) and a.share and b.share  # 80G holds both
    with pytest.raises(NotEnoughCapacity):
        book(cal, ask(vram=40 << 30, at=0, exclusive=True), "x")  # only g2 is big enough
    x, _ = book(cal, ask(vram=8 << 30, at=0, exclusive=True), "x")
    assert x.gpus == ("g0",) and not x.share
    with pytest.raises(NotEnoughCapacity):
        book(cal, ask(vram=1 << 30, at=0, named=(), excluded=("g1", "g2")), "y")


def test_named_and_excluded_gpus():
    cal = calendar()
    b, _ = book(cal, ask(gpus=2, at=0, named=("g0", "g2")), "b")
    assert b.gpus == ("g0", "g2")
    c, _ = book(cal, ask(gpus=1, at=0, excluded=("g0",)), "c")
    assert c.gpus == ("g1",)


@pytest.mark.parametrize("request_args, error, says", [
    (dict(gpus=1, at=-1), InvalidArgs, "in the past"),
    (dict(gpus=4, at=0), NotEnoughGPUs, "3 may be used"),  # as a claim of 4 is refused
    (dict(gpus=1, at=0, named=("g9",)), InvalidArgs, "no GPU 'g9'"),
    (dict(gpus=1, at=0, named=("g0",), excluded=("g0",)), InvalidArgs,
     "both wanted and excluded"),
    (dict(gpus=1, at=0, hours=200), InvalidArgs, "at most 7d"),
    (dict(gpus=1, at=24 * 40), InvalidArgs, "at most 30d ahead"),
    (dict(cpu=9, at=0), NotEnoughCapacity, "more cpu than the pool holds"),
])
def test_bad_requests_are_refused_and_change_nothing(request_args, error, says):
    cal = calendar()
    book(cal, ask(gpus=1, at=0), "a")
    with pytest.raises(error, match=says):
        book(cal, ask(**request_args), "b")
    assert set(cal.bookings) == {"a"}


@pytest.mark.parametrize("hours", [0, -1])
def test_a_booking_lasts_more_than_nothing(hours):
    with pytest.raises(InvalidArgs, match="more than 0"):
        ask(gpus=1, hours=hours)


def test_an_op_id_replays_the_first_answer_and_refuses_another_request_per_user():
    cal = calendar()
    first, status = book(cal, ask(gpus=1, at=0), "a", op_id="x1")
    assert status == "created"
    again, status = book(cal, ask(gpus=1, at=0), "b", op_id="x1")
    assert (again, status) == (first, "exists") and set(cal.bookings) == {"a"}
    with pytest.raises(InvalidArgs, match="used for another request"):
        book(cal, ask(gpus=2, at=0), "c", op_id="x1")
    other, status = book(cal, ask(gpus=1, at=0), "d", uid=BOB, op_id="x1")  # another user's
    assert status == "created" and other.id == "d"


# -- changes ---------------------------------------------------------------------------------


def test_an_edit_never_blocks_itself_and_is_readmitted():
    cal = calendar()
    book(cal, ask(gpus=3, at=0, hours=2), "a")
    moved, _ = cal.edit("a", ask(gpus=3, at=1, hours=2), ALICE, NOW)
    assert moved.start_usec == NOW + H
    with pytest.raises(NotClaimOwner):
        cal.edit("a", ask(gpus=1, at=0), BOB, NOW)
    cal.check_invariants()


def test_extend_on_the_added_part_only_and_shrink_down_to_now():
    cal = calendar()
    book(cal, ask(gpus=1, at=0, hours=1, named=("g0",)), "a")
    book(cal, ask(gpus=1, at=2, hours=1, named=("g0",)), "b")
    cal.due(NOW)
    a, _ = cal.set_end("a", NOW + 2 * H, ALICE, NOW)  # up to b: back to back is fine
    assert a.end_usec == NOW + 2 * H and a.state == ACTIVE
    with pytest.raises(NotEnoughCapacity, match="cannot be extended"):
        cal.set_end("a", NOW + 2 * H + 1, ALICE, NOW)
    with pytest.raises(InvalidArgs, match="after now"):
        cal.set_end("a", NOW, ALICE, NOW)
    a, _ = cal.set_end("a", NOW + 30 * 60 * S, ALICE, NOW + 10 * 60 * S)
    assert "g0" in cal.timeline.view(NOW + 30 * 60 * S, NOW + 2 * H).free
    cal.check_invariants()


def test_cancel_frees_at_once_and_someone_elses_needs_admin_and_a_reason():
    cal = calendar()
    book(cal, ask(gpus=3, at=0), "a")
    with pytest.raises(NotClaimOwner):
        cal.cancel("a", BOB, NOW)
    with pytest.raises(InvalidArgs, match="needs a reason"):
        cal.cancel("a", BOB, NOW, admin=True)
    gone, _ = cal.cancel("a", BOB, NOW, admin=True, reason="maintenance")
    assert (gone.state, gone.ended, gone.ended_by, gone.reason) == (ENDED, "cancelled", BOB,
                                                                      "maintenance")
    assert len(cal.timeline.view(NOW, NOW + H).free) == 3
    with pytest.raises(NoSuchClaim):
        cal.cancel("nope", ALICE, NOW)


# -- the clock, blackouts, history -------------------------------------------------------------


def test_due_starts_and_ends_bookings_on_the_clock_and_says_when_next():
    cal = calendar()
    book(cal, ask(gpus=1, at=1, hours=1), "a")
    events, nxt = cal.due(NOW)
    assert events == [] and nxt == NOW + H
    events, nxt = cal.due(NOW + H)
    assert [(e.what, e.booking.state) for e in events] == [("started", ACTIVE)] and nxt == NOW + 2 * H
    events, nxt = cal.due(NOW + 2 * H)
    assert [(e.what, e.booking.ended) for e in events] == [("ended", "expired")] and nxt is None
    assert cal.prune(NOW + 2 * H + 31 * 86400 * S) == ["a"]


def test_a_blackout_places_nothing_new_in_it_and_names_who_is_in_it():
    cal = calendar()
    book(cal, ask(gpus=1, at=1), "a")
    inside = cal.add_blackout(Blackout("m1", NOW + H, NOW + 3 * H, "driver update"))
    assert [b.id for b in inside] == ["a"]
    with pytest.raises(NotEnoughCapacity, match="blackout"):
        book(cal, ask(gpus=1, at=2), "b")
    b, _ = book(cal, ask(gpus=1, hours=2), "b")
    assert b.start_usec == NOW + 3 * H  # not before NOW + 1h..3h: it would touch the window
    cal.remove_blackout("m1")
    assert book(cal, ask(gpus=1, at=1), "c")[0].start_usec == NOW + H


def test_slots_lists_the_earliest_starts_without_changing_anything():
    cal = calendar()
    book(cal, ask(gpus=3, at=0, hours=1), "a")
    book(cal, ask(gpus=3, at=2, hours=1), "b")
    assert [s for s, _ in cal.slots(ask(gpus=3, hours=1), NOW)] == [NOW + H, NOW + 3 * H]
    assert set(cal.bookings) == {"a", "b"}


# -- random bookings, changes and cancels against the per-instant rule --------------------------


class CalendarMachine(RuleBasedStateMachine):
    """Capacity and exclusivity hold at every instant, whatever happens."""

    def __init__(self):
        super().__init__()
        self.cal = calendar(per_user=0)
        self.now = self.due_at = NOW
        self.n = 0

    def _ids(self):
        return sorted(self.cal.bookings)

    @rule(gpus=st.integers(0, 3), vram=st.sampled_from([0, 8 << 30, 40 << 30]),
          cpu=st.integers(0, 8), at=st.one_of(st.none(), st.integers(0, 12)),
          hours=st.integers(1, 4), exclusive=st.booleans())
    def book(self, gpus, vram, cpu, at, hours, exclusive):
        if vram:
            gpus = 0
        if not (gpus or vram or cpu):
            return
        self.n += 1
        request = ask(gpus, vram, hours, at, cpu, exclusive=exclusive)
        try:
            self.cal.book(request, f"b{self.n}", ALICE, "alice", self.now)
        except (NotEnoughCapacity, InvalidArgs):
            pass

    @precondition(lambda self: self.cal.bookings)
    @rule(data=st.data(), at=st.integers(0, 12))
    def move(self, data, at):
        booking = self.cal.bookings[data.draw(st.sampled_from(self._ids()))]
        if booking.state != SCHEDULED:
            return
        try:
            self.cal.edit(booking.id, replace(booking.request, start_usec=NOW + at * H), ALICE,
                          self.now)
        except (NotEnoughCapacity, InvalidArgs):
            pass

    @precondition(lambda self: self.cal.bookings)
    @rule(data=st.data(), hours=st.integers(-2, 3))
    def change_end(self, data, hours):
        booking = self.cal.bookings[data.draw(st.sampled_from(self._ids()))]
        try:
            self.cal.set_end(booking.id, booking.end_usec + hours * H, ALICE, self.now)
        except (NotEnoughCapacity, InvalidArgs):
            pass

    @precondition(lambda self: self.cal.bookings)
    @rule(data=st.data())
    def cancel(self, data):
        try:
            self.cal.cancel(data.draw(st.sampled_from(self._ids())), ALICE, self.now)
        except InvalidArgs:
            pass

    @rule(hours=st.integers(0, 3))
    def time_passes(self, hours):
        self.now += hours * H
        self.cal.due(self.now)
        self.due_at = self.now

    @invariant()
    def capacity_and_exclusivity_at_every_instant(self):
        self.cal.check_invariants()
        live = [b for b in self.cal.bookings.values() if b.state != ENDED]
        edges = sorted({b.start_usec for b in live} | {b.end_usec for b in live})
        for t in edges:
            here = [b for b in live if b.start_usec <= t < b.end_usec]
            for uuid, memory in GPUS.items():
                on = [b for b in here if uuid in b.gpus]
                whole = [b for b in on if not b.share]
                assert len(whole) <= 1 and (not whole or len(on) == 1), (t, uuid, on)
                assert sum(b.request.demand.vram for b in on if b.share) <= memory
            assert sum(dict(b.request.demand.pools).get("cpu", 0) for b in here) <= 8

    @invariant()
    def states_follow_the_clock(self):
        for b in self.cal.bookings.values():
            if b.state == SCHEDULED:
                assert b.start_usec >= self.due_at, b  # else the last due() started it
            if b.state == ACTIVE:
                assert b.start_usec <= self.due_at < b.end_usec, b


CalendarMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=25,
                                             deadline=None)
TestCalendar = CalendarMachine.TestCase
