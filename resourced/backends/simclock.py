"""The simulated clock: time for tests and demos, next to the simulated GPUs.

With the simulated backend (only there: ``RESOURCED_SIMULATED_GPUS`` set),
``RESOURCED_SIMULATED_CLOCK`` names a file holding one ISO-8601 instant in UTC, such as
``2026-12-01T09:00:00Z``.  That instant is *now* for the daemon and for gpuctl: bookings
start and end on it.  The file is read again on each use (cheaply: only when it changed);
the daemon is told of each new instant at once (inotify on the file's folder) and looks at
least once a second besides, so writing a new instant moves time for everyone at once;
each new instant the daemon sees starts a tracking sweep too.
"""

import os
from datetime import datetime
from pathlib import Path

from resourced.core.clock import Clock, wall_clock
from resourced.protocol.when import usec

CLOCK_VARIABLE = "RESOURCED_SIMULATED_CLOCK"


class FileClock:
    """Now, as the file says (microseconds since the epoch)."""

    def __init__(self, path: Path):
        self.path = path
        self._seen: tuple[int, int, int] | None = None
        self._now = 0

    def __call__(self) -> int:
        try:
            st = os.stat(self.path)
            seen = (st.st_ino, st.st_mtime_ns, st.st_size)
            if seen != self._seen:
                self._now = parse_instant(self.path.read_text())
                self._seen = seen
        except (OSError, ValueError) as exc:
            if self._seen is None:  # never read: nothing to fall back on
                raise ValueError(f"{CLOCK_VARIABLE}={self.path}: {exc}") from exc
        return self._now


def parse_instant(text: str) -> int:
    """An ISO-8601 instant with ``Z`` or an offset, as microseconds since the epoch."""
    text = text.strip()
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"expected an ISO-8601 instant such as 2026-12-01T09:00:00Z, "
                         f"not {text[:40]!r}") from None
    if moment.tzinfo is None:
        raise ValueError(f"the instant {text[:40]!r} has no zone: end it with Z for UTC")
    return usec(moment)


def clock_from_env(environ=os.environ) -> tuple[Clock, bool]:
    """The clock to use, and whether it is simulated (read it again at least each second)."""
    path = environ.get(CLOCK_VARIABLE)
    if not path:
        return wall_clock, False
    from . import SIMULATION_VARIABLE  # here: gpuctl's path loads no backend

    if not environ.get(SIMULATION_VARIABLE):
        return wall_clock, False
    clock = FileClock(Path(path))
    clock()  # a missing or bad file is an error now, not at the first booking
    return clock, True
