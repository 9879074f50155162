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

from collections.abc import Iterable
from dataclasses import dataclass

from .claims import Demand
from .view import View


@dataclass(frozen=True)
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


class Timeline:
    """Holds over time on a fixed inventory: GPU memory by UUID (in index order) and pool
    capacities by name."""

    def __init__(self, memory: dict[str, int], capacity: dict[str, int]):
        self.memory = dict(memory)
        self.capacity = dict(capacity)
        self.holds: dict[str, Hold] = {}
        self._on_gpu: dict[str, dict[str, Hold]] = {u: {} for u in self.memory}
        self._of_pool: dict[str, dict[str, Hold]] = {p: {} for p in self.capacity}
        self._next_start: dict[str, int | None] = {}  # GPU -> earliest start on it (cache)

    def add(self, hold: Hold) -> None:
        """Record a hold (admitted by the caller through ``view`` or ``earliest``)."""
        if hold.id in self.holds:
            raise ValueError(f"hold {hold.id} is there already")
        self.holds[hold.id] = hold
        for uuid in hold.gpus():
            self._on_gpu[uuid][hold.id] = hold
            self._next_start.pop(uuid, None)
        for name, _ in hold.pools:
            self._of_pool[name][hold.id] = hold

    def remove(self, hold_id: str) -> Hold:
        hold = self.holds.pop(hold_id)
        for uuid in hold.gpus():
            del self._on_gpu[uuid][hold_id]
            self._next_start.pop(uuid, None)
        for name, _ in hold.pools:
            del self._of_pool[name][hold_id]
        return hold

    def view(self, start: int, end: int | None, ignore: frozenset[str] = frozenset(),
             allowed: frozenset[str] | None = None) -> View:
        """What is free throughout ``[start, end)``, as if the holds in ``ignore`` were not
        there (a booking being edited), on the GPUs in ``allowed`` (all when None)."""
        free, vram = [], {}
        for uuid, memory in self.memory.items():
            if allowed is not None and uuid not in allowed:
                continue
            there = [h for h in self._on_gpu[uuid].values()
                     if h.id not in ignore and h.overlaps(start, end)]
            if not there:
                free.append(uuid)
                vram[uuid] = memory
            elif not any(h.whole for h in there):
                vram[uuid] = memory - peak(there, lambda h: h.vram, start, end)
        pools = {}
        for name, capacity in self.capacity.items():
            held = [h for h in self._of_pool[name].values() if h.id not in ignore]
            pools[name] = capacity - peak(held, lambda h, n=name: dict(h.pools)[n], start, end)
        return View(free, vram, pools, self.memory)

    def next_start(self, uuid: str) -> int | None:
        """The earliest start of a booking on a GPU (None: none is booked on it)."""
        if uuid not in self._next_start:
            self._next_start[uuid] = min((h.start for h in self._on_gpu[uuid].values()
                                          if not h.claim), default=None)
        return self._next_start[uuid]

    def first_conflict(self, hold: Hold) -> tuple[int, str] | None:
        """When ``hold``, were it added with no end, would first hold something twice (or
        over a capacity), and the hold it would collide with then; None if never.

        What a claim granted now may keep until: the start of the next booking that needs
        what it holds."""
        found = []
        for uuid in hold.whole:
            found += [(max(h.start, hold.start), h.id) for h in self._on_gpu[uuid].values()
                      if h.overlaps(hold.start, None)]
        if hold.share:
            there = self._on_gpu[hold.share].values()
            found += [(max(h.start, hold.start), h.id) for h in there
                      if h.whole and h.overlaps(hold.start, None)]
            over = first_over([h for h in there if h.share], lambda h: h.vram, hold.start,
                              self.memory[hold.share] - hold.vram)
            found += [over] if over else []
        for name, amount in hold.pools:
            held = self._of_pool[name].values()
            if any(h.start > hold.start for h in held):  # else the level only falls
                over = first_over(held, lambda h, n=name: dict(h.pools)[n], hold.start,
                                  self.capacity[name] - amount)
                found += [over] if over else []
        return min(found, default=None)

    def earliest(self, demand: Demand, duration: int | None, not_before: int,
                 ignore: frozenset[str] = frozenset(),
                 allowed: frozenset[str] | None = None,
                 blocked: tuple[tuple[int, int], ...] = (),
                 ) -> tuple[int, tuple[str, ...], str] | None:
        """The earliest start at or after ``not_before`` where ``demand`` fits for
        ``duration`` (None: for good) without touching a ``blocked`` window, with the
        placement (whole GPUs, the GPU of the share or ""); None if it never fits."""
        ends = {h.end for h in self.holds.values() if h.end is not None and h.id not in ignore}
        ends |= {end for _, end in blocked}
        for start in [not_before, *sorted(e for e in ends if e > not_before)]:
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
        starts = {h.start for h in self.holds.values() if h.id not in ignore}
        starts |= {start for start, _ in blocked}
        tries = {s - duration for s in starts} | {not_before}
        for start in sorted((t for t in tries if not_before <= t < before), reverse=True):
            found = self.fit(demand, start, duration, ignore, allowed, blocked)
            if found is not None:
                return start, *found
        return None

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
            holds = list(self._on_gpu[uuid].values())
            for h in holds:
                assert h.id in self.holds and uuid in h.gpus(), f"index of {uuid} is off"
                if h.whole:
                    others = [o.id for o in holds if o is not h and o.overlaps(h.start, h.end)]
                    assert not others, f"{uuid}: {h.id} holds it whole while {others} hold it"
            shares = [h for h in holds if h.share == uuid]
            assert peak(shares, lambda h: h.vram, 0, None) <= memory, f"{uuid}: VRAM over"
        for name, capacity in self.capacity.items():
            held = list(self._of_pool[name].values())
            assert peak(held, lambda h, n=name: dict(h.pools)[n], 0, None) <= capacity, \
                f"pool {name} over capacity"
        indexed = {i for on in self._on_gpu.values() for i in on} | {
            i for of in self._of_pool.values() for i in of}
        assert indexed <= set(self.holds), "an index names a hold that is gone"
