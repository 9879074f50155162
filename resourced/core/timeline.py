"""What is held over time, and what is free throughout an interval of it.

A *hold* is something held over a half-open interval ``[start, end)`` of time
(microseconds; ``end=None`` for an open-ended hold, a claim with no end): whole GPUs,
a VRAM share on one GPU, pool amounts.  Back to back is no overlap.  The timeline keeps
the holds on a fixed inventory (each GPU's memory, each pool's capacity) and answers
one question: what is free *throughout* ``[start, end)``?  The answer is a ``View`` of
the same kind the ledger builds for now, so the rules that place a claim place a booking:

- a whole GPU is free when no hold uses it at any instant of the interval;
- a GPU's free VRAM is its memory less the *peak* of the shares on it over the
  interval (and none when it is held whole at any instant);
- a pool's free amount is its capacity less the peak of what is held of it.

Admission (``earliest``) tries the interval's start, then each instant a hold ends:
what is free only grows when a hold ends, so the first start that fits among those is
the earliest one.  ``check_invariants`` states capacity and exclusivity at every instant.
This module decides nothing about who may hold what; the calendar does, with it.
"""

import bisect
from collections.abc import Iterable
from dataclasses import dataclass

from .claims import Demand
from .view import View


@dataclass(frozen=True, slots=True)
class Hold:
    """What one booking or claim holds over ``[start, end)`` (``end`` None: no end)."""

    id: str
    start: int
    end: int | None
    whole: tuple[str, ...] = ()             # GPUs held whole
    share: str = ""                         # the GPU a VRAM share is on
    vram: int = 0
    pools: tuple[tuple[str, int], ...] = ()
    claim: bool = False                     # a claim's (from its grant on), not a booking's

    def __post_init__(self):
        if self.end is not None and self.end <= self.start:
            raise ValueError(f"hold {self.id}: end {self.end} is not after start {self.start}")

    def overlaps(self, start: int, end: int | None) -> bool:
        return (end is None or self.start < end) and (self.end is None or start < self.end)

    def gpus(self) -> tuple[str, ...]:
        return self.whole + ((self.share,) if self.share else ())


def first_over(holds: Iterable[Hold], amount_of, start: int, limit: int) -> tuple[int, str] | None:
    """The first instant at or after ``start`` at which the sum of ``amount_of(hold)`` over
    the holds exceeds ``limit``, with the hold that starts then; None if it never does."""
    changes = []
    for h in holds:
        if h.end is None or h.end > start:
            changes.append((max(h.start, start), 1, amount_of(h), h.id))
            if h.end is not None:
                changes.append((h.end, 0, -amount_of(h), h.id))  # at equal times, ends first
    level = 0
    for when, _, delta, hold_id in sorted(changes):
        level += delta
        if level > limit:
            return when, hold_id
    return None


def peak(holds: Iterable[Hold], amount_of, start: int, end: int | None) -> int:
    """The largest sum of ``amount_of(hold)`` at any instant of ``[start, end)``."""
    changes = []
    for h in holds:
        if h.overlaps(start, end):
            changes.append((max(h.start, start), 1, amount_of(h)))
            if h.end is not None and (end is None or h.end < end):
                changes.append((h.end, 0, -amount_of(h)))  # at equal times, ends first
    level = top = 0
    for _, _, delta in sorted(changes):
        level += delta
        top = max(top, level)
    return top


class _Index:
    """The holds on one GPU or one pool: open-ended ones apart (with their total amount),
    the others sorted by start with the longest span among them, so those overlapping an
    interval are found by bisection rather than by a walk over the whole calendar."""

    def __init__(self, amount_of):
        self.amount_of = amount_of
        self.by_id: dict[str, Hold] = {}
        self.open: dict[str, Hold] = {}
        self.open_amount = 0
        self.bounded: list[tuple[int, str]] = []  # (start, id) of holds with an end
        self.span = 0  # the longest end - start among them (ever: an upper bound)
        self._latest: int | None = None  # the latest start of an open hold (None: unknown)

    def add(self, h: Hold) -> None:
        self.by_id[h.id] = h
        if h.end is None:
            self.open[h.id] = h
            self.open_amount += self.amount_of(h)
            if self._latest is not None or len(self.open) == 1:
                self._latest = max(self._latest or h.start, h.start)
        else:
            bisect.insort(self.bounded, (h.start, h.id))
            self.span = max(self.span, h.end - h.start)

    def remove(self, h: Hold) -> None:
        del self.by_id[h.id]
        if h.end is None:
            del self.open[h.id]
            self.open_amount -= self.amount_of(h)
            if self._latest is not None and h.start >= self._latest:
                self._latest = None  # found again when next asked for
        else:
            del self.bounded[bisect.bisect_left(self.bounded, (h.start, h.id))]

    def bounded_over(self, start: int, end: int | None, ignore=frozenset()) -> list[Hold]:
        """The holds with an end that overlap ``[start, end)``."""
        lo = bisect.bisect_left(self.bounded, (start - self.span,))
        hi = len(self.bounded) if end is None else bisect.bisect_left(self.bounded, (end,))
        found = []
        for _, hold_id in self.bounded[lo:hi]:
            h = self.by_id[hold_id]
            if h.end > start and hold_id not in ignore:
                found.append(h)
        return found

    def over(self, start: int, end: int | None, ignore=frozenset()) -> list[Hold]:
        """Every hold overlapping ``[start, end)``."""
        return [h for h in self.open.values() if (end is None or h.start < end)
                and h.id not in ignore] + self.bounded_over(start, end, ignore)

    def open_before(self, start: int, ignore) -> bool:
        """Whether every open-ended hold began by ``start`` (and none is ignored): then
        they weigh the same at every instant from ``start`` on (their ``open_amount``)."""
        if not self.open:
            return True
        if any(hold_id in self.open for hold_id in ignore):
            return False
        if self._latest is None:
            self._latest = max(h.start for h in self.open.values())
        return self._latest <= start

    def peak(self, start: int, end: int | None, ignore=frozenset()) -> int:
        """The most held at any instant of ``[start, end)``."""
        if self.open_before(start, ignore):
            return self.open_amount + peak(self.bounded_over(start, end, ignore),
                                           self.amount_of, start, end)
        return peak(self.over(start, end, ignore), self.amount_of, start, end)

    def free_from(self, start: int, duration: int, ignore=frozenset()) -> int | None:
        """The earliest instant at or after ``start`` from which nothing is held for
        ``duration``; None if an open-ended hold is in the way for good."""
        at = start
        lo = bisect.bisect_left(self.bounded, (start - self.span,))
        for hold_start, hold_id in self.bounded[lo:]:
            h = self.by_id[hold_id]
            if hold_id in ignore or h.end <= at:
                continue
            if hold_start >= at + duration:
                break
            at = h.end
        blocked = [h.start for h in self.open.values() if h.id not in ignore]
        if blocked and min(blocked) < at + duration:
            return None
        return at


def _vram(h: Hold) -> int:
    return h.vram


class Timeline:
    """Holds over time on a fixed inventory: GPU memory by UUID (in index order) and pool
    capacities by name."""

    def __init__(self, memory: dict[str, int], capacity: dict[str, int]):
        self.memory = dict(memory)
        self.capacity = dict(capacity)
        self.holds: dict[str, Hold] = {}
        self._on_gpu: dict[str, _Index] = {u: _Index(_vram) for u in self.memory}
        self._of_pool: dict[str, _Index] = {
            p: _Index(lambda h, n=p: dict(h.pools)[n]) for p in self.capacity}
        self._next_start: dict[str, int | None] = {}  # GPU -> earliest booking on it (cache)

    def add(self, hold: Hold) -> None:
        """Record a hold (admitted by the caller through ``view`` or ``earliest``)."""
        if hold.id in self.holds:
            raise ValueError(f"hold {hold.id} is there already")
        self.holds[hold.id] = hold
        for uuid in hold.gpus():
            self._on_gpu[uuid].add(hold)
            self._next_start.pop(uuid, None)
        for name, _ in hold.pools:
            self._of_pool[name].add(hold)

    def remove(self, hold_id: str) -> Hold:
        hold = self.holds.pop(hold_id)
        for uuid in hold.gpus():
            self._on_gpu[uuid].remove(hold)
            self._next_start.pop(uuid, None)
        for name, _ in hold.pools:
            self._of_pool[name].remove(hold)
        return hold

    def view(self, start: int, end: int | None, ignore: frozenset[str] = frozenset(),
             allowed: frozenset[str] | None = None) -> View:
        """What is free throughout ``[start, end)``, as if the holds in ``ignore`` were not
        there (a booking being edited), on the GPUs in ``allowed`` (all when None)."""
        free, vram = [], {}
        for uuid, memory in self.memory.items():
            if allowed is not None and uuid not in allowed:
                continue
            there = self._on_gpu[uuid].over(start, end, ignore)
            if not there:
                free.append(uuid)
                vram[uuid] = memory
            elif not any(h.whole for h in there):
                vram[uuid] = memory - peak(there, _vram, start, end)
        pools = {name: capacity - self._of_pool[name].peak(start, end, ignore)
                 for name, capacity in self.capacity.items()}
        return View(free, vram, pools, self.memory)

    def next_start(self, uuid: str) -> int | None:
        """The earliest start of a booking on a GPU (None: none is booked on it)."""
        if uuid not in self._next_start:
            self._next_start[uuid] = next((s for s, hold_id in self._on_gpu[uuid].bounded
                                           if not self.holds[hold_id].claim), None)
        return self._next_start[uuid]

    def first_conflict(self, hold: Hold) -> tuple[int, str] | None:
        """When ``hold``, were it added with no end, would first hold something twice (or
        over a capacity), and the hold it would collide with then; None if never.

        What a claim granted now may keep until: the start of the next booking that needs
        what it holds."""
        found = []
        for uuid in hold.whole:
            found += [(max(h.start, hold.start), h.id)
                      for h in self._on_gpu[uuid].over(hold.start, None)]
        if hold.share:
            there = self._on_gpu[hold.share].over(hold.start, None)
            found += [(max(h.start, hold.start), h.id) for h in there if h.whole]
            over = first_over([h for h in there if h.share], _vram, hold.start,
                              self.memory[hold.share] - hold.vram)
            found += [over] if over else []
        for name, amount in hold.pools:
            index = self._of_pool[name]
            if not index.bounded or index.bounded[-1][0] <= hold.start:
                continue  # nothing starts later: the level only falls from now on
            base = index.open_amount if index.open_before(hold.start, frozenset()) else 0
            held = index.bounded_over(hold.start, None) if base else index.over(hold.start, None)
            over = first_over(held, index.amount_of, hold.start,
                              self.capacity[name] - amount - base)
            found += [over] if over else []
        return min(found, default=None)

    def earliest(self, demand: Demand, duration: int | None, not_before: int,
                 ignore: frozenset[str] = frozenset(),
                 allowed: frozenset[str] | None = None,
                 blocked: tuple[tuple[int, int], ...] = (),
                 ) -> tuple[int, tuple[str, ...], str] | None:
        """The earliest start at or after ``not_before`` where ``demand`` fits for
        ``duration`` (None: for good) without touching a ``blocked`` window, with the
        placement (whole GPUs, the GPU of the share or ""); None if it never fits.

        Whole GPUs first bound it from below: the ``demand.gpus``-th earliest instant from
        which a GPU is free for the duration."""
        floor = not_before
        if demand.gpus and duration is not None:
            gpus = [u for u in self.memory if allowed is None or u in allowed]
            frees = sorted(t for t in (self._on_gpu[u].free_from(not_before, duration, ignore)
                                       for u in gpus) if t is not None)
            if len(frees) < demand.gpus:
                return None
            floor = frees[demand.gpus - 1]
        found = self.fit(demand, floor, duration, ignore, allowed, blocked)
        if found is not None:
            return floor, *found
        ends = {h.end for index in self._indexes_of(demand, allowed)
                for h in index.bounded_over(floor, None, ignore)}
        ends |= {end for _, end in blocked}
        for start in sorted(e for e in ends if e > floor):
            found = self.fit(demand, start, duration, ignore, allowed, blocked)
            if found is not None:
                return start, *found
        return None

    def latest_before(self, demand: Demand, duration: int, before: int, not_before: int,
                      ignore: frozenset[str] = frozenset(),
                      allowed: frozenset[str] | None = None,
                      blocked: tuple[tuple[int, int], ...] = (),
                      ) -> tuple[int, tuple[str, ...], str] | None:
        """The latest start in ``[not_before, before)`` where ``demand`` fits for
        ``duration``: a window that cannot move later ends where a hold or a blocked
        window starts, so those (less the duration) are the starts to try."""
        starts = {h.start for index in self._indexes_of(demand, allowed)
                  for h in index.over(not_before, before + duration) if h.id not in ignore}
        starts |= {start for start, _ in blocked}
        tries = {s - duration for s in starts} | {not_before}
        for start in sorted((t for t in tries if not_before <= t < before), reverse=True):
            found = self.fit(demand, start, duration, ignore, allowed, blocked)
            if found is not None:
                return start, *found
        return None

    def _indexes_of(self, demand: Demand, allowed: frozenset[str] | None) -> list[_Index]:
        """The indexes whose holds can be in ``demand``'s way: its pools', and the allowed
        GPUs' when it wants GPUs or VRAM."""
        indexes = [self._of_pool[name] for name, _ in demand.pools]
        if demand.wants_gpu:
            indexes += [self._on_gpu[u] for u in self.memory if allowed is None or u in allowed]
        return indexes

    def fit(self, demand: Demand, start: int, duration: int | None,
            ignore: frozenset[str] = frozenset(), allowed: frozenset[str] | None = None,
            blocked: tuple[tuple[int, int], ...] = ()) -> tuple[tuple[str, ...], str] | None:
        """The placement of ``demand`` over ``[start, start + duration)``, or None."""
        end = None if duration is None else start + duration
        if any((end is None or b_start < end) and start < b_end for b_start, b_end in blocked):
            return None
        return self.view(start, end, ignore, allowed).place(demand)

    def check_invariants(self) -> None:
        """At every instant, on every GPU: one whole holder at most, never whole and shared
        at once, shares within its memory; every pool within its capacity."""
        for uuid, memory in self.memory.items():
            holds = list(self._on_gpu[uuid].by_id.values())
            for h in holds:
                assert h.id in self.holds and uuid in h.gpus(), f"index of {uuid} is off"
                if h.whole:
                    others = [o.id for o in holds if o is not h and o.overlaps(h.start, h.end)]
                    assert not others, f"{uuid}: {h.id} holds it whole while {others} hold it"
            shares = [h for h in holds if h.share == uuid]
            assert peak(shares, lambda h: h.vram, 0, None) <= memory, f"{uuid}: VRAM over"
        for name, capacity in self.capacity.items():
            held = list(self._of_pool[name].by_id.values())
            assert peak(held, lambda h, n=name: dict(h.pools)[n], 0, None) <= capacity, \
                f"pool {name} over capacity"
        indexed = {i for on in self._on_gpu.values() for i in on.by_id} | {
            i for of in self._of_pool.values() for i in of.by_id}
        assert indexed <= set(self.holds), "an index names a hold that is gone"
