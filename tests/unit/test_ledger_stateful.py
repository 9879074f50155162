"""No sequence of claims, releases and owner deaths ever grants a GPU twice.

A rule-based state machine (after Hypothesis's own cache test) drives the ledger and a
plain dict model side by side; after every step the ledger's own ``check_invariants``
runs and the two must agree on who holds what.
"""

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle, RuleBasedStateMachine, consumes, initialize, invariant, multiple, rule,
)

from resourced.core.claims import MODES, ClaimRequest, ProcessRef
from resourced.core.inventory import Gpu
from resourced.core.ledger import ClaimGranted, ClaimReleased, Ledger, OwnerDied
from resourced.errors import GPUsBusy, NoSuchClaim, NotEnoughGPUs

OWNER = ProcessRef(pid=4242, start_time=1000)


class LedgerMachine(RuleBasedStateMachine):
    claims = Bundle("claims")

    @initialize(data=st.data())
    def inventory(self, data):
        n = data.draw(st.integers(0, 8), label="gpus")
        order = data.draw(st.permutations(range(n)), label="construction order")
        self.gpus = [Gpu(index=i, uuid=f"GPU-{i:02d}") for i in range(n)]
        self.ledger = Ledger([self.gpus[i] for i in order])
        self.holders: dict[str, str] = {}  # GPU uuid -> claim id
        self.alive: dict[str, bool] = {}  # claim id -> owner alive
        self.modes: dict[str, str] = {}  # claim id -> mode
        self.clock = 0

    def snapshot(self):
        return (
            {cid: (c.mode, c.gpus, c.owner_alive) for cid, c in self.ledger.claims.items()},
            [g.uuid for g in self.ledger.free_gpus()],
        )

    def forget(self, claim_id):
        del self.alive[claim_id], self.modes[claim_id]
        self.holders = {u: c for u, c in self.holders.items() if c != claim_id}

    @rule(target=claims, n=st.integers(1, 4), mode=st.sampled_from(MODES), data=st.data())
    def grant(self, n, mode, data):
        names = [g.uuid for g in self.gpus] + ["GPU-not-here"]
        busy = data.draw(st.frozensets(st.sampled_from(names)), label="busy")
        self.clock += 1
        claim_id = f"c{self.clock}"
        free = [g.uuid for g in self.gpus if g.uuid not in self.holders]
        usable = [u for u in free if u not in busy]
        request = ClaimRequest(gpus=n, mode=mode, owner=OWNER, uid=1000)

        if len(usable) < n:
            before = self.snapshot()
            with pytest.raises(GPUsBusy if len(free) >= n else NotEnoughGPUs):
                self.ledger.grant(request, claim_id, self.clock, busy)
            assert self.snapshot() == before
            return multiple()

        events = self.ledger.grant(request, claim_id, self.clock, busy)
        claim = self.ledger.get(claim_id)
        assert events == [ClaimGranted(claim)]
        assert claim.gpus == tuple(usable[:n])
        assert not set(claim.gpus) & set(self.holders)
        self.holders.update(dict.fromkeys(claim.gpus, claim_id))
        self.alive[claim_id] = True
        self.modes[claim_id] = mode
        return claim_id

    @rule(claim_id=consumes(claims))
    def release(self, claim_id):
        if claim_id not in self.alive:  # its run-mode owner died: already gone
            before = self.snapshot()
            with pytest.raises(NoSuchClaim):
                self.ledger.release(claim_id)
            assert self.snapshot() == before
            return
        claim = self.ledger.get(claim_id)
        assert self.ledger.release(claim_id) == [ClaimReleased(claim, "released")]
        self.forget(claim_id)

    @rule(claim_id=claims)
    def owner_died(self, claim_id):
        events = self.ledger.owner_died(claim_id)
        if not self.alive.get(claim_id, False):
            assert events == []
        elif self.modes[claim_id] == "run":
            [event] = events
            assert type(event) is ClaimReleased and event.reason == "owner-exited"
            assert event.claim.id == claim_id
            self.forget(claim_id)
        else:
            assert events == [OwnerDied(self.ledger.get(claim_id))]
            self.alive[claim_id] = False

    @rule()
    def release_unknown(self):
        before = self.snapshot()
        with pytest.raises(NoSuchClaim):
            self.ledger.release("never-granted")
        assert self.snapshot() == before

    @invariant()
    def agrees_with_the_model(self):
        self.ledger.check_invariants()
        held = {g.uuid: h.id for g in self.gpus if (h := self.ledger.holder(g.uuid))}
        assert held == self.holders
        assert {cid: c.owner_alive for cid, c in self.ledger.claims.items()} == self.alive
        free = [g.uuid for g in self.ledger.free_gpus()]
        assert free == [g.uuid for g in self.gpus if g.uuid not in self.holders]
        assert len(free) == len(self.gpus) - len(self.holders)


LedgerMachine.TestCase.settings = settings(
    max_examples=100,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestLedger = LedgerMachine.TestCase
