"""The usage history: each ended claim's hold, written in batches, and the load samples."""

import asyncio
import logging
import sqlite3

from resourced.core.claims import (
    BOOKING,
    Claim,
)
from resourced.core.lifecycle import (
    GRANTED,
)
from resourced.core.usage import Hold as UsageHold
from resourced.core.usage import report as usage_report

from ..store.usage import retention as usage_retention
from .alarms import PRUNE_INTERVAL

log = logging.getLogger("resourced")

HOLDS_WRITTEN_AFTER = 1.0
"""Seconds an ended claim's hold may wait to be written to the usage history, with the
others of that second, in one transaction (before any read of the history, and at
close).  A crash loses at most these, as the history's own WAL may lose its last
commits: a write for every release cost about a twentieth of a claim and release."""


class UsageHistory:
    """What the engine keeps of past use (``UsageStore``)."""

    def __init__(self, engine):
        self.engine = engine
        self._sampler: asyncio.Task | None = None
        self._holds: list[UsageHold] = []  # ended holds not yet written (HOLDS_WRITTEN_AFTER)
        self._holds_due: asyncio.TimerHandle | None = None

    def start(self) -> None:
        """Sample the GPUs' load, where a history is kept."""
        if self.engine.usage_store is not None:
            self._sampler = asyncio.ensure_future(self._sample())

    def close(self) -> None:
        if self._sampler:
            self._sampler.cancel()
        self.write_holds()

    def keep_hold(self, claim: Claim) -> None:
        """A claim ended: into the usage history with the time its owner used it (written
        after the reply, like the audit lines)."""
        used = self.engine.tracker.used_usec.pop(claim.id, 0)
        granted = self.engine.tracker.granted_at.pop(claim.id, claim.created_usec)
        if self.engine.usage_store is None or claim.state != GRANTED or not claim.gpus:
            return
        self._holds.append(self._hold_of(claim, self.engine.clock(), used, granted))
        if self._holds_due is None:
            self._holds_due = asyncio.get_running_loop().call_later(HOLDS_WRITTEN_AFTER,
                                                                    self.write_holds)

    def write_holds(self) -> None:
        """The ended holds not yet in the usage history, in one transaction."""
        if self._holds_due is not None:
            self._holds_due.cancel()
            self._holds_due = None
        holds, self._holds = self._holds, []
        if holds:
            self._write_usage(self.engine.usage_store.record_holds, holds)

    def _hold_of(self, claim: Claim, now: int, used: int, granted: int | None = None
                 ) -> UsageHold:
        """A granted claim as a hold, from when it was granted (when it was asked for, if
        granted before this daemon started) until ``now``."""
        if granted is None:
            granted = self.engine.tracker.granted_at.get(claim.id, claim.created_usec)
        return UsageHold(claim.id, "booking" if claim.mode == BOOKING else "claim", claim.uid,
                         claim.user, claim.gpus, granted, now, used)

    def _write_usage(self, write, *args) -> None:
        try:
            write(*args)
        except (OSError, sqlite3.Error) as exc:
            log.error("cannot record usage in %s: %s", self.engine.usage_store.path, exc)

    async def _sample(self) -> None:
        """Every sample_interval, each GPU's utilisation and memory into the history;
        what is past its retention goes once an hour."""
        pruned = 0
        while True:
            await asyncio.sleep(self.engine.settings.sample_interval)
            try:
                loads = await self.engine.off_loop(self.engine.backend.load)
            except Exception as exc:  # noqa: BLE001 - a missed sample, not a failure
                log.debug("no GPU load sample: %s", exc)
                continue
            now = self.engine.clock()
            managed = {u: v for u, v in loads.items() if u in self.engine.ledger.gpus}
            self._write_usage(self.engine.usage_store.record_load, now, managed)
            if now - pruned >= PRUNE_INTERVAL:
                pruned = now
                self._write_usage(self.engine.usage_store.prune, now,
                                  usage_retention(self.engine.settings))

    def usage(self, since_usec: int, until_usec: int, uid: int | None = None,
              by_gpu: bool = False) -> list[dict]:
        """Held, used and idle GPU-hours per user (or per GPU, with mean load) within the
        window: the history, and the live claims so far."""
        now = self.engine.clock()
        self.write_holds()  # the history read whole
        store = self.engine.usage_store
        holds = store.holds(since_usec, until_usec, uid) if store else []
        holds += [self._hold_of(c, now, self.engine.tracker.used_usec.get(c.id, 0))
                  for c in self.engine.ledger.claims.values()
                  if c.state == GRANTED and c.gpus and (uid is None or c.uid == uid)]
        loads = self.engine.usage_store.loads(since_usec, until_usec) if (
            self.engine.usage_store and by_gpu) else []
        labels = {u: g.label for u, g in self.engine.ledger.gpus.items()}
        return usage_report(holds, loads, since_usec, until_usec, by_gpu, labels)
