"""At most one announcement per key and interval, the values of the moment.

A busy daemon changes its totals (the Manager's ``FreeGPUs``, ``NClaims``, ``NQueued``,
a pool's ``Free``) with every claim and release: announcing each change cost a signal
to marshal and route for every call, though a watcher only needs the latest value.
The first change after a quiet spell is announced at once; those that follow within
``interval`` of it, once, ``interval`` after it, with the values of then.
"""

import asyncio
import time
from collections.abc import Callable, Hashable

INTERVAL = 0.05
"""Seconds: the most often one total is announced (20 times a second)."""


class Throttle:
    def __init__(self, announce: Callable[[list], None], interval: float = INTERVAL,
                 clock: Callable[[], float] = time.monotonic):
        self._announce = announce  # called with the keys due, from the event loop
        self._interval = interval
        self._clock = clock
        self._last: dict[Hashable, float] = {}  # key -> when it was last announced
        self._pending: set[Hashable] = set()
        self._timer: asyncio.TimerHandle | None = None

    def due_now(self, key: Hashable) -> bool:
        """Whether a change of ``key`` is to be announced now (it is then taken as
        announced); if not, it will be, once, when its interval is up."""
        now = self._clock()
        if key in self._pending:
            return False
        if now - self._last.get(key, -self._interval) >= self._interval:
            self._last[key] = now
            return True
        self._pending.add(key)
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(
                self._last[key] + self._interval - now, self._flush)
        return False

    def _flush(self) -> None:
        self._timer = None
        now = self._clock()
        due = [k for k in self._pending if now - self._last[k] >= self._interval]
        self._pending.difference_update(due)
        for key in due:
            self._last[key] = now
        if self._pending:  # (keys that came later than the first: their turn is later)
            wait = min(self._last[k] for k in self._pending) + self._interval - now
            self._timer = asyncio.get_running_loop().call_later(wait, self._flush)
        if due:
            self._announce(due)
