"""The engine itself, in this process, on a manual clock: no bus, no daemon subprocess."""

import asyncio
import os

import pytest

from resourced.backends.simulated import SimulatedBackend
from resourced.core.claims import Demand
from resourced.core.clock import ManualClock
from resourced.core.ledger import ClaimReleased
from resourced.engine import Caller, Engine

ME = Caller(uid=os.getuid(), pid=os.getpid())


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 10))


async def started(gpus: int = 1) -> tuple[Engine, ManualClock, list]:
    clock = ManualClock()
    engine = Engine(SimulatedBackend(count=gpus), clock=clock)
    await engine.start()
    events: list = []
    engine.subscribe(events.extend)
    return engine, clock, events


def test_a_waiter_leaves_the_queue_when_its_deadline_passes_on_the_clock():
    async def go():
        engine, clock, events = await started()
        try:
            await engine.claim(ME, Demand.of(gpus=1), "dev")
            waiter, _ = await engine.claim(ME, Demand.of(gpus=1), "dev", wait=True, timeout=30)
            assert waiter.queue_deadline_usec == clock() + 30_000_000  # in the claim as committed
            clock.advance(29.9)
            engine.run_due()
            assert waiter.id in engine.ledger.claims
            clock.advance(0.1)
            engine.run_due()
            assert waiter.id not in engine.ledger.claims
            assert [e.reason for e in events if isinstance(e, ClaimReleased)] == ["timeout"]
        finally:
            engine.close()
    run(go())


def test_a_waiter_served_in_time_has_no_deadline_left():
    async def go():
        engine, clock, _ = await started()
        try:
            holder, _ = await engine.claim(ME, Demand.of(gpus=1), "dev")
            waiter, _ = await engine.claim(ME, Demand.of(gpus=1), "dev", wait=True, timeout=30)
            await engine.release(ME, holder.id)
            for _ in range(100):  # the walk that serves GPU waiters probes first
                if engine.ledger.claims[waiter.id].state == "granted":
                    break
                await asyncio.sleep(0.01)
            assert engine.ledger.claims[waiter.id].state == "granted"
            assert len(engine.deadlines) == 0
            clock.advance(60)
            engine.run_due()
            assert waiter.id in engine.ledger.claims
        finally:
            engine.close()
    run(go())


def test_a_restored_waiter_whose_deadline_passed_meanwhile_leaves_at_start():
    async def go():
        engine, clock, _ = await started()
        try:
            await engine.claim(ME, Demand.of(gpus=1), "dev")
            waiter, _ = await engine.claim(ME, Demand.of(gpus=1), "dev", wait=True, timeout=5)
            saved = dict(engine.ledger.claims)
        finally:
            engine.close()
        clock.advance(10)
        again = Engine(SimulatedBackend(count=1), clock=clock)
        await again.start(saved)
        try:
            assert waiter.id not in again.ledger.claims
        finally:
            again.close()
    run(go())


@pytest.mark.parametrize("timeout", [None, 0])
def test_no_timeout_or_a_zero_one(timeout):
    async def go():
        engine, clock, _ = await started()
        try:
            await engine.claim(ME, Demand.of(gpus=1), "dev")
            waiter, _ = await engine.claim(ME, Demand.of(gpus=1), "dev", wait=True,
                                           timeout=timeout)
            engine.run_due()
            assert (waiter.id in engine.ledger.claims) == (timeout is None)
        finally:
            engine.close()
    run(go())
