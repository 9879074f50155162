"""Per-user limits: refused with LimitExceeded before any work, root exempt."""

import asyncio
import os

import pytest

from resourced.backends.simulated import SimulatedBackend
from resourced.config import DaemonConfig
from resourced.core.claims import ClaimRequest, Demand, ProcessRef
from resourced.engine import Caller, Engine
from resourced.errors import LimitExceeded

USER = 1000


async def started(claims_of_user: int, waiting_of_user: int, **limits) -> Engine:
    """A started engine on 2 simulated GPUs whose ledger already holds ``claims_of_user``
    claims of USER (whole GPUs), the last ``waiting_of_user`` of them waiting."""
    engine = Engine(SimulatedBackend(count=2), settings=DaemonConfig(**limits))
    await engine.start()
    owner = ProcessRef(os.getpid(), 0)
    for i in range(claims_of_user):
        request = ClaimRequest(Demand.of(gpus=1), "dev", owner, uid=USER)
        _, refusal = engine.ledger.submit(request, f"c{i}", 0, wait=i >= claims_of_user - waiting_of_user)
        assert refusal is None
    assert engine.ledger.counts_of(USER) == (claims_of_user, waiting_of_user)
    return engine


def run(coro):
    return asyncio.run(coro)


@pytest.mark.parametrize("wait", [False, True])
def test_a_user_at_the_claims_limit_is_refused(wait):
    async def go():
        engine = await started(2, 0, max_claims_per_user=2)
        try:
            with pytest.raises(LimitExceeded, match="max_claims_per_user"):
                await engine.claim(Caller(USER, os.getpid()), Demand.of(gpus=1), "dev", wait=wait)
        finally:
            engine.close()
    run(go())


def test_a_user_at_the_waiting_limit_may_not_wait_again():
    async def go():
        engine = await started(3, 1, max_waiting_per_user=1)
        try:
            with pytest.raises(LimitExceeded, match="max_waiting_per_user"):
                await engine.claim(Caller(USER, os.getpid()), Demand.of(gpus=1), "dev", wait=True)
        finally:
            engine.close()
    run(go())


def test_root_is_exempt_and_zero_means_no_limit():
    async def go():
        engine = await started(3, 1, max_claims_per_user=1, max_waiting_per_user=1)
        try:
            for _ in range(3):  # root: no limit applies, so this reaches the queue
                claim, _ = await engine.claim(Caller(0, os.getpid()), Demand.of(gpus=1), "dev",
                                              wait=True)
                assert claim.state == "queued"
            engine.settings = DaemonConfig(max_claims_per_user=0, max_waiting_per_user=0)
            engine._check_limits(Caller(USER, os.getpid()), wait=True)  # no limit: no error
        finally:
            engine.close()
    run(go())
