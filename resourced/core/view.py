"""What is free, as a walk sees it: whole GPUs, VRAM per GPU, pool amounts.

The ledger builds one for now, the timeline one for an interval of time (what is free
throughout it); placement, taking and reserving are the same on both, so the queue's
rules and a booking's admission are one rule.
"""

from dataclasses import dataclass, field

from .claims import Claim, Demand

GPUS = ""
"""The want of whole GPUs or VRAM, beside the pools' names (which are never empty)."""


@dataclass
class View:
    """What is free: now (the ledger's), or throughout an interval (the timeline's); a
    queue walk places, takes and reserves on it as it goes."""

    free: list[str]              # whole GPUs nobody holds or shares, not busy, by index
    vram: dict[str, int]         # GPUs a share may go on -> free bytes
    pools: dict[str, int]        # pool -> free amount
    memory: dict[str, int]       # GPU -> its memory
    busy_free: int = 0           # free GPUs left out because they are busy
    booked_from: dict[str, int] = field(default_factory=dict)  # GPU -> its next booking

    def copy(self) -> "View":
        return View(list(self.free), dict(self.vram), dict(self.pools), self.memory,
                    self.busy_free, self.booked_from)

    def place(self, d: Demand, on: tuple[str, ...] = ()) -> tuple[tuple[str, ...], str] | None:
        """(whole GPUs, the GPU for the share or "") if ``d`` fits (on the GPUs ``on``
        only, when given), else None."""
        free = [u for u in self.free if u in on] if on else self.free
        if len(free) < d.gpus:
            return None
        if any(self.pools.get(name, 0) < amount for name, amount in d.pools):
            return None
        share = ""
        if d.vram:
            fitting = [(-self.booked_from.get(uuid, 0), free, uuid) for uuid, free in self.vram.items()
                       if free >= d.vram and (not on or uuid in on)]
            if not fitting:
                return None
            share = min(fitting)[2]  # booked latest, then the tightest fit (whole GPUs stay whole)
        return tuple(free[: d.gpus]), share

    def has(self, want: str) -> bool:
        """Whether anything of a want (``GPUS`` or a pool's name) is left."""
        return bool(self.free or self.vram) if want == GPUS else self.pools.get(want, 0) > 0

    def exhausted_for(self, d: Demand) -> bool:
        """Nothing ``d`` asks for is left: it cannot be placed, and reserving for it would
        change nothing (the walk skips such waiters in O(1))."""
        if d.wants_gpu and (self.free or self.vram):
            return False
        return all(self.pools.get(name, 0) == 0 for name, _ in d.pools)

    def take(self, d: Demand, whole: tuple[str, ...], share: str) -> None:
        for uuid in whole:
            self.free.remove(uuid)
            self.vram.pop(uuid, None)
        if share:
            self.vram[share] -= d.vram
            if share in self.free:
                self.free.remove(share)
        for name, amount in d.pools:
            self.pools[name] -= amount

    def reserve(self, d: Demand, on: tuple[str, ...] = ()) -> None:
        """Keep what a waiter that does not fit could use away from the claims after it.

        Whole GPUs: the free ones it needs, and when those are too few, every shared GPU
        too (no new share may land there, so they drain for it).  A share: every GPU big
        enough for it (whichever frees first must be its).  Pools: up to its amount.
        A waiter for named GPUs (``on``: a booking's) reserves those GPUs."""
        if on:
            self.free = [u for u in self.free if u not in on]
            for uuid in on:
                self.vram.pop(uuid, None)
        elif d.gpus:
            for uuid in self.free[: d.gpus]:
                self.vram.pop(uuid, None)
            short = d.gpus > len(self.free)
            del self.free[: d.gpus]
            if short:
                for uuid in [u for u in self.vram if u not in self.free]:
                    del self.vram[uuid]
        if d.vram and not on:
            for uuid in [u for u in self.vram if self.memory[u] >= d.vram]:
                del self.vram[uuid]
            self.free = [u for u in self.free if self.memory[u] < d.vram]
        for name, amount in d.pools:
            self.pools[name] -= min(amount, self.pools.get(name, 0))

    def give_back(self, c: Claim) -> None:
        """As if ``c`` had released (for planning a reclaim)."""
        if c.shared:
            self.vram[c.gpus[0]] = self.vram.get(c.gpus[0], 0) + c.demand.vram
        else:
            for uuid in c.gpus:
                self.free.append(uuid)
                self.vram[uuid] = self.memory[uuid]
            self.free.sort()
        for name, amount in c.demand.pools:
            self.pools[name] += amount
