"""The engine's one timer: queue timeouts, claims' ends and warnings, the calendar's
starts and ends, all on the injected clock."""

import asyncio
import logging

from resourced.core.claims import (
    Claim,
)
from resourced.core.clock import Deadlines
from resourced.core.ledger import (
    ClaimEnding,
)
from resourced.core.lifecycle import (
    EXPIRED,
    GRANTED,
    QUEUED,
    TIMEOUT,
)
from resourced.linux.sd import audit
from resourced.protocol.time import HOUR, seconds_of_usec, usec_of_seconds

log = logging.getLogger("resourced")

PRUNE_INTERVAL = HOUR
"""Microseconds between forgetting ended bookings past their retention."""


class Alarms:
    """Deadlines of claims and the calendar, and the one loop timer that serves them."""

    def __init__(self, engine):
        self.engine = engine
        self.deadlines = Deadlines()  # (kind, id) -> when: see run_due
        self._alarm: asyncio.TimerHandle | None = None  # one timer, for the earliest deadline
        self._alarm_for: int | None = None  # the deadline it is set for
        self._pruned = 0
        self._now: int | None = None  # the simulated clock's now at the last run_due

    def close(self) -> None:
        if self._alarm is not None:
            self._alarm.cancel()

    def arm_timeout(self, claim: Claim) -> None:
        if claim.state == QUEUED and claim.queue_deadline_usec:
            self.deadlines.set(("queue", claim.id), claim.queue_deadline_usec)
            self.rearm()

    def arm_until(self, claim: Claim) -> None:
        """A granted claim's end (its own, or a booking's start), and the warning before
        (both replacing any set before: the end may have moved, or gone)."""
        self.deadlines.cancel(("until", claim.id))
        self.deadlines.cancel(("warn", claim.id))
        if claim.state != GRANTED or not claim.until_usec:
            return
        if claim.mode != "booking":  # a booking's claim ends with the booking
            self.deadlines.set(("until", claim.id), claim.until_usec)
        warn = claim.until_usec - usec_of_seconds(self.engine.settings.warn_before)
        if warn > self.engine.clock():
            self.deadlines.set(("warn", claim.id), warn)
        self.rearm()

    def run_due(self) -> None:
        """Act on every deadline due by the clock's now: a waiter's queue timeout
        (``queue``), a claim's end or a booking's start on what it holds (``until``), the
        warning before either (``warn``), and the calendar's starts and ends.  The alarm
        calls this, and so does every operation before deciding (tests with a manual clock
        call it after moving the clock).  A simulated clock that moved starts a tracking
        sweep too."""
        now = self.engine.clock()
        if self.engine.poll_clock and now != self._now:
            self._now = now
            self.engine.tracker.clock_moved()
        for kind, claim_id in self.deadlines.due(now):
            if kind == "queue":
                self._queue_timeout(claim_id)
            elif kind == "until":
                self._until_reached(claim_id)
            elif kind == "warn" and claim_id in self.engine.ledger.claims:
                self.engine.commit([ClaimEnding(self.engine.ledger.claims[claim_id])])
        when = self.engine.calendar.next_due()
        if when is not None and when <= now:
            events, _ = self.engine.calendar.due(now)
            self.engine.bookings.changed(events)
        if now - self._pruned >= PRUNE_INTERVAL:
            self._pruned = now
            gone = self.engine.calendar.prune(now)
            if gone and self.engine.calendar_store is not None:
                self.engine.bookings.record([], forgotten=gone)
        self.rearm()

    def rearm(self) -> None:
        """One loop timer, for the earliest deadline (at least each second on a simulated
        clock, which may jump); left as it is when that deadline has not changed (every
        operation runs the deadlines first: the timer is not made again each time)."""
        when = min((w for w in (self.deadlines.next(), self.engine.calendar.next_due())
                    if w is not None), default=None)
        if self._alarm is not None and not self.engine.poll_clock and when == self._alarm_for:
            return
        if self._alarm is not None:
            self._alarm.cancel()
            self._alarm = None
        self._alarm_for = when
        if when is not None or self.engine.poll_clock:
            delay = 1.0 if when is None else max(0.0, seconds_of_usec(when - self.engine.clock()))
            if self.engine.poll_clock:
                delay = min(delay, 1.0)
            self._alarm = asyncio.get_running_loop().call_later(delay, self._alarm_rang)

    def _alarm_rang(self) -> None:
        self._alarm = None  # spent: run_due sets the next one, even for the same deadline
        self.run_due()

    def _until_reached(self, claim_id: str) -> None:
        """A claim's time is up: its own end releases it; a booking's start makes it
        overdue (asked back by the booking's claim)."""
        claim = self.engine.ledger.claims.get(claim_id)
        if claim is None or claim.state != GRANTED:
            return
        if claim.until_booking:
            audit(f"{claim_id} is past its time: booking {claim.until_booking} needs what it "
                  "holds", priority=5, claim=claim_id, uid=claim.uid, event="overdue")
            self.engine.commit(self.engine.ledger.overdue(claim_id, busy=None))
        else:
            self.engine.end(claim_id, EXPIRED, None, "")

    def _queue_timeout(self, claim_id: str) -> None:
        claim = self.engine.ledger.claims.get(claim_id)
        if claim is not None and claim.state == QUEUED:
            self.engine.commit(self.engine.ledger.release(claim_id, TIMEOUT, busy=None))
