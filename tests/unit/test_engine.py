"""The engine itself, in this process, on a manual clock: no bus, no daemon subprocess."""

import asyncio
import contextlib
import os

import pytest

from resourced.backends.simulated import SimulatedBackend
from resourced.config import DaemonConfig
from resourced.core.caller import Caller
from resourced.core.claims import ClaimOptions, ClaimRequest, Demand, ProcessRef
from resourced.core.clock import ManualClock
from resourced.core.ledger import ClaimReleased
from resourced.daemon.engine.engine import Engine
from resourced.errors import LimitExceeded

from ..conftest import eventually_async

ME = Caller(uid=os.getuid(), pid=os.getpid())
USER = Caller(uid=1000, pid=os.getpid())  # another user (only limits are checked before the pid)


def one_gpu(**options) -> ClaimOptions:
    """A dev claim of one GPU, with these options."""
    return ClaimOptions(Demand.of(gpus=1), "dev", **options)


def run(test):
    """Run an async test body with a deadline."""
    asyncio.run(asyncio.wait_for(test(), 10))


@contextlib.asynccontextmanager
async def engine_on(gpus: int = 1, clock: ManualClock | None = None, restored=None, **settings):
    """A started engine on simulated GPUs and a manual clock; the events it publishes."""
    engine = Engine(SimulatedBackend(count=gpus), settings=DaemonConfig(**settings),
                    clock=clock or ManualClock())
    await engine.start(restored)
    events: list = []
    engine.subscribe(events.extend)
    try:
        yield engine, events
    finally:
        engine.close()


def users_claims(engine: Engine, n: int, waiting: int) -> None:
    """``n`` whole-GPU claims of USER in the ledger, the last ``waiting`` of them waiting."""
    for i in range(n):
        request = ClaimRequest(Demand.of(gpus=1), "dev", ProcessRef(os.getpid(), 0), uid=USER.uid)
        _, refusal = engine.ledger.submit(request, f"u{i}", 0, wait=i >= n - waiting)
        assert refusal is None
    assert engine.ledger.counts_of(USER.uid)[:2] == (n, waiting)


# -- deadlines on the clock -------------------------------------------------------------------


def test_a_waiter_leaves_the_queue_when_its_deadline_passes_on_the_clock():
    async def test():
        clock = ManualClock()
        async with engine_on(clock=clock) as (engine, events):
            await engine.claim(ME, one_gpu())
            waiter, _ = await engine.claim(ME, one_gpu(wait=True, queue_timeout_usec=30_000_000))
            assert waiter.queue_deadline_usec == clock() + 30_000_000  # in the claim as committed
            clock.advance(29.9)
            engine.alarms.run_due()
            assert waiter.id in engine.ledger.claims
            clock.advance(0.1)
            engine.alarms.run_due()
            assert waiter.id not in engine.ledger.claims
            assert [e.reason for e in events if isinstance(e, ClaimReleased)] == ["timeout"]
    run(test)


def test_a_waiter_served_in_time_has_no_deadline_left():
    async def test():
        clock = ManualClock()
        async with engine_on(clock=clock) as (engine, _):
            holder, _ = await engine.claim(ME, one_gpu())
            waiter, _ = await engine.claim(ME, one_gpu(wait=True, queue_timeout_usec=30_000_000))
            await engine.release(ME, holder.id)
            for _ in range(100):  # the walk that serves GPU waiters probes first
                if engine.ledger.claims[waiter.id].state == "granted":
                    break
                await asyncio.sleep(0.01)
            assert engine.ledger.claims[waiter.id].state == "granted"
            assert len(engine.alarms.deadlines) == 0
            clock.advance(60)
            engine.alarms.run_due()
            assert waiter.id in engine.ledger.claims
    run(test)


def test_a_restored_waiter_whose_deadline_passed_meanwhile_leaves_at_start():
    async def test():
        clock = ManualClock()
        async with engine_on(clock=clock) as (engine, _):
            await engine.claim(ME, one_gpu())
            waiter, _ = await engine.claim(ME, one_gpu(wait=True, queue_timeout_usec=5_000_000))
            saved = dict(engine.ledger.claims)
        clock.advance(10)
        async with engine_on(clock=clock, restored=saved) as (again, _):
            assert waiter.id not in again.ledger.claims
    run(test)


@pytest.mark.parametrize("timeout", [None, 0])
def test_no_timeout_or_a_zero_one(timeout):
    async def test():
        async with engine_on() as (engine, _):
            await engine.claim(ME, one_gpu())
            waiter, _ = await engine.claim(ME, one_gpu(wait=True, queue_timeout_usec=timeout))
            engine.alarms.run_due()
            assert (waiter.id in engine.ledger.claims) == (timeout is None)
    run(test)


# -- per-user limits: refused before any work, root exempt -------------------------------------


@pytest.mark.parametrize("limits, claims, waiting, wait, says", [
    (dict(max_claims_per_user=2), 2, 0, False, "max_claims_per_user"),
    (dict(max_claims_per_user=2), 2, 0, True, "max_claims_per_user"),
    (dict(max_waiting_per_user=1), 3, 1, True, "max_waiting_per_user"),
])
def test_a_user_at_a_limit_is_refused(limits, claims, waiting, wait, says):
    async def test():
        async with engine_on(gpus=2, **limits) as (engine, _):
            users_claims(engine, claims, waiting)
            with pytest.raises(LimitExceeded, match=says):
                await engine.claim(USER, one_gpu(wait=wait))
    run(test)


def test_root_is_limited_unless_exempt_and_zero_means_no_limit():
    async def test():
        async with engine_on(gpus=2, max_claims_per_user=1, max_waiting_per_user=1) as (engine, _):
            users_claims(engine, 3, 1)
            root = Caller(0, os.getpid())
            claim, _ = await engine.claim(root, one_gpu(wait=True))
            with pytest.raises(LimitExceeded, match="max_claims_per_user"):
                await engine.claim(root, one_gpu(wait=True))  # root too
            engine.apply_settings(DaemonConfig(max_claims_per_user=1, max_waiting_per_user=1,
                                               exempt_users=("root",)))
            for _ in range(3):  # exempt by name: no per-user limit, so this reaches the queue
                claim, _ = await engine.claim(root, one_gpu(wait=True))
                assert claim.state == "queued"
            engine.settings = DaemonConfig(max_claims_per_user=0, max_waiting_per_user=0)
            engine._check_limits(USER, wait=True, demand=Demand.of(gpus=1))  # no limit: no error
    run(test)


def test_on_a_simulated_clock_a_sweep_runs_as_soon_as_the_clock_moves(monkeypatch):
    """The sweep's own interval is made an hour: only the clock moving can start one."""
    from resourced.daemon.engine import tracking

    monkeypatch.setattr(tracking, "TRACK_INTERVAL", 3600.0)

    async def test():
        clock = ManualClock()
        engine = Engine(SimulatedBackend(count=1), settings=DaemonConfig(idle_after=60),
                        clock=clock, poll_clock=True)
        await engine.start(None)
        try:
            claim, _ = await engine.claim(ME, one_gpu())
            for _ in range(2):  # the first look opens the idle window, the second closes it
                clock.advance(61)
                engine.alarms.run_due()
                await eventually_async(lambda: engine.tracker._looked == clock(),
                                       what="a sweep at the time")
            await eventually_async(lambda: claim.id not in engine.ledger.claims,
                                   what="the idle claim released")
        finally:
            engine.close()
    run(test)
