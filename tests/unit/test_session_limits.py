"""Agent sessions and the limits on them: in the engine (claims), in the calendar (booked
GPU-hours) and in the ledger's per-(uid, session) counters, without a bus.

The tests run as root, and the engine is told (``as_user``) that our own process belongs
to USER (uid 1000), which lets USER's claims go all the way through ``Engine.claim`` with
our pid as the owner.
"""

import os
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, initialize, invariant, rule

import resourced.daemon.engine.engine as engine_module
from resourced.core.caller import Caller
from resourced.core.claims import ClaimOptions, ClaimRequest, Demand, ProcessRef, check_session
from resourced.core.inventory import Gpu
from resourced.core.ledger import ClaimReleased, Ledger, StopAsked
from resourced.core.lifecycle import ENDED, GRANTED, QUEUED, SCHEDULED
from resourced.core.pools import Pool
from resourced.daemon.store.claims import claim_from_record, claim_to_record
from resourced.errors import (
    InvalidArgs,
    LimitExceeded,
    NoSuchClaim,
    NoSuchPool,
    NotEnoughCapacity,
    NotEnoughGPUs,
)

from .test_calendar import ALICE, BOB, GPUS, NOW, H, ask, calendar
from .test_engine import USER, engine_on, run

ROOT = Caller(uid=0, pid=os.getpid())
GIB = 1 << 30


@pytest.fixture
def as_user(monkeypatch):
    """Our process counts as USER's: USER may name it as a claim's owner."""
    monkeypatch.setattr(engine_module, "process_uid", lambda pid: USER.uid)


async def claim(engine, session=None, caller=USER, wait=False, dry_run=False, **demand):
    c, _ = await engine.claim(caller, ClaimOptions(Demand.of(**demand), "dev", session=session,
                                                   wait=wait, dry_run=dry_run))
    return c


def counts(engine, session=None, uid=USER.uid):
    """(claims, waiting, GPUs) of USER (or ``uid``), or of one of its sessions."""
    return engine.ledger.counts_of(uid, session)


# == session names ==========================================================================


@pytest.mark.parametrize("name", ["a", "agent-7", "refactor_2.b@host+x", "x" * 64, "sid:123",
                                  "A.B-c_d@e+f"])
def test_valid_session_names(name):
    check_session(name)


@pytest.mark.parametrize("name", ["", " ", "a b", "x" * 65, "sid:", "sid:12a", "sid:-1",
                                  "a/b", "a:b", "tab\there", "é", "a\nb", "sid:١٢"])
def test_invalid_session_names_are_refused(name):
    with pytest.raises(InvalidArgs, match="session"):
        check_session(name)


def test_a_default_looking_session_name_is_held_to_64_characters_too():
    name = "sid:" + "1" * 61
    assert len(name) == 65
    with pytest.raises(InvalidArgs, match="session"):
        check_session(name)


def test_a_claim_without_a_session_is_in_its_owners_unix_session(as_user):
    async def test():
        async with engine_on(gpus=2) as (engine, _):
            c = await claim(engine, gpus=1)
            assert c.session == f"sid:{os.getsid(os.getpid())}"
            named = await claim(engine, session="agent-1", gpus=1)
            assert named.session == "agent-1"
            assert counts(engine, c.session) == (1, 0, 1)
            assert counts(engine, "agent-1") == (1, 0, 1)
            assert counts(engine) == (2, 0, 2)
    run(test)


def test_session_0_is_a_session_too(as_user, monkeypatch):
    """In a container whose session leader is outside its PID namespace every process
    reads session 0 (CI's runners do): its claims are in "sid:0", not in no session."""
    monkeypatch.setattr(engine_module, "process_session", lambda pid: 0)

    async def test():
        async with engine_on(gpus=2) as (engine, _):
            assert (await claim(engine, gpus=1)).session == "sid:0"
            assert counts(engine, "sid:0") == (1, 0, 1)
    run(test)


def test_an_invalid_session_is_refused_and_changes_nothing(as_user):
    async def test():
        async with engine_on(gpus=2) as (engine, events):
            for name in ("a b", "x" * 65, ""):
                with pytest.raises(InvalidArgs, match="session"):
                    await claim(engine, session=name, gpus=1)
            assert engine.ledger.claims == {} and events == []
            assert counts(engine) == (0, 0, 0)
    run(test)


# == claim limits ===========================================================================


def test_max_gpus_per_user_counts_every_session_and_waiting_claims(as_user):
    async def test():
        async with engine_on(gpus=4, max_gpus_per_user=3) as (engine, _):
            await claim(engine, "a", gpus=1)
            await claim(engine, "b", gpus=1)
            with pytest.raises(LimitExceeded, match=r"max_gpus_per_user") as info:
                await claim(engine, "c", gpus=2)
            assert "uid 1000" in info.value.message
            # a waiting claim counts as well: the third GPU, waited for
            await claim(engine, "c", caller=ROOT, gpus=2)  # root takes the last two GPUs
            waiter = await claim(engine, "c", wait=True, gpus=1)
            assert waiter.state == QUEUED
            assert counts(engine) == (3, 1, 3)
            with pytest.raises(LimitExceeded, match="max_gpus_per_user"):
                await claim(engine, "d", wait=True, gpus=1)
            assert counts(engine) == (3, 1, 3)
            # no GPU at all (nothing but pools would be asked): not a GPU limit's business
            engine._check_limits(USER, wait=False, demand=Demand.of(pools={"cpu": 1}), session="d")
    run(test)


def test_max_claims_per_session_leaves_other_sessions_alone(as_user):
    async def test():
        async with engine_on(gpus=4, max_claims_per_session=2) as (engine, _):
            await claim(engine, "a", gpus=1)
            await claim(engine, "a", vram=GIB)
            with pytest.raises(LimitExceeded, match="max_claims_per_session") as info:
                await claim(engine, "a", gpus=1)
            assert "session a" in info.value.message
            other = await claim(engine, "b", gpus=1)  # the same user, another session
            assert other.state == GRANTED
            assert counts(engine, "a")[0] == 2 and counts(engine, "b")[0] == 1
            assert counts(engine)[0] == 3
    run(test)


def test_max_claims_per_session_counts_waiting_claims(as_user):
    async def test():
        async with engine_on(gpus=1, max_claims_per_session=2) as (engine, _):
            await claim(engine, "a", gpus=1)
            await claim(engine, "a", wait=True, gpus=1)
            with pytest.raises(LimitExceeded, match="max_claims_per_session"):
                await claim(engine, "a", wait=True, gpus=1)
            assert counts(engine, "a") == (2, 1, 2)
    run(test)


def test_max_gpus_per_session_leaves_other_sessions_alone(as_user):
    async def test():
        async with engine_on(gpus=4, max_gpus_per_session=2) as (engine, _):
            await claim(engine, "a", gpus=1)
            with pytest.raises(LimitExceeded, match="max_gpus_per_session") as info:
                await claim(engine, "a", gpus=2)
            assert "session a" in info.value.message
            with pytest.raises(LimitExceeded, match="max_gpus_per_session"):
                await claim(engine, "b", gpus=3)  # more than one session may ever hold
            await claim(engine, "a", gpus=1)  # up to the limit exactly
            b = await claim(engine, "b", gpus=2)
            assert b.state == GRANTED
            assert counts(engine, "a")[2] == 2 and counts(engine, "b")[2] == 2
    run(test)


def test_a_vram_share_counts_as_one_gpu(as_user):
    async def test():
        async with engine_on(gpus=2, max_gpus_per_session=2) as (engine, _):
            share = await claim(engine, "a", vram=4 * GIB)
            assert share.state == GRANTED and len(share.gpus) == 1
            assert counts(engine, "a") == (1, 0, 1)
            await claim(engine, "a", vram=4 * GIB)  # a second share: two GPUs' worth
            assert counts(engine, "a") == (2, 0, 2)
            with pytest.raises(LimitExceeded, match="max_gpus_per_session"):
                await claim(engine, "a", vram=GIB)
    run(test)


def test_the_default_session_is_limited_like_a_named_one(as_user):
    async def test():
        async with engine_on(gpus=4, max_claims_per_session=1) as (engine, _):
            first = await claim(engine, gpus=1)
            with pytest.raises(LimitExceeded, match=f"session {first.session} .*"
                               r"\(max_claims_per_session\)"):
                await claim(engine, gpus=1)
            await claim(engine, "named", gpus=1)
    run(test)


def test_releasing_makes_room_again(as_user):
    async def test():
        async with engine_on(gpus=2, max_gpus_per_session=1, max_claims_per_session=1) as (
                engine, _):
            held = await claim(engine, "a", gpus=1)
            with pytest.raises(LimitExceeded):
                await claim(engine, "a", gpus=1)
            await engine.release(USER, held.id, force=True)
            assert counts(engine, "a") == (0, 0, 0)
            assert (await claim(engine, "a", gpus=1)).state == GRANTED
    run(test)


def test_session_limits_hold_for_root_and_exempt_users_are_spared_only_the_per_user_ones(
        as_user):
    """An agent swarm run as root is capped by its session's limits; root is under the
    per-user ones too, unless ``exempt_users`` names it."""
    async def test():
        async with engine_on(gpus=4, max_gpus_per_user=1, max_claims_per_session=1,
                             max_gpus_per_session=1) as (engine, _):
            assert (await claim(engine, "a", caller=ROOT, gpus=1)).state == GRANTED
            with pytest.raises(LimitExceeded, match="max_gpus_per_user"):
                await claim(engine, "b", caller=ROOT, gpus=1)
            engine.apply_settings(replace(engine.settings, exempt_users=("root",)))
            with pytest.raises(LimitExceeded, match="max_claims_per_session"):
                await claim(engine, "a", caller=ROOT, gpus=1)  # exempt: not from a session's
            assert (await claim(engine, "b", caller=ROOT, gpus=1)).state == GRANTED
            assert counts(engine, "a", uid=0) == (1, 0, 1)
            assert counts(engine, "a") == (0, 0, 0)  # USER's own count is another one
            assert (await claim(engine, "a", gpus=1)).state == GRANTED
    run(test)


@pytest.mark.parametrize("limits, held, ask_for, says", [
    (dict(max_gpus_per_user=1), dict(gpus=1), dict(gpus=1), "max_gpus_per_user"),
    (dict(max_claims_per_session=1), dict(gpus=1), dict(gpus=1), "max_claims_per_session"),
    (dict(max_gpus_per_session=2), dict(gpus=2), dict(vram=GIB), "max_gpus_per_session"),
    (dict(max_claims_per_user=1), dict(gpus=1), dict(gpus=1), "max_claims_per_user"),
])
def test_a_dry_run_is_refused_by_the_limits_too_and_changes_nothing(as_user, limits, held,
                                                                    ask_for, says):
    async def test():
        async with engine_on(gpus=4, **limits) as (engine, events):
            await claim(engine, "a", **held)
            before = (dict(engine.ledger.claims), counts(engine), counts(engine, "a"),
                      len(events))
            with pytest.raises(LimitExceeded, match=says):
                await claim(engine, "a", dry_run=True, **ask_for)
            assert (dict(engine.ledger.claims), counts(engine), counts(engine, "a"),
                    len(events)) == before
    run(test)


def test_a_dry_run_answers_the_decision_and_changes_no_count(as_user):
    async def test():
        async with engine_on(gpus=2, max_gpus_per_session=2) as (engine, events):
            await claim(engine, "a", gpus=1)
            before = (dict(engine.ledger.claims), counts(engine), counts(engine, "a"),
                      counts(engine, "b"), len(events))
            granted = await claim(engine, "a", dry_run=True, gpus=1)
            assert granted.state == GRANTED and len(granted.gpus) == 1
            assert granted.session == "a" and granted.id not in engine.ledger.claims
            queued = await claim(engine, "b", dry_run=True, wait=True, gpus=2)
            assert queued.state == QUEUED and queued.id not in engine.ledger.claims
            with pytest.raises(NotEnoughGPUs):  # it does not fit: the same error as for real
                await claim(engine, "b", dry_run=True, gpus=2)
            assert (dict(engine.ledger.claims), counts(engine), counts(engine, "a"),
                    counts(engine, "b"), len(events)) == before
            assert list(engine.ledger.waiting) == []
            engine.ledger.check_invariants()
    run(test)


def test_a_dry_run_release_releases_nothing(as_user):
    async def test():
        async with engine_on(gpus=1) as (engine, events):
            held = await claim(engine, "a", gpus=1)
            waiter = await claim(engine, "a", wait=True, gpus=1)
            n = len(events)
            for c in (held, waiter):
                assert await engine.release(USER, c.id, force=True, dry_run=True) == []
            assert set(engine.ledger.claims) == {held.id, waiter.id} and len(events) == n
            assert counts(engine, "a") == (2, 1, 2)
            with pytest.raises(NoSuchClaim):
                await engine.release(USER, "cnothere", dry_run=True)
    run(test)


def test_a_dry_run_release_of_someone_elses_claim_is_refused_as_for_real(as_user):
    from resourced.errors import NotClaimOwner

    async def test():
        async with engine_on(gpus=1) as (engine, _):
            roots = await claim(engine, "a", caller=ROOT, gpus=1)
            with pytest.raises(NotClaimOwner):
                await engine.release(USER, roots.id, dry_run=True)
            with pytest.raises(NotClaimOwner):
                engine.stop(USER, 0, "a", dry_run=True)
            with pytest.raises(NotClaimOwner):
                engine.stop(USER, 0, "a")
            with pytest.raises(InvalidArgs, match="reason"):
                engine.stop(ROOT, USER.uid, "a")  # root too says why it stops another's
            assert set(engine.ledger.claims) == {roots.id}
    run(test)


# == the stop switch, in the engine =========================================================


def test_stop_tells_granted_claims_then_releases_the_session_and_nothing_else(as_user):
    async def test():
        async with engine_on(gpus=2) as (engine, events):
            a1 = await claim(engine, "a", gpus=1)
            b1 = await claim(engine, "b", gpus=1)
            a2 = await claim(engine, "a", wait=True, gpus=1)  # waiting: released, not told
            events.clear()

            claims, bookings = engine.stop(USER, USER.uid, "a", reason="enough")

            assert sorted(c.id for c in claims) == sorted([a1.id, a2.id]) and bookings == []
            assert set(engine.ledger.claims) == {b1.id}
            told = [(e.claim.id, e.by, e.reason) for e in events if isinstance(e, StopAsked)]
            assert told == [(a1.id, USER.uid, "enough")]
            released = {e.claim.id: e.reason for e in events if isinstance(e, ClaimReleased)}
            assert released == {a1.id: "stopped", a2.id: "stopped"}
            first_release = next(i for i, e in enumerate(events) if isinstance(e, ClaimReleased))
            assert all(i < first_release for i, e in enumerate(events)
                       if isinstance(e, StopAsked))
            assert counts(engine, "a") == (0, 0, 0) and counts(engine, "b") == (1, 0, 1)
            engine.ledger.check_invariants()
    run(test)


def test_stop_dry_run_and_an_empty_session_change_nothing(as_user):
    async def test():
        async with engine_on(gpus=2) as (engine, events):
            a1 = await claim(engine, "a", gpus=1)
            events.clear()
            claims, bookings = engine.stop(USER, USER.uid, "a", dry_run=True)
            assert [c.id for c in claims] == [a1.id] and bookings == []
            assert engine.stop(USER, USER.uid, "nobody") == ([], [])
            assert events == [] and set(engine.ledger.claims) == {a1.id}
            with pytest.raises(InvalidArgs, match="session"):
                engine.stop(USER, USER.uid, "a b")
    run(test)


def in_hours(clock_usec: int, hours: float) -> int:
    return clock_usec + int(hours * H)


def test_the_engine_books_in_a_session_under_its_configured_gpu_hours(as_user):
    from resourced.core.calendar import BookingRequest

    async def test():
        async with engine_on(gpus=4, max_booked_gpu_hours_per_user=5,
                             max_booked_gpu_hours_per_session=2) as (engine, _):
            now = engine.clock()

            def two_gpu_hours(at: float) -> BookingRequest:
                return BookingRequest(Demand.of(gpus=2), H, in_hours(now, at) // 1_000_000
                                      * 1_000_000)

            a1, status = await engine.bookings.book(USER, two_gpu_hours(1), session="a")
            assert (status, a1.session) == ("created", "a")
            with pytest.raises(LimitExceeded, match="max_booked_gpu_hours_per_session"):
                await engine.bookings.book(USER, two_gpu_hours(3), session="a")
            b1, _ = await engine.bookings.book(USER, two_gpu_hours(3), session="b")
            with pytest.raises(LimitExceeded, match="max_booked_gpu_hours_per_user"):
                await engine.bookings.book(USER, two_gpu_hours(5), session="c")  # 6 > 5 for USER
            with pytest.raises(LimitExceeded, match="max_booked_gpu_hours_per_user"):
                await engine.bookings.book(USER, two_gpu_hours(5), session="c", dry_run=True)
            default, _ = await engine.bookings.book(
                USER, BookingRequest(Demand.of(gpus=1), H, in_hours(now, 5) // 10**6 * 10**6))
            assert default.session == f"sid:{os.getsid(os.getpid())}"
            big, _ = await engine.bookings.book(ROOT, two_gpu_hours(7), session="a")  # root's own "a"
            with pytest.raises(LimitExceeded, match="max_booked_gpu_hours_per_session"):
                await engine.bookings.book(ROOT, two_gpu_hours(9), session="a")  # root: capped too
            assert set(engine.calendar.bookings) == {a1.id, b1.id, default.id, big.id}
            engine.calendar.check_invariants()

            claims, stopped = engine.stop(USER, USER.uid, "a")
            assert claims == [] and [b.id for b in stopped] == [a1.id]
            assert engine.calendar.bookings[a1.id].state == ENDED
            assert engine.calendar.bookings[big.id].state == SCHEDULED  # root's "a" is root's
            assert engine.calendar.bookings[default.id].state == SCHEDULED
            assert engine.calendar.bookings[b1.id].state == SCHEDULED
            again, _ = await engine.bookings.book(USER, two_gpu_hours(3), session="a")  # hours freed
            assert again.session == "a"
            engine.calendar.check_invariants()
    run(test)


# == booked GPU-hours, in the calendar ======================================================


def book(cal, request, booking_id, uid=ALICE, session="a", now=NOW):
    booking, _, _ = cal.book(request, booking_id, uid, f"u{uid}", now, session=session)
    return booking


def booked_hours(cal, uid, session=None) -> float:
    return sum(b.gpu_usec for b in cal.bookings.values() if b.state != ENDED and b.uid == uid
               and (session is None or b.session == session)) / H


def test_gpu_usec_weighs_gpus_by_length_and_a_share_as_one_gpu():
    cal = calendar()
    assert book(cal, ask(gpus=2, hours=3, at=0), "w").gpu_usec == 6 * H
    assert book(cal, ask(vram=8 * GIB, hours=2, at=0), "s").gpu_usec == 2 * H
    assert book(cal, ask(cpu=4, hours=5, at=0), "p").gpu_usec == 0  # pools only
    assert cal.bookings["w"].session == "a"
    cal.check_invariants()


def test_gpu_hours_per_user_spans_sessions_and_spares_other_users_and_exempt_ones():
    cal = calendar(gpu_hours_per_user=4, exempt=frozenset({0}))
    book(cal, ask(gpus=2, hours=1, at=0), "a1", session="a")
    book(cal, ask(gpus=1, hours=2, at=1), "b1", session="b")  # 4 in all: at the limit
    with pytest.raises(LimitExceeded, match=r"max_booked_gpu_hours_per_user") as info:
        book(cal, ask(gpus=1, hours=1, at=4), "c1", session="c")
    assert "uid 1000" in info.value.message
    with pytest.raises(LimitExceeded, match="max_booked_gpu_hours_per_user"):
        book(cal, ask(vram=GIB, hours=1, at=4), "c2", session="c")  # a share: one GPU too
    book(cal, ask(cpu=2, hours=8, at=4), "c3", session="c")  # no GPU: no GPU-hours
    book(cal, ask(gpus=3, hours=1, at=5), "bob", uid=BOB)
    book(cal, ask(gpus=3, hours=5, at=6), "root", uid=0)  # exempt
    assert set(cal.bookings) == {"a1", "b1", "c3", "bob", "root"}
    plain = calendar(gpu_hours_per_user=4)
    with pytest.raises(LimitExceeded, match="uid 0"):
        book(plain, ask(gpus=3, hours=5, at=6), "root", uid=0)  # root is under it too
    assert booked_hours(cal, ALICE) == 4
    cal.check_invariants()


def test_gpu_hours_per_session_leaves_other_sessions_alone():
    cal = calendar(gpu_hours_per_session=2)
    book(cal, ask(gpus=2, hours=1, at=0), "a1", session="a")
    with pytest.raises(LimitExceeded, match="max_booked_gpu_hours_per_session") as info:
        book(cal, ask(gpus=1, hours=1, at=2), "a2", session="a")
    assert "session a" in info.value.message
    book(cal, ask(gpus=2, hours=1, at=2), "b1", session="b")
    book(cal, ask(gpus=2, hours=1, at=4), "x1", uid=BOB, session="a")  # BOB's "a" is BOB's
    with pytest.raises(LimitExceeded, match="max_booked_gpu_hours_per_session"):
        book(cal, ask(gpus=3, hours=1, at=6), "c1", session="c")  # 3 > 2 on its own
    assert set(cal.bookings) == {"a1", "b1", "x1"}
    cal.check_invariants()


def test_a_refused_booking_changes_nothing():
    cal = calendar(gpu_hours_per_user=1)
    book(cal, ask(gpus=1, hours=1, at=0), "a1")
    before = (dict(cal.bookings), dict(cal._booked_of), dict(cal.timeline.holds))
    with pytest.raises(LimitExceeded):
        book(cal, ask(gpus=1, hours=1, at=2), "a2")
    assert (dict(cal.bookings), dict(cal._booked_of), dict(cal.timeline.holds)) == before
    cal.check_invariants()


@pytest.mark.parametrize("limits", [dict(gpu_hours_per_user=3), dict(gpu_hours_per_session=3)])
def test_an_edit_or_extension_past_the_limit_is_refused_and_a_shrink_allowed(limits):
    cal = calendar(**limits)
    book(cal, ask(gpus=1, hours=2, at=1), "a1")
    book(cal, ask(gpus=1, hours=1, at=5), "a2")  # 3 GPU-hours: at the limit
    for change in (lambda: cal.edit("a1", ask(gpus=2, hours=2, at=1), ALICE, NOW),
                   lambda: cal.edit("a1", ask(gpus=1, hours=3, at=1), ALICE, NOW),
                   lambda: cal.set_end("a1", NOW + 4 * H, ALICE, NOW),
                   lambda: cal.set_end("a2", NOW, ALICE, NOW, by_usec=H)):
        before = dict(cal.bookings)
        with pytest.raises(LimitExceeded, match="max_booked_gpu_hours_per_"):
            change()
        assert cal.bookings == before
        cal.check_invariants()
    # the same GPU-hours in another shape, or fewer, pass
    moved, _ = cal.edit("a1", ask(gpus=2, hours=1, at=2), ALICE, NOW)
    assert moved.gpu_usec == 2 * H
    cal.set_end("a2", NOW + 5 * H + H // 2, ALICE, NOW)  # a shrink
    assert booked_hours(cal, ALICE) == 2.5
    cal.set_end("a2", NOW + 6 * H, ALICE, NOW)  # back up to the limit
    assert booked_hours(cal, ALICE) == 3
    cal.check_invariants()


def test_a_shrink_is_allowed_even_over_a_limit_lowered_meanwhile():
    cal = calendar()
    book(cal, ask(gpus=2, hours=4, at=1), "a1")
    cal.limits = replace(cal.limits, gpu_hours_per_user=2, gpu_hours_per_session=2)
    cal.set_end("a1", NOW + 4 * H, ALICE, NOW)  # 8 -> 6: still over, but less
    cal.edit("a1", ask(gpus=1, hours=3, at=1), ALICE, NOW)  # 6 -> 3
    with pytest.raises(LimitExceeded):
        cal.set_end("a1", NOW + 5 * H, ALICE, NOW)  # 3 -> 4: more
    assert booked_hours(cal, ALICE) == 3
    cal.check_invariants()


def test_a_cancelled_or_ended_booking_frees_its_hours():
    cal = calendar(gpu_hours_per_user=2, gpu_hours_per_session=2)
    book(cal, ask(gpus=2, hours=1, at=1), "a1")
    with pytest.raises(LimitExceeded):
        book(cal, ask(gpus=1, hours=1, at=3), "a2")
    cal.cancel("a1", ALICE, NOW)
    assert booked_hours(cal, ALICE) == 0 and cal._booked_of == {}
    book(cal, ask(gpus=2, hours=1, at=0), "a3")  # starts now
    cal.due(NOW)
    assert cal.bookings["a3"].state != SCHEDULED
    with pytest.raises(LimitExceeded):
        book(cal, ask(gpus=1, hours=1, at=3), "a4")
    cal.due(NOW + H)  # it ended
    assert cal.bookings["a3"].state == ENDED
    book(cal, ask(gpus=2, hours=1, at=3), "a4", now=NOW + H)
    cal.check_invariants()


def test_a_reloaded_calendar_counts_the_same_hours():
    from resourced.daemon.store.calendar import booking_from_record, booking_to_record

    cal = calendar(gpu_hours_per_session=3)
    book(cal, ask(gpus=2, hours=1, at=0), "a1", session="a")
    book(cal, ask(vram=GIB, hours=1, at=0), "b1", session="b")
    cal.cancel("b1", ALICE, NOW)
    records = {k: booking_from_record(booking_to_record(b)) for k, b in cal.bookings.items()}
    again = calendar(gpu_hours_per_session=3)
    again.load(records, {}, {})
    again.check_invariants()
    assert again._booked_of == cal._booked_of and again.bookings["a1"].session == "a"
    with pytest.raises(LimitExceeded):
        book(again, ask(gpus=2, hours=1, at=2), "a2", session="a")


# == properties =============================================================================


UIDS = (1000, 1001)
SESSIONS = ("a", "b", "")


def recount(claims) -> dict:
    """What counts_of must say, from the claims alone."""
    out: dict = {}
    for c in claims:
        for key in (c.uid, (c.uid, c.session)):
            n, waiting, gpus = out.get(key, (0, 0, 0))
            out[key] = (n + 1, waiting + (c.state == QUEUED),
                        gpus + (c.demand.gpus or (1 if c.demand.vram else 0)))
    return out


class SessionLedgerMachine(RuleBasedStateMachine):
    """Whatever is submitted, waited for, granted, released or restored, the per-user and
    per-(user, session) counters agree with the claims."""

    claims = Bundle("claims")

    @initialize(memory=st.lists(st.sampled_from([0, 4, 8]), min_size=0, max_size=3))
    def inventory(self, memory):
        self.gpus = [Gpu(index=i, uuid=f"GPU-{i:02d}", memory_bytes=m)
                     for i, m in enumerate(memory)]
        self.pools = [Pool("cpu", 4)]
        self.ledger = Ledger(self.gpus, self.pools)
        self.n = 0

    @rule(target=claims, uid=st.sampled_from(UIDS), session=st.sampled_from(SESSIONS),
          kind=st.sampled_from(["gpus", "vram", "cpu"]), amount=st.integers(1, 4),
          wait=st.booleans(), mode=st.sampled_from(["dev", "run"]))
    def submit(self, uid, session, kind, amount, wait, mode):
        self.n += 1
        demand = Demand.of(**({kind: amount} if kind != "cpu" else {"pools": {"cpu": amount}}))
        request = ClaimRequest(demand, mode, ProcessRef(self.n, 1), uid=uid, session=session)
        try:
            self.ledger.submit(request, f"c{self.n}", self.n, wait=wait)
        except (NotEnoughGPUs, NotEnoughCapacity, NoSuchPool):
            pass  # it could never fit: refused at once, nothing changed
        return f"c{self.n}"

    @rule(target=claims, uid=st.sampled_from(UIDS), session=st.sampled_from(SESSIONS),
          data=st.data())
    def booking_starts(self, uid, session, data):
        """A booking's claim (mode ``booking``) counts for its session like any claim."""
        if not self.gpus:
            return "none"
        on = data.draw(st.lists(st.sampled_from([g.uuid for g in self.gpus]), min_size=1,
                                unique=True), label="on")
        self.n += 1
        self.ledger.start_booking(f"b{self.n}", Demand.of(gpus=len(on)), tuple(sorted(on)),
                                  uid, f"u{uid}", "", "", self.n, self.n + 100, session=session)
        return f"b{self.n}"

    @rule(claim_id=claims, reason=st.sampled_from(["released", "stopped", "cancelled"]))
    def release(self, claim_id, reason):
        try:
            self.ledger.release(claim_id, reason)
        except NoSuchClaim:
            pass

    @rule(claim_id=claims)
    def owner_died(self, claim_id):
        self.n += 1
        self.ledger.owner_died(claim_id, self.n)

    @rule(uid=st.sampled_from(UIDS), session=st.sampled_from(SESSIONS))
    def stop_a_session(self, uid, session):
        """What the engine's stop does to the ledger: every claim of the session goes."""
        for c in [c for c in self.ledger.claims.values()
                  if c.uid == uid and c.session == session]:
            self.ledger.release(c.id, "stopped")
        assert self.ledger.counts_of(uid, session) == (0, 0, 0)

    @rule()
    def restart(self):
        records = [claim_from_record(claim_to_record(c)) for c in self.ledger.claims.values()]
        again = Ledger(self.gpus, self.pools)
        again.restore(records)
        assert {k: c.session for k, c in again.claims.items()} == \
            {k: c.session for k, c in self.ledger.claims.items()}
        self.ledger = again

    @invariant()
    def counters_agree_with_the_claims(self):
        self.ledger.check_invariants()
        expected = recount(self.ledger.claims.values())
        for uid in UIDS:
            assert self.ledger.counts_of(uid) == expected.get(uid, (0, 0, 0))
            per_session = [self.ledger.counts_of(uid, s) for s in SESSIONS]
            for s, got in zip(SESSIONS, per_session):
                assert got == expected.get((uid, s), (0, 0, 0)), (uid, s)
            assert tuple(map(sum, zip(*per_session))) == self.ledger.counts_of(uid)


SessionLedgerMachine.TestCase.settings = settings(
    max_examples=100, stateful_step_count=30, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])
TestSessionLedger = SessionLedgerMachine.TestCase


LIMIT_USER, LIMIT_SESSION = 6, 4  # GPU-hours


class HoursMachine(RuleBasedStateMachine):
    """No sequence of bookings, edits, extensions, cancels and time takes a user or one of
    its sessions past its booked GPU-hours (root aside), and the counters stay exact."""

    def __init__(self):
        super().__init__()
        self.cal = calendar(per_user=0, gpu_hours_per_user=LIMIT_USER,
                            gpu_hours_per_session=LIMIT_SESSION)
        self.now = NOW
        self.n = 0

    def _pick(self, data):
        live = sorted(k for k, b in self.cal.bookings.items() if b.state != ENDED)
        return self.cal.bookings[data.draw(st.sampled_from(live))] if live else None

    @rule(uid=st.sampled_from([ALICE, BOB, 0]), session=st.sampled_from(["a", "b"]),
          gpus=st.integers(0, 3), vram=st.booleans(), hours=st.integers(1, 4),
          at=st.integers(0, 24))
    def book(self, uid, session, gpus, vram, hours, at):
        self.n += 1
        request = ask(0, GIB, hours, at) if vram else ask(gpus, 0, hours, at, cpu=0 if gpus else 1)
        try:
            book(self.cal, request, f"b{self.n}", uid=uid, session=session, now=self.now)
        except (LimitExceeded, NotEnoughCapacity, InvalidArgs):
            pass

    @rule(data=st.data(), gpus=st.integers(1, 3), hours=st.integers(1, 4), at=st.integers(0, 24))
    def edit(self, data, gpus, hours, at):
        b = self._pick(data)
        if b is None:
            return
        try:
            self.cal.edit(b.id, ask(gpus, 0, hours, at), b.uid, self.now)
        except (LimitExceeded, NotEnoughCapacity, InvalidArgs):
            pass

    @rule(data=st.data(), hours=st.integers(-3, 3))
    def change_end(self, data, hours):
        b = self._pick(data)
        if b is None:
            return
        try:
            self.cal.set_end(b.id, b.end_usec + hours * H, b.uid, self.now)
        except (LimitExceeded, NotEnoughCapacity, InvalidArgs):
            pass

    @rule(data=st.data())
    def cancel(self, data):
        b = self._pick(data)
        if b is not None:
            self.cal.cancel(b.id, b.uid, self.now)

    @rule(hours=st.integers(0, 3))
    def time_passes(self, hours):
        self.now += hours * H
        self.cal.due(self.now)

    @invariant()
    def within_the_limits(self):
        self.cal.check_invariants()
        for uid in (ALICE, BOB):
            assert booked_hours(self.cal, uid) <= LIMIT_USER
            for session in ("a", "b"):
                assert booked_hours(self.cal, uid, session) <= LIMIT_SESSION


HoursMachine.TestCase.settings = settings(max_examples=100, stateful_step_count=25,
                                          deadline=None)
TestBookedHours = HoursMachine.TestCase


def test_the_gpus_in_the_calendar_tests_are_three():
    assert len(GPUS) == 3  # the shapes above (3 GPUs at once at most) rely on it
