"""The lifecycles of a claim, a booking and a booked job: their states, the only moves
between them, and the reasons one ends.

Every change of state goes through ``move`` and every end through ``end``, so a state or
a reason outside these tables is a bug that raises at once (``Internal``), never a value
that a client, a log or the usage history would carry on.  The strings are the wire's:
they appear in JSON, in signals and in the logs, and never change.
"""

import functools
from collections.abc import Mapping
from dataclasses import dataclass

from resourced.errors import Internal


@dataclass(frozen=True)
class Lifecycle:
    """The states of one kind of thing, where a new one starts, and the moves allowed."""

    name: str
    first: frozenset[str]
    moves: Mapping[str, frozenset[str]]
    ends: frozenset[str]
    """Why one reaches a final state (for a job: the final states themselves)."""

    @functools.cached_property
    def states(self) -> frozenset[str]:
        return frozenset(self.moves).union(*self.moves.values(), self.first)

    @functools.cached_property
    def final(self) -> frozenset[str]:
        return frozenset(s for s in self.states if not self.moves.get(s))

    def allows(self, old: str, new: str) -> bool:
        return new in self.moves.get(old, ())

    def start(self, state: str) -> str:
        if state not in self.first:
            raise Internal(f"a {self.name} cannot start {state}")
        return state

    def move(self, old: str, new: str) -> str:
        """``new``, where the table lets ``old`` become it."""
        if not self.allows(old, new):
            raise Internal(f"a {self.name} that is {old} cannot become {new}")
        return new

    def end(self, reason: str) -> str:
        """``reason``, where it is one of the table's ends."""
        if reason not in self.ends:
            raise Internal(f"{reason!r} is not how a {self.name} ends")
        return reason


# -- claims -----------------------------------------------------------------------------
QUEUED, GRANTED, ENDED = "queued", "granted", "ended"
"""A claim waits, holds, or has ended (then it is in the history, no longer held)."""

RELEASED = "released"          # by its owner (or an administrator), in use or not
FORCED = "forced"              # released though its processes still ran (--force)
CANCELLED = "cancelled"        # a queued claim taken back, or a grant undone
EXPIRED = "expired"            # its time (--for, a booking's end) was up
TIMEOUT = "timeout"            # a queued claim that waited longer than it would
IDLE = "idle"                  # a claim nothing used for [daemon] idle_release
STOPPED = "stopped"            # gpuctl stop: its session or user was stopped
DEAD_OWNER = "dead-owner"      # a dev claim whose owner died, after the grace
OWNER_EXITED = "owner-exited"  # a run claim whose owner and members are gone
JOB_ENDED = "job-ended"        # a Slurm job's epilog, or its processes gone
BOOKING_ENDED = "booking-"
"""A booking's claim ends with its booking: this prefix and how the booking ended
(``booking-cancelled``, ``booking-released``, ``booking-no-show``; ``expired`` as is)."""

# -- bookings ---------------------------------------------------------------------------
SCHEDULED, ACTIVE = "scheduled", "active"
NO_SHOW = "no-show"            # active, but its owner never used its GPUs

BOOKING = Lifecycle(
    "booking",
    first=frozenset({SCHEDULED}),
    moves={SCHEDULED: frozenset({ACTIVE, ENDED}), ACTIVE: frozenset({ENDED})},
    ends=frozenset({CANCELLED, RELEASED, EXPIRED, NO_SHOW}),
)

CLAIM = Lifecycle(
    "claim",
    first=frozenset({QUEUED, GRANTED}),
    moves={QUEUED: frozenset({GRANTED, ENDED}), GRANTED: frozenset({ENDED})},
    ends=frozenset({RELEASED, FORCED, CANCELLED, EXPIRED, TIMEOUT, IDLE, STOPPED, DEAD_OWNER,
                    OWNER_EXITED, JOB_ENDED}
                   | {BOOKING_ENDED + how for how in BOOKING.ends - {EXPIRED}}),
)

# -- booked jobs (a booking's command, started by the runner) ---------------------------
PENDING, RUNNING = "pending", "running"
SUCCEEDED, FAILED, TIMED_OUT, MISSED = "succeeded", "failed", "timed-out", "missed"

JOB = Lifecycle(
    "job",
    first=frozenset({PENDING}),
    moves={PENDING: frozenset({RUNNING, CANCELLED, MISSED, FAILED}),
           RUNNING: frozenset({SUCCEEDED, FAILED, TIMED_OUT, CANCELLED})},
    ends=frozenset({SUCCEEDED, FAILED, TIMED_OUT, CANCELLED, MISSED}),
)
"""A final state is final, and nothing goes back to pending or to running: that is what
makes a command start at most once."""
JOB_STATES = (PENDING, RUNNING, SUCCEEDED, FAILED, TIMED_OUT, CANCELLED, MISSED)
"""In the order ``gpuctl bookings`` and the daemon's ReportJob know them."""

LIFECYCLES = (CLAIM, BOOKING, JOB)
