"""Advisory RAM and disk health: limits in, levels and level changes out.  No I/O, no clock.

Theory of operation.  Each ``[[check]]`` of the configuration is measured now and then
(``evidence/host.py`` does that, off the event loop) and the figures come here:
``level_for`` turns a check's limits and one ``Measurement`` into a level, and a
``HealthBook`` remembers each check's current state and says, as ``LevelChanged`` events,
exactly when a level changes.  The caller does the I/O: it measures, logs, and signals.

Levels, per check:

    OK           no limit reached
    WARN         a warn_* limit reached
    STOP         a stop_* limit reached (the highest level reached wins)
    ERROR        the measurement failed (a missing path, an unreadable /proc/meminfo)
    UNAVAILABLE  no answer in time (a hung network mount), or not measured yet

Limits are inclusive, as the predecessor documented: ``*_free_gib`` and ``*_free_pct``
are reached when the free amount is at or below the limit, ``*_used_pct`` when the used
share is at or above it.  The comparisons are exact (fractions, and a limit is taken as
the decimal it was written as), so 15 % free reaches ``warn_free_pct = 15`` however the
total is made up.

The machine's health is the worst of its checks, in the order

    OK < UNAVAILABLE < ERROR < WARN < STOP

ERROR and UNAVAILABLE are never healthy: one failed check among OK ones makes the
machine ERROR (or UNAVAILABLE), never OK.  But a limit that is known to be reached says
more than a figure that could not be had, so a WARN or STOP elsewhere outranks them; the
failed check stays visible in the list of checks with its reason and its limits.  With no
checks configured the machine is OK: nothing is limited.  Levels are advice; nothing in
resourced blocks or kills anything because of them.
"""

from collections.abc import Iterable
from dataclasses import dataclass, field
from fractions import Fraction

from resourced.protocol.amounts import format_bytes


@dataclass(frozen=True)
class CheckEntry:
    """One ``[[check]]`` of the configuration: an advisory RAM or disk limit; unset
    thresholds are None."""

    name: str
    type: str                        # "ram" or "disk"
    path: str | None = None          # the disk's mount point (disk only)
    warn_free_gib: float | None = None
    stop_free_gib: float | None = None
    warn_free_pct: float | None = None
    stop_free_pct: float | None = None
    warn_used_pct: float | None = None
    stop_used_pct: float | None = None


__all__ = [
    "ERROR",
    "FAILURES",
    "LEVELS",
    "LIMIT_KEYS",
    "NOT_MEASURED",
    "OK",
    "REMOVED",
    "STOP",
    "UNAVAILABLE",
    "WARN",
    "CheckState",
    "HealthBook",
    "LevelChanged",
    "Measurement",
    "level_for",
    "limits_of",
    "worst",
]

OK = "OK"
WARN = "WARN"
STOP = "STOP"
ERROR = "ERROR"
UNAVAILABLE = "UNAVAILABLE"

LEVELS = (OK, WARN, STOP)
"""The levels a measurement can give."""

FAILURES = (ERROR, UNAVAILABLE)
"""The levels of a check that has no measurement; never healthy."""

_RANK = {OK: 0, UNAVAILABLE: 1, ERROR: 2, WARN: 3, STOP: 4}

NOT_MEASURED = "not measured yet"
"""The reason of a check that has no measurement so far (level UNAVAILABLE)."""

REMOVED = "no longer checked (removed from the configuration)"
"""The reason of the change to OK of a check that a reload removed."""

GIB = 1024**3

# The limit keys of a [[check]], in the configuration's order; _ORDER is the order they are
# tried in: STOP before WARN, so the first limit reached is of the highest level reached.
LIMIT_KEYS = (
    "warn_free_gib", "stop_free_gib", "warn_free_pct", "stop_free_pct",
    "warn_used_pct", "stop_used_pct",
)
_ORDER = ("stop_free_gib", "stop_free_pct", "stop_used_pct",
          "warn_free_gib", "warn_free_pct", "warn_used_pct")


@dataclass(frozen=True)
class Measurement:
    """One reading of a check: bytes free (available to unprivileged users) and in all."""

    free_bytes: int
    total_bytes: int

    def __post_init__(self):
        if self.total_bytes <= 0:
            raise ValueError(f"the total size is {self.total_bytes} bytes; nothing to measure")
        if self.free_bytes < 0:
            raise ValueError(f"the free amount is negative ({self.free_bytes} bytes)")

    @property
    def used_bytes(self) -> int:
        return max(0, self.total_bytes - self.free_bytes)

    @property
    def free_pct(self) -> float:
        return self.free_bytes * 100 / self.total_bytes

    @property
    def used_pct(self) -> float:
        return self.used_bytes * 100 / self.total_bytes


@dataclass(frozen=True)
class CheckState:
    """What is known about one check now.  ``measurement`` is None for ERROR/UNAVAILABLE."""

    name: str
    type: str
    path: str | None
    limits: dict[str, float] = field(hash=False)
    level: str
    measurement: Measurement | None
    reason: str


@dataclass(frozen=True)
class LevelChanged:
    """A check's level changed from ``old`` to ``new``; ``reason`` says why it is ``new``."""

    check: str
    old: str
    new: str
    reason: str


def limits_of(check: CheckEntry) -> dict[str, float]:
    """The limits ``check`` sets, by key, in the configuration's key order."""
    return {k: getattr(check, k) for k in LIMIT_KEYS if getattr(check, k) is not None}


def _exact(limit: float) -> Fraction:
    # The decimal the user wrote: 99.9 is 999/10, not the binary float just above it.
    return Fraction(repr(float(limit)))


def _reached(key: str, limit: float, m: Measurement) -> str | None:
    """The reason ``key`` is reached by ``m``, or None."""
    bound = _exact(limit)
    if key.endswith("_free_gib"):
        if Fraction(m.free_bytes) <= bound * GIB:
            return f"free {format_bytes(m.free_bytes)} <= {key} {limit:g}"
    elif key.endswith("_free_pct"):
        if Fraction(m.free_bytes * 100, m.total_bytes) <= bound:
            return f"free {m.free_pct:.1f}% <= {key} {limit:g}"
    elif Fraction(m.used_bytes * 100, m.total_bytes) >= bound:
        return f"used {m.used_pct:.1f}% >= {key} {limit:g}"
    return None


def level_for(check: CheckEntry, m: Measurement) -> tuple[str, str]:
    """The highest level ``m`` reaches under ``check``'s limits, and the limit that did it."""
    limits = limits_of(check)
    for key in _ORDER:
        if key in limits:
            reason = _reached(key, limits[key], m)
            if reason is not None:
                return (STOP if key.startswith("stop_") else WARN), reason
    return OK, f"free {format_bytes(m.free_bytes)} ({m.free_pct:.1f}%): no limit reached"


def worst(levels: Iterable[str]) -> str:
    """The machine's health from its checks' levels (see the module docstring); OK if none."""
    return max(levels, key=_RANK.__getitem__, default=OK)


class HealthBook:
    """The current state of every configured check, and the changes between updates."""

    def __init__(self, checks: Iterable[CheckEntry] = ()):
        self._checks: dict[str, CheckEntry] = {}
        self._states: dict[str, CheckState] = {}
        self.configure(checks)

    def configure(self, checks: Iterable[CheckEntry]) -> list[LevelChanged]:
        """Take a new set of checks (a config reload).

        A check that stays (by name) keeps its level and figures until its next update,
        with its new limits; a new one is UNAVAILABLE, "not measured yet".  A check that is
        gone and was not OK yields a change to OK ("no longer checked"), so whoever showed
        its level can take it down.
        """
        checks = tuple(checks)
        names = [c.name for c in checks]
        if len(set(names)) != len(names):
            raise ValueError(f"check names must be unique, not {names}")
        events = [
            LevelChanged(name, state.level, OK, REMOVED)
            for name, state in self._states.items()
            if name not in names and state.level != OK
        ]
        states = {}
        for check in checks:
            old = self._states.get(check.name)
            level, m, reason = (
                (old.level, old.measurement, old.reason) if old is not None
                else (UNAVAILABLE, None, NOT_MEASURED)
            )
            states[check.name] = CheckState(check.name, check.type, check.path,
                                            limits_of(check), level, m, reason)
        self._checks = {c.name: c for c in checks}
        self._states = states
        return events

    @property
    def checks(self) -> tuple[CheckEntry, ...]:
        return tuple(self._checks.values())

    def check(self, name: str) -> CheckEntry:
        return self._checks[name]

    def state(self, name: str) -> CheckState:
        return self._states[name]

    def states(self) -> list[CheckState]:
        """Every check's state, in the configuration's order."""
        return list(self._states.values())

    @property
    def health(self) -> str:
        return worst(s.level for s in self._states.values())

    def update(self, name: str, level: str, measurement: Measurement | None,
               reason: str) -> list[LevelChanged]:
        """Record a check's new reading; one event if its level changed, else none.  A
        check's first reading is news only when it is not OK: "not measured yet" was never
        announced, so a daemon that just started says nothing about healthy checks.

        ``measurement`` must be None exactly for ERROR and UNAVAILABLE.  The figures and
        the reason are replaced either way.
        """
        if level not in _RANK:
            raise ValueError(f"unknown level {level!r}")
        if (measurement is None) != (level in FAILURES):
            raise ValueError(f"level {level} {'needs' if measurement is None else 'has no'} "
                             "measurement")
        old = self._states[name]
        self._states[name] = CheckState(old.name, old.type, old.path, old.limits, level,
                                        measurement, reason)
        if old.level == level or (old.reason == NOT_MEASURED and level == OK):
            return []  # a first reading of OK changes nothing anyone was told
        return [LevelChanged(name, old.level, level, reason)]
