"""Time, in one place: integer microseconds since the Unix epoch (UTC), and spans likewise.

From the protocol's edge inward every time is a whole count of microseconds, as the bus
carries it.  What comes in as seconds (a configuration file, a Python caller of the
client, ``parse_duration``) is converted once where it comes in (``usec_of_seconds``);
what goes out as seconds (a sleep, a monotonic deadline, ``format_span``) once where it
goes out (``seconds_of_usec``).  A number already in microseconds that passes through an
API taking seconds is marked ``Usec`` and taken as it is.

Here too are *now* (``wall_clock``; ``now_usec`` for gpuctl and the services beside it,
the simulated clock's where one is set; ``clock_from_env`` for the daemon), the one ISO
8601 form of an instant in output (``iso_utc``: UTC to the second, ending in ``Z``, as
JSON gives ``start`` and ``end``), and a person's local rendering (``local_text``:
``today 20:00``).  Reading the clock, the wall's or the simulated clock's file, is the
protocol's one look at the world.  Standard library only; datetime and the parsing of
times load where they are used (gpuctl's start-up).
"""

import functools
import os
import time

__all__ = ["CLOCK_VARIABLE", "DAY", "HOUR", "MINUTE", "SIMULATION_VARIABLE", "USEC", "FileClock",
           "Usec", "clock_from_env", "in_local_time", "iso_utc", "local_now", "local_text",
           "now_usec", "parse_instant", "seconds_of", "seconds_of_usec", "usec_of_seconds",
           "wall_clock", "whole_second", "with_times"]

USEC = 1_000_000
"""Microseconds in a second: the one place the factor is written."""
MINUTE = 60 * USEC
HOUR = 3600 * USEC
DAY = 86400 * USEC


class Usec(int):
    """A count of microseconds, marked as such: where an argument is otherwise a number
    of seconds (the client's moments and spans, a claim's queue timeout), a ``Usec`` is
    taken as it is, so that microseconds are never turned into seconds and back."""

    __slots__ = ()


def usec_of_seconds(seconds: float) -> int:
    """``seconds`` (int or float) as whole microseconds, truncated toward zero."""
    return int(seconds * USEC)


def seconds_of_usec(usec: int) -> float:
    """``usec`` microseconds as (float) seconds."""
    return usec / USEC


def seconds_of(value: float) -> float:
    """A span given as seconds or as ``Usec``, in seconds."""
    return seconds_of_usec(value) if isinstance(value, Usec) else value


def whole_second(usec: int) -> int:
    """``usec`` rounded up to the second: where bookings are placed from (a time a person
    types or reads to the second then names it exactly)."""
    return -(-usec // USEC) * USEC


# -- now -------------------------------------------------------------------------------
CLOCK_VARIABLE = "RESOURCED_SIMULATED_CLOCK"
"""Names a file holding one ISO 8601 instant in UTC (``2026-12-01T09:00:00Z``): *now*, for
the daemon and for its clients, with the simulated GPUs (and only there)."""
SIMULATION_VARIABLE = "RESOURCED_SIMULATED_GPUS"
"""Set, the simulated backend is used (``resourced.backends``), and the simulated clock
may be."""


def wall_clock() -> int:
    """Now, by the wall clock."""
    return time.time_ns() // 1000


class FileClock:
    """Now, as the simulated clock's file says.  The file is read again on each use
    (cheaply: only when it changed); the daemon is told of each new instant at once
    (inotify on the file's folder) and looks at least once a second besides, so writing
    a new instant moves time for everyone at once."""

    def __init__(self, path):
        self.path = path
        self._seen: tuple[int, int, int] | None = None
        self._now = 0

    def __call__(self) -> int:
        try:
            st = os.stat(self.path)
            seen = (st.st_ino, st.st_mtime_ns, st.st_size)
            if seen != self._seen:
                with open(self.path, encoding="utf-8") as f:
                    self._now = parse_instant(f.read())
                self._seen = seen
        except (OSError, ValueError) as exc:
            if self._seen is None:  # never read: nothing to fall back on
                raise ValueError(f"{CLOCK_VARIABLE}={self.path}: {exc}") from exc
        return self._now


def parse_instant(text: str) -> int:
    """An ISO-8601 instant with ``Z`` or an offset, as microseconds since the epoch."""
    from datetime import datetime

    from .when import usec

    text = text.strip()
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"expected an ISO-8601 instant such as 2026-12-01T09:00:00Z, "
                         f"not {text[:40]!r}") from None
    if moment.tzinfo is None:
        raise ValueError(f"the instant {text[:40]!r} has no zone: end it with Z for UTC")
    return usec(moment)


def clock_from_env(environ=os.environ):
    """The clock to use (a callable giving now in microseconds), and whether it is
    simulated (then read it again at least each second)."""
    path = environ.get(CLOCK_VARIABLE)
    if not path or not environ.get(SIMULATION_VARIABLE):
        return wall_clock, False
    from pathlib import Path

    clock = FileClock(Path(path))
    clock()  # a missing or bad file is an error now, not at the first booking
    return clock, True


def now_usec() -> int:
    """Now, as the daemon sees it (the simulated clock where one is set)."""
    from resourced.errors import InvalidArgs

    try:
        return clock_from_env()[0]()
    except ValueError as exc:
        raise InvalidArgs(str(exc)) from None


# -- shown -----------------------------------------------------------------------------
def iso_utc(usec: int) -> str:
    """An instant as output gives it, in JSON and in messages: ISO 8601 in UTC, to the
    second, ending in ``Z`` (time.strftime: 10 times datetime's speed, which shows with
    thousands of records)."""
    return _iso_second(usec // USEC)


@functools.lru_cache(maxsize=4096)
def _iso_second(second: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(second))


def with_times(item: dict) -> dict:
    """JSON: the record, plus its ``start`` and ``end`` as ``iso_utc`` gives them, for
    people and scripts (memoized: a calendar's times repeat, whole hours)."""
    out = dict(item)
    for key in ("start", "end"):
        if f"{key}_usec" in item:
            out[key] = iso_utc(item[f"{key}_usec"])
    return out


def local_now(usec: int | None = None):
    """Now (or ``usec``) as an aware datetime in the local zone."""
    from datetime import UTC

    from .when import moment

    return moment(now_usec() if usec is None else usec, UTC).astimezone()


def local_text(usec: int, now: int | None = None) -> str:
    """An instant as a table shows it: ``today 20:00``, in local time, relative to now."""
    from .when import format_when, moment

    here = local_now(now)
    return format_when(moment(usec, here.tzinfo), here)


ISO_INSTANT = r"\d{4}-\d\d-\d\dT\d\d:\d\d(?::\d\d(?:\.\d+)?)?(?:Z|[+-]\d\d:\d\d)"


def in_local_time(text: str) -> str:
    """``text`` (a daemon's warning or refusal) with its ISO 8601 instants written as the
    tables write them: ``today 21:04``, in local time."""
    import re

    def local(match):
        try:
            return local_text(parse_instant(match[0]))
        except ValueError:
            return match[0]

    return re.sub(ISO_INSTANT, local, text)
