"""Claims over time: every granted claim is a hold on the calendar's timeline, until its own
end or the start of the next booking that needs what it holds, so nothing is held twice at
any instant.

The ledger and the calendar share one timeline; the tests play the engine's part by hand
(``Engine`` below): a booking that comes due starts a claim of its own, one that ends
releases it, a claim past its ``until_usec`` is made overdue (booked) or expires (its own
end), the holder of an overdue claim gives it back, and claims are refreshed after bookings
move or go away.  Direct tests pin each rule; a state machine drives them all at random
on a clock that only moves forward and checks capacity and exclusivity at every instant.
"""

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from resourced.core.calendar import BookingRequest, Calendar, Limits
from resourced.core.claims import BOOKING, ClaimRequest, Demand, ProcessRef
from resourced.core.inventory import Gpu
from resourced.core.ledger import (
    ClaimGranted,
    ClaimQueued,
    ClaimReleased,
    Ledger,
    ReclaimAsked,
    UntilChanged,
)
from resourced.core.lifecycle import ACTIVE, ENDED, GRANTED, SCHEDULED
from resourced.core.pools import Pool
from resourced.core.timeline import Hold
from resourced.errors import InvalidArgs, NotEnoughCapacity, ResourcedError

S = 1_000_000  # a second, in microseconds
M = 60 * S
H = 60 * M
NOW = 1_800_000_000 * S
GIB = 1 << 30
CPU = 8
ALICE = 1000


def uuid(i: int) -> str:
    return f"GPU-{i:02d}"


def ledger_and_calendar(n: int = 2, memory: list[int] | None = None) -> tuple[Ledger, Calendar]:
    """A ledger with ``n`` GPUs (16G each unless told) and a pool ``cpu`` of 8, and a
    calendar booking on its timeline."""
    memory = memory or [16 * GIB] * n
    gpus = [Gpu(index=i, uuid=uuid(i), name="Test GPU", memory_bytes=m, pci_bus_id=f"0:{i}")
            for i, m in enumerate(memory)]
    ledger = Ledger(gpus, [Pool("cpu", CPU)])
    return ledger, Calendar(ledger.timeline, Limits(per_user=0))


def demand(gpus: int = 0, vram: int = 0, cpu: int = 0) -> Demand:
    return Demand.of(gpus, vram, {"cpu": cpu} if cpu else None)


def claim_request(gpus: int = 0, vram: int = 0, cpu: int = 0, end: int = 0,
                  reclaimable: bool = False, pid: int = 4242) -> ClaimRequest:
    return ClaimRequest(demand=demand(gpus, vram, cpu), mode="dev", owner=ProcessRef(pid, 1),
                        uid=ALICE, user="alice", end_usec=end, reclaimable=reclaimable)


def booking_request(gpus: int = 0, vram: int = 0, cpu: int = 0, at: int | None = None,
                    duration: int = H, **kw) -> BookingRequest:
    """``at``: the start, in microseconds after NOW (None: the earliest fit)."""
    return BookingRequest(demand(gpus, vram, cpu), duration, None if at is None else NOW + at,
                          **kw)


def grant(ledger: Ledger, req: ClaimRequest, claim_id: str, now: int = NOW):
    events, refusal = ledger.submit(req, claim_id, now)
    assert refusal is None, refusal
    claim = ledger.claims[claim_id]
    assert claim.state == GRANTED and ClaimGranted(claim) in events
    return claim


def book(cal: Calendar, req: BookingRequest, booking_id: str, now: int = NOW):
    booking, _, _ = cal.book(req, booking_id, ALICE, "alice", now)
    return booking


def start(ledger: Ledger, booking, now: int) -> list:
    """What the engine does when a booking comes due."""
    return ledger.start_booking(booking.id, booking.request.takes, booking.gpus,
                                booking.uid, booking.user, booking.request.label,
                                booking.request.task_name, now, booking.end_usec)


def kinds(events) -> list[tuple[str, str]]:
    return [(type(e).__name__, e.claim.id) for e in events]


def check(ledger: Ledger, cal: Calendar) -> None:
    ledger.check_invariants()
    cal.check_invariants()
    check_every_instant(ledger.timeline)


# -- a plain per-instant model -----------------------------------------------------------------


def over_at(t: int, holds: list[Hold], memory: dict[str, int],
            capacity: dict[str, int]) -> str:
    """What is held twice or over a capacity at instant ``t`` by the holds covering it
    ("" when nothing is): counted one instant at a time, with no cleverness."""
    here = [h for h in holds if h.start <= t and (h.end is None or t < h.end)]
    for name, cap in capacity.items():
        total = sum(dict(h.pools).get(name, 0) for h in here)
        if total > cap:
            return f"pool {name}: {total} > {cap} at {t}"
    for gpu, mem in memory.items():
        whole = [h.id for h in here if gpu in h.whole]
        shares = [h for h in here if h.share == gpu]
        if len(whole) > 1 or (whole and shares):
            return f"{gpu} held by {whole} and {[h.id for h in shares]} at {t}"
        vram = sum(h.vram for h in shares)
        if vram > mem:
            return f"{gpu}: {vram} bytes of VRAM > {mem} at {t}"
    return ""


def check_every_instant(timeline) -> None:
    holds = list(timeline.holds.values())
    edges = sorted({h.start for h in holds} | {h.end for h in holds if h.end is not None})
    for t in edges:
        problem = over_at(t, holds, timeline.memory, timeline.capacity)
        assert not problem, problem


# -- until: a booking ahead, a free GPU, the claim's own end ---------------------------------------


def test_a_claim_on_a_gpu_booked_later_is_granted_until_the_booking_starts():
    ledger, cal = ledger_and_calendar(1)
    b = book(cal, booking_request(gpus=1, at=H), "b1")
    claim = grant(ledger, claim_request(gpus=1), "c1")
    assert claim.gpus == (uuid(0),)
    assert (claim.until_usec, claim.until_booking) == (b.start_usec, "b1")
    hold = ledger.timeline.holds["c1"]
    assert (hold.start, hold.end, hold.whole) == (NOW, b.start_usec, (uuid(0),))
    check(ledger, cal)


@pytest.mark.parametrize("booked", [0, 1])
def test_a_free_gpu_with_no_booking_ahead_is_placed_first_and_held_for_good(booked):
    ledger, cal = ledger_and_calendar(2)
    book(cal, booking_request(gpus=1, at=H, named=(uuid(booked),)), "b1")
    claim = grant(ledger, claim_request(gpus=1), "c1")
    assert claim.gpus == (uuid(1 - booked),)
    assert (claim.until_usec, claim.until_booking) == (0, "")
    assert ledger.timeline.holds["c1"].end is None
    check(ledger, cal)


def test_of_two_booked_gpus_the_one_booked_later_is_placed_first():
    ledger, cal = ledger_and_calendar(2)
    book(cal, booking_request(gpus=1, at=3 * H, named=(uuid(0),)), "late")
    book(cal, booking_request(gpus=1, at=H, named=(uuid(1),)), "soon")
    claim = grant(ledger, claim_request(gpus=1), "c1")
    assert (claim.gpus, claim.until_usec, claim.until_booking) == ((uuid(0),), NOW + 3 * H,
                                                                    "late")


def test_a_vram_share_goes_to_the_unbooked_gpu_too_then_to_the_tightest_fit():
    ledger, cal = ledger_and_calendar(3, [16 * GIB, 16 * GIB, 24 * GIB])
    book(cal, booking_request(gpus=1, at=H, named=(uuid(0),)), "b1")
    first = grant(ledger, claim_request(vram=4 * GIB), "c1")
    assert first.gpus == (uuid(1),) and first.until_usec == 0  # not GPU-00, booked at 1h
    second = grant(ledger, claim_request(vram=4 * GIB), "c2")
    assert second.gpus == (uuid(1),) and second.until_usec == 0  # packed: 24G stays whole
    check(ledger, cal)


def test_a_claims_own_end_is_kept_when_it_comes_before_the_booking():
    ledger, cal = ledger_and_calendar(1)
    book(cal, booking_request(gpus=1, at=H), "b1")
    early = grant(ledger, claim_request(gpus=1, end=NOW + 30 * M), "early")
    assert (early.until_usec, early.until_booking) == (NOW + 30 * M, "")
    ledger.release("early")
    late = grant(ledger, claim_request(gpus=1, end=NOW + 2 * H), "late")
    assert (late.until_usec, late.until_booking) == (NOW + H, "b1")
    ledger.release("late")
    at_the_start = grant(ledger, claim_request(gpus=1, end=NOW + H), "same")
    assert (at_the_start.until_usec, at_the_start.until_booking) == (NOW + H, "")
    check(ledger, cal)


def test_a_claims_own_end_holds_when_nothing_is_booked():
    ledger, cal = ledger_and_calendar(1)
    claim = grant(ledger, claim_request(gpus=1, end=NOW + H), "c1")
    assert (claim.until_usec, claim.until_booking) == (NOW + H, "")
    b = book(cal, booking_request(gpus=1, duration=H), "b1")  # the earliest fit: at its end
    assert b.start_usec == NOW + H
    check(ledger, cal)


# -- no booking over an open-ended claim -----------------------------------------------------------


def test_no_booking_is_admitted_over_an_open_ended_claims_gpu():
    ledger, cal = ledger_and_calendar(2)
    grant(ledger, claim_request(gpus=1), "c1")  # GPU-00, for good
    with pytest.raises(NotEnoughCapacity):
        book(cal, booking_request(gpus=1, at=H, named=(uuid(0),)), "b1")
    with pytest.raises(NotEnoughCapacity, match=r"never fits: claims without an end hold what "
                                                 r"it needs \(c1\); it fits once they are "
                                                 r"released \(gpuctl release REF\)"):
        book(cal, booking_request(gpus=1, named=(uuid(0),)), "b1")  # not ever
    by_count = book(cal, booking_request(gpus=1, at=H), "b2")
    assert by_count.gpus == (uuid(1),)
    with pytest.raises(NotEnoughCapacity):
        book(cal, booking_request(gpus=2, at=2 * H), "b3")
    with pytest.raises(NotEnoughCapacity, match=r"never fits: .*\(c1\)"):
        book(cal, booking_request(gpus=2), "b3")
    with pytest.raises(NotEnoughCapacity, match=r"does not fit then, and never fits: .*\(c1\)"):
        book(cal, booking_request(gpus=2, at=H), "b3")
    assert set(cal.bookings) == {"b2"}
    assert ledger.claims["c1"].until_usec == 0
    check(ledger, cal)


def test_no_booking_takes_a_shared_gpu_whole_or_more_vram_than_an_open_share_leaves():
    ledger, cal = ledger_and_calendar(1)
    grant(ledger, claim_request(vram=10 * GIB), "c1")
    with pytest.raises(NotEnoughCapacity):
        book(cal, booking_request(gpus=1, at=H), "b1")
    with pytest.raises(NotEnoughCapacity):
        book(cal, booking_request(vram=8 * GIB, at=H), "b1")
    with pytest.raises(NotEnoughCapacity):
        book(cal, booking_request(vram=4 * GIB, at=H, exclusive=True), "b1")
    beside = book(cal, booking_request(vram=6 * GIB, at=H), "b1")
    assert beside.gpus == (uuid(0),) and beside.share
    check(ledger, cal)


# -- bookings that move or go away -------------------------------------------------------------


def test_cancelling_the_booking_frees_the_claims_until():
    ledger, cal = ledger_and_calendar(1)
    book(cal, booking_request(gpus=1, at=H), "b1")
    grant(ledger, claim_request(gpus=1), "c1")
    cal.cancel("b1", ALICE, NOW)
    events = ledger.refresh_until()
    claim = ledger.claims["c1"]
    assert events == [UntilChanged(claim)]
    assert (claim.until_usec, claim.until_booking) == (0, "")
    assert ledger.timeline.holds["c1"].end is None
    check(ledger, cal)
    with pytest.raises(NotEnoughCapacity):  # and it is the claim's for good now
        book(cal, booking_request(gpus=1, at=H), "b2")


def test_after_a_cancel_the_claim_is_granted_until_the_next_booking_or_its_own_end():
    ledger, cal = ledger_and_calendar(1)
    book(cal, booking_request(gpus=1, at=H), "b1")
    book(cal, booking_request(gpus=1, at=3 * H), "b2")
    grant(ledger, claim_request(gpus=1, end=NOW + 5 * H), "c1")
    assert ledger.claims["c1"].until_booking == "b1"
    cal.cancel("b1", ALICE, NOW)
    assert kinds(ledger.refresh_until()) == [("UntilChanged", "c1")]
    assert (ledger.claims["c1"].until_usec, ledger.claims["c1"].until_booking) == (NOW + 3 * H,
                                                                                  "b2")
    cal.cancel("b2", ALICE, NOW)
    assert kinds(ledger.refresh_until()) == [("UntilChanged", "c1")]
    assert (ledger.claims["c1"].until_usec, ledger.claims["c1"].until_booking) == (NOW + 5 * H, "")
    check(ledger, cal)


def test_moving_the_booking_later_moves_the_claims_until_and_a_refresh_of_others_changes_nothing():
    ledger, cal = ledger_and_calendar(1)
    b = book(cal, booking_request(gpus=1, at=H), "b1")
    grant(ledger, claim_request(gpus=1), "c1")
    cal.edit("b1", replace(b.request, start_usec=NOW + 2 * H), ALICE, NOW)
    assert kinds(ledger.refresh_until()) == [("UntilChanged", "c1")]
    assert ledger.claims["c1"].until_usec == NOW + 2 * H
    assert ledger.refresh_until() == []  # the same: no event
    check(ledger, cal)


def test_a_reclaimable_claims_until_is_freed_when_its_booking_is_cancelled():
    ledger, cal = ledger_and_calendar(1)
    book(cal, booking_request(gpus=1, at=H), "b1")
    claim = grant(ledger, claim_request(gpus=1, reclaimable=True), "c1")
    assert claim.until_booking == "b1"
    cal.cancel("b1", ALICE, NOW)
    events = ledger.refresh_until()
    assert (claim.until_usec, claim.until_booking) == (0, "")
    assert events == [UntilChanged(claim)]


@pytest.mark.parametrize("long, short, claimed", [
    ({"cpu": 4}, {"cpu": 2}, {"cpu": 3}),                           # 3 + 4 + 2 > 8
    ({"vram": 8 * GIB}, {"vram": 4 * GIB}, {"vram": 6 * GIB}),      # 6 + 8 + 4 > 16G
])
def test_an_until_is_freed_when_a_booking_it_collides_with_only_in_sum_goes_away(
        long, short, claimed):
    ledger, cal = ledger_and_calendar(1)
    book(cal, booking_request(**long, at=H, duration=2 * H), "long")
    book(cal, booking_request(**short, at=2 * H), "short")
    claim = grant(ledger, claim_request(**claimed), "c1")  # over from "short" on
    assert (claim.until_usec, claim.until_booking) == (NOW + 2 * H, "short")
    cal.cancel("long", ALICE, NOW)
    events = ledger.refresh_until()  # without "long" it fits for good
    assert (claim.until_usec, claim.until_booking) == (0, "")
    assert events == [UntilChanged(claim)]


def test_a_pool_claims_until_is_freed_when_the_claim_beside_it_is_released():
    ledger, cal = ledger_and_calendar(1)
    book(cal, booking_request(cpu=2, at=H), "b1")
    grant(ledger, claim_request(cpu=4), "first")      # 4 + 2 fits: for good
    claim = grant(ledger, claim_request(cpu=3), "c1")  # 4 + 3 + 2 > 8 from b1 on
    assert claim.until_booking == "b1"
    ledger.release("first")                            # 3 + 2 fits for good now
    assert (claim.until_usec, claim.until_booking) == (0, "")


# -- a booking's start over an overdue claim -------------------------------------------------------


def test_at_its_start_a_booking_asks_the_overdue_claim_back_and_gets_exactly_its_gpus():
    ledger, cal = ledger_and_calendar(3)
    b = book(cal, booking_request(gpus=2, at=H), "b1")
    assert b.gpus == (uuid(0), uuid(1))
    grant(ledger, claim_request(gpus=1), "c0")               # GPU-02: never booked, for good
    c1 = grant(ledger, claim_request(gpus=2), "c1")          # GPU-00 and GPU-01, until b1
    assert (c1.gpus, c1.until_usec, c1.until_booking) == (b.gpus, NOW + H, "b1")
    events, _ = cal.due(NOW + H)
    assert [(e.what, e.booking.id) for e in events] == [("started", "b1")]
    started = start(ledger, events[0].booking, NOW + H)
    assert kinds(started) == [("ClaimQueued", "b1")]       # c1 holds its GPUs: it waits
    asked = ledger.overdue("c1")
    assert kinds(asked) == [("ReclaimAsked", "c1")] and asked[0].waiter.id == "b1"
    assert ledger.overdue("c1") == []                      # once is enough
    released = ledger.release("c1")
    assert kinds(released) == [("ClaimReleased", "c1"), ("ClaimGranted", "b1")]
    claim = ledger.claims["b1"]
    assert (claim.mode, claim.gpus, claim.until_usec) == (BOOKING, b.gpus, b.end_usec)
    assert ledger.timeline.holds["b1"] == cal.bookings["b1"].hold()  # the booking's own
    check(ledger, cal)
    events, _ = cal.due(b.end_usec)
    assert [(e.what, e.booking.ended) for e in events] == [("ended", "expired")]
    assert kinds(ledger.release("b1", "expired")) == [("ClaimReleased", "b1")]
    assert {g.uuid for g in ledger.free_gpus()} == {uuid(0), uuid(1)}
    check(ledger, cal)


def test_a_booking_whose_gpus_are_free_at_its_start_is_granted_at_once():
    ledger, cal = ledger_and_calendar(2)
    b = book(cal, booking_request(vram=8 * GIB, cpu=2, at=H), "b1")
    grant(ledger, claim_request(gpus=1), "c1")  # not on b1's GPU: for good
    assert ledger.claims["c1"].until_usec == 0
    events, _ = cal.due(NOW + H)
    started = start(ledger, events[0].booking, NOW + H)
    claim = ledger.claims["b1"]
    assert kinds(started) == [("ClaimQueued", "b1"), ("ClaimGranted", "b1")]
    assert claim.gpus == b.gpus and claim.shared and ledger.pool_free("cpu") == CPU - 2
    check(ledger, cal)


# -- pools -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("amount, until", [(4, 0), (5, NOW + H), (8, NOW + H)])
def test_a_pool_claim_is_granted_until_a_booking_needs_the_pool(amount, until):
    ledger, cal = ledger_and_calendar(1)
    book(cal, booking_request(cpu=4, at=H), "b1")
    claim = grant(ledger, claim_request(cpu=amount), "c1")
    assert claim.until_usec == until and claim.until_booking == ("b1" if until else "")
    check(ledger, cal)


def test_pool_claims_beside_each_other_until_the_sum_would_exceed_the_capacity():
    ledger, cal = ledger_and_calendar(1)
    book(cal, booking_request(cpu=4, at=H, duration=2 * H), "b1")
    assert grant(ledger, claim_request(cpu=3), "c1").until_usec == 0      # 3 + 4 fits
    assert grant(ledger, claim_request(cpu=1), "c2").until_usec == 0      # 3 + 1 + 4 = 8
    c3 = grant(ledger, claim_request(cpu=2), "c3")                        # 10 > 8 from b1
    assert (c3.until_usec, c3.until_booking) == (NOW + H, "b1")
    c4 = grant(ledger, claim_request(cpu=2, end=NOW + 30 * M), "c4")     # gone before b1
    assert (c4.until_usec, c4.until_booking) == (NOW + 30 * M, "")
    with pytest.raises(NotEnoughCapacity):  # c1, c2 and b1 fill the pool while b1 lasts
        book(cal, booking_request(cpu=1, at=2 * H), "b2")
    with pytest.raises(NotEnoughCapacity):  # and c1 and c2 hold half of it for good
        book(cal, booking_request(cpu=5, at=4 * H), "b2")
    assert book(cal, booking_request(cpu=4, at=3 * H), "b2").start_usec == NOW + 3 * H
    check(ledger, cal)


def test_an_overdue_pool_claim_is_asked_back_for_the_booking():
    ledger, cal = ledger_and_calendar(1)
    b = book(cal, booking_request(cpu=6, at=H), "b1")
    grant(ledger, claim_request(cpu=2), "stays")
    grant(ledger, claim_request(cpu=6), "goes")
    assert ledger.claims["goes"].until_booking == "b1"
    events, _ = cal.due(b.start_usec)
    assert kinds(start(ledger, events[0].booking, b.start_usec)) == [("ClaimQueued", "b1")]
    assert kinds(ledger.overdue("goes")) == [("ReclaimAsked", "goes")]
    assert kinds(ledger.release("goes")) == [("ClaimReleased", "goes"), ("ClaimGranted", "b1")]
    assert "stays" in ledger.claims and ledger.pool_free("cpu") == 0
    check(ledger, cal)


# -- at random, on a clock that only moves forward -------------------------------------------------


class Engine:
    """What the engine does with the ledger and the calendar as time passes (no bus, no
    processes, no store); holders give back at once what they are asked back."""

    def __init__(self, ledger: Ledger, cal: Calendar):
        self.ledger, self.cal = ledger, cal
        self.overdue: set[str] = set()

    def calendar_changed(self, events, now: int) -> None:
        for event in events:
            b = event.booking
            if event.what == "started":
                self.checked(start(self.ledger, b, now))
            elif event.what == "ended" and b.id in self.ledger.claims:
                self.checked(self.ledger.release(b.id, "expired"))
            elif event.what == "changed" and b.state == ACTIVE and b.id in self.ledger.claims:
                self.checked(self.ledger.set_end(b.id, b.end_usec))
        for e in self.checked(self.ledger.refresh_until()):
            assert type(e) is UntilChanged, e

    def run_due(self, now: int) -> None:
        """Until nothing changes: claims past their time, bookings due, holders asked back."""
        for _ in range(50):
            acted = False
            for c in list(self.ledger.claims.values()):
                if c.id not in self.ledger.claims:
                    continue
                if (c.state == GRANTED and c.mode != BOOKING and c.until_usec
                        and c.until_usec <= now and c.id not in self.overdue):
                    acted = True
                    if c.until_booking:
                        self.overdue.add(c.id)
                        self.checked(self.ledger.overdue(c.id))
                    else:
                        assert c.until_usec == c.end_usec, c
                        self.checked(self.ledger.release(c.id, "expired"))
            if self.cal.next_due() is not None and self.cal.next_due() <= now:
                acted = True
                events, _ = self.cal.due(now)
                self.calendar_changed(events, now)
            for c in list(self.ledger.claims.values()):  # the holders give back
                if c.id in self.ledger.claims and (c.reclaim_for or c.id in self.overdue):
                    acted = True
                    self.overdue.discard(c.id)
                    self.checked(self.ledger.release(c.id, "released"))
            if not acted:
                return
        raise AssertionError("the engine's work does not settle")

    def checked(self, events: list) -> list:
        for e in events:
            if type(e) is ClaimGranted and e.claim.mode != BOOKING:
                c = e.claim
                assert not c.end_usec or 0 < c.until_usec <= c.end_usec, c
            if type(e) is ReclaimAsked:
                assert e.waiter.mode == BOOKING, "only a booking's claim asks back here"
            if type(e) is ClaimReleased:
                assert e.claim.id not in self.ledger.claims
        return events


SIZES = {"gpus": [1, 2, 3], "vram": [4 * GIB, 8 * GIB, 12 * GIB], "cpu": [1, 3, 5, 8]}


class ClaimsOverTime(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.ledger, self.cal = ledger_and_calendar(3, [16 * GIB, 16 * GIB, 24 * GIB])
        self.engine = Engine(self.ledger, self.cal)
        self.now = NOW
        self.n = 0

    def new_id(self, prefix: str) -> str:
        self.n += 1
        return f"{prefix}{self.n}"

    def claims(self) -> list[str]:
        return sorted(c.id for c in self.ledger.claims.values() if c.mode != BOOKING)

    def live(self) -> list[str]:
        return sorted(b.id for b in self.cal.bookings.values() if b.state != ENDED)

    # -- rules -------------------------------------------------------------------------------
    @rule(kind=st.sampled_from(["gpus", "vram", "cpu", "gpus+cpu", "vram+cpu"]),
          size=st.integers(0, 3), cpu=st.sampled_from(SIZES["cpu"]),
          end=st.one_of(st.none(), st.integers(1, 16)),
          wait=st.sampled_from([False, False, False, True]),
          reclaimable=st.sampled_from([False, False, False, True]))
    def claim(self, kind, size, cpu, end, wait, reclaimable):
        gpus = SIZES["gpus"][size % 3] if kind.startswith("gpus") else 0
        vram = SIZES["vram"][size % 3] if kind.startswith("vram") else 0
        req = claim_request(gpus, vram, cpu if "cpu" in kind else 0,
                            end=0 if end is None else self.now + end * 30 * M,
                            reclaimable=reclaimable, pid=self.n)
        claim_id = self.new_id("c")
        try:
            events, refusal = self.ledger.submit(req, claim_id, self.now, wait=wait)
        except ResourcedError:
            return
        self.engine.checked(events)
        claim = self.ledger.claims.get(claim_id)
        if refusal is not None:
            assert claim is None and events == []
        elif claim.state == GRANTED:
            self.check_placed_unbooked_first(claim)
        else:
            assert wait and ClaimQueued(claim) in events
        self.engine.run_due(self.now)

    def check_placed_unbooked_first(self, claim):
        """A claim of whole GPUs is granted only until a booking when no GPU left free is
        booked later (or never): those are placed first.  Not checked when somebody waits
        (a free GPU may be reserved for it) or the claim has a pool amount (its until may
        come from the pool)."""
        if not claim.until_booking or not claim.demand.gpus or claim.demand.pools \
                or list(self.ledger.waiting):
            return
        free_after = [g.uuid for g in self.ledger.free_gpus()]
        held_from = {u: self.ledger.timeline.next_start(u) for u in free_after}
        for u in free_after:
            later = held_from[u] is None or held_from[u] > claim.until_usec
            assert not later, f"{claim.id} took a GPU booked at {claim.until_usec}, {u} was free"

    @precondition(lambda self: self.claims())
    @rule(data=st.data())
    def release(self, data):
        claim_id = data.draw(st.sampled_from(self.claims()))
        events = self.engine.checked(self.ledger.release(claim_id))
        assert kinds(events[:1]) == [("ClaimReleased", claim_id)]
        self.engine.overdue.discard(claim_id)
        self.engine.run_due(self.now)

    @initialize(bookings=st.lists(st.tuples(
        st.sampled_from(["gpus", "named", "vram", "exclusive", "cpu", "gpus+cpu"]),
        st.integers(0, 5), st.sampled_from(SIZES["cpu"][:3]), st.integers(1, 8),
        st.integers(1, 8)), max_size=3))
    def some_bookings_ahead(self, bookings):
        """Claims placed on a calendar with bookings ahead get untils (and become overdue)."""
        for kind, size, cpu, at, duration in bookings:
            self.book(kind, size, cpu, at, duration)

    @rule(kind=st.sampled_from(["gpus", "named", "vram", "exclusive", "cpu", "gpus+cpu"]),
          size=st.integers(0, 5), cpu=st.sampled_from(SIZES["cpu"][:3]),
          at=st.one_of(st.none(), st.integers(0, 16)), duration=st.integers(1, 8))
    def book(self, kind, size, cpu, at, duration):
        named = (uuid(size % 3),) if kind == "named" else ()
        gpus = 1 if named else SIZES["gpus"][size % 2] if kind.startswith("gpus") else 0
        vram = SIZES["vram"][size % 3] if kind in ("vram", "exclusive") else 0
        req = BookingRequest(demand(gpus, vram, cpu if "cpu" in kind else 0), duration * 30 * M,
                             None if at is None else self.now + at * 30 * M, named=named,
                             exclusive=kind == "exclusive")
        before = {h.id: h for h in self.ledger.timeline.holds.values()}
        try:
            booking, _, events = self.cal.book(req, self.new_id("b"), ALICE, "alice", self.now)
        except (NotEnoughCapacity, InvalidArgs):
            assert self.ledger.timeline.holds == before, "a refused booking changed the timeline"
            return
        if named:
            assert booking.gpus == named
        self.engine.calendar_changed(events, self.now)
        self.engine.run_due(self.now)

    @precondition(lambda self: self.live())
    @rule(data=st.data())
    def cancel(self, data):
        booking_id = data.draw(st.sampled_from(self.live()))
        _, events = self.cal.cancel(booking_id, ALICE, self.now)
        self.engine.calendar_changed(events, self.now)
        assert booking_id not in self.ledger.claims
        self.engine.run_due(self.now)

    @precondition(lambda self: self.live())
    @rule(data=st.data(), by=st.integers(-6, 6).filter(bool))
    def set_end(self, data, by):
        booking_id = data.draw(st.sampled_from(self.live()))
        end = self.cal.bookings[booking_id].end_usec + by * 30 * M
        try:
            booking, events = self.cal.set_end(booking_id, end, ALICE, self.now)
        except (NotEnoughCapacity, InvalidArgs):
            return
        self.engine.calendar_changed(events, self.now)
        if booking.id in self.ledger.claims:
            assert self.ledger.claims[booking.id].until_usec == booking.end_usec
        self.engine.run_due(self.now)

    @precondition(lambda self: self.live())
    @rule(data=st.data(), at=st.integers(0, 16))
    def move(self, data, at):
        booking = self.cal.bookings[data.draw(st.sampled_from(self.live()))]
        if booking.state != SCHEDULED:
            return
        try:
            _, events = self.cal.edit(booking.id, replace(booking.request,
                                                          start_usec=self.now + at * 30 * M),
                                      ALICE, self.now)
        except (NotEnoughCapacity, InvalidArgs):
            return
        self.engine.calendar_changed(events, self.now)
        self.engine.run_due(self.now)

    @rule(steps=st.integers(0, 6), odd=st.booleans())
    def time_passes(self, steps, odd):
        self.now += steps * 30 * M + (7 * M if odd else 0)  # on the half hours, or between
        self.engine.run_due(self.now)

    # -- invariants --------------------------------------------------------------------------
    @invariant()
    def the_ledger_and_the_calendar_check_themselves(self):
        self.ledger.check_invariants()
        self.cal.check_invariants()

    @invariant()
    def nothing_is_held_twice_at_any_instant_of_the_timeline(self):
        check_every_instant(self.ledger.timeline)

    @invariant()
    def nothing_is_granted_twice_now(self):
        whole: dict[str, str] = {}
        vram: dict[str, int] = {}
        used = 0
        granted = [c for c in self.ledger.claims.values() if c.state == GRANTED]
        for c in granted:
            if c.shared:
                vram[c.gpus[0]] = vram.get(c.gpus[0], 0) + c.demand.vram
            for u in () if c.shared else c.gpus:
                assert u not in whole, f"{u} granted to {whole[u]} and {c.id}"
                whole[u] = c.id
            used += dict(c.demand.pools).get("cpu", 0)
        assert used <= CPU
        for u, v in vram.items():
            assert u not in whole and v <= self.ledger.gpus[u].memory_bytes

    @invariant()
    def every_claim_is_held_until_its_end_or_the_next_booking_that_needs_it(self):
        holds = self.ledger.timeline.holds
        for c in self.ledger.claims.values():
            if c.state != GRANTED or c.mode == BOOKING:
                continue
            assert c.until_usec == 0 or c.until_usec > self.now, f"{c.id} overstays"
            hold = holds[c.id]
            assert (hold.start, hold.end) == (c.created_usec, c.until_usec or None)
            if c.until_booking:
                b = self.cal.bookings.get(c.until_booking)
                assert b is not None and b.state == SCHEDULED, f"{c.id}: stale until"
                assert b.start_usec == c.until_usec
                assert not c.end_usec or b.start_usec < c.end_usec
                others = [h for h in holds.values() if h.id != c.id]
                alongside = replace(hold, end=None)
                assert over_at(b.start_usec, others + [alongside], self.ledger.timeline.memory,
                               self.ledger.timeline.capacity), \
                    f"{c.id} is granted until {b.id}, which does not need what it holds"
            else:
                assert c.until_usec == c.end_usec, f"{c.id}: until is neither its end nor a booking"

    @invariant()
    def an_active_booking_holds_exactly_its_gpus(self):
        for b in self.cal.bookings.values():
            claim = self.ledger.claims.get(b.id)
            if b.state == ACTIVE:
                assert claim is not None and claim.state == GRANTED, f"{b.id} is not granted"
                assert claim.gpus == b.gpus and claim.mode == BOOKING
                assert claim.until_usec == b.end_usec
            else:
                assert claim is None, f"{b.id} is {b.state} but has a claim"
        assert all(c.id in self.cal.bookings for c in self.ledger.claims.values()
                   if c.mode == BOOKING)


ClaimsOverTime.TestCase.settings = settings(
    max_examples=200, stateful_step_count=30, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])
TestClaimsOverTime = ClaimsOverTime.TestCase


def test_verify_marks_overdue_only_the_gpus_the_booking_waits_for():
    from resourced.core.verify import IDLE_CLAIM, OVERDUE, verify

    ledger, cal = ledger_and_calendar(3)
    b = book(cal, booking_request(gpus=2, at=H), "b1")
    c1 = grant(ledger, claim_request(gpus=3), "c1")          # all three, until b1
    assert c1.until_booking == "b1"
    events, _ = cal.due(NOW + H)
    start(ledger, events[0].booking, NOW + H)
    ledger.overdue("c1")
    seen = {u: () for u in ledger.gpus}
    statuses = {r.uuid: r.status for r in verify(ledger, seen)}
    assert statuses == {uuid(0): OVERDUE, uuid(1): OVERDUE, uuid(2): IDLE_CLAIM}
    assert set(b.gpus) == {uuid(0), uuid(1)}
