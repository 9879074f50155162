"""Time as data: the clock the engine reads, and the deadlines it keeps.

The core never reads the time itself: it is handed ``now`` (microseconds since the Unix
epoch, UTC).  The engine takes a clock, a callable returning that number; the daemon's is
the wall clock (or the simulated one: both in ``resourced.protocol.time``), the tests' a
``ManualClock`` they move by hand.  Everything that happens at a time (a queue timeout
today; a booking's start, its end, a warning before it, a no-show later) is a deadline in
one ``Deadlines`` table, and the engine keeps a single timer, for the earliest one.
"""

import heapq
import itertools
from collections.abc import Callable, Hashable

from resourced.protocol.time import usec_of_seconds

Clock = Callable[[], int]
"""Returns now, in microseconds since the Unix epoch."""

LAST_INSTANT = 253_402_300_799_999_999
"""9999-12-31T23:59:59.999999Z: no time the daemon accepts lies past it (datetime's end)."""


class ManualClock:
    """A clock that moves only when told to (tests)."""

    def __init__(self, now_usec: int = 1_700_000_000_000_000):
        self.now_usec = now_usec

    def __call__(self) -> int:
        return self.now_usec

    def advance(self, seconds: float) -> None:
        self.now_usec += usec_of_seconds(seconds)


class Deadlines:
    """Pending deadlines by key (one each), earliest first; pure bookkeeping, no timers."""

    def __init__(self):
        self._when: dict[Hashable, int] = {}
        self._heap: list[tuple[int, int, Hashable]] = []  # (when, order, key); stale ones skipped
        self._order = itertools.count()

    def set(self, key: Hashable, when_usec: int) -> None:
        """Due at ``when_usec`` (replacing any earlier deadline of the key)."""
        self._when[key] = when_usec
        heapq.heappush(self._heap, (when_usec, next(self._order), key))

    def cancel(self, key: Hashable) -> None:
        self._when.pop(key, None)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._when

    def __len__(self) -> int:
        return len(self._when)

    def next(self) -> int | None:
        """When the earliest pending deadline is due, or None."""
        self._drop_stale()
        return self._heap[0][0] if self._heap else None

    def due(self, now_usec: int) -> list[Hashable]:
        """The keys due at ``now_usec``, earliest first; they are no longer pending."""
        keys = []
        while (when := self.next()) is not None and when <= now_usec:
            _, _, key = heapq.heappop(self._heap)
            del self._when[key]
            keys.append(key)
        return keys

    def _drop_stale(self) -> None:
        heap = self._heap
        while heap and self._when.get(heap[0][2]) != heap[0][0]:
            heapq.heappop(heap)
