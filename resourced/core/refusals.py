"""Why a claim cannot be had, in words: never here (more than the machine has), or not now
(what is short, and how many wait ahead of it)."""

from resourced.errors import (
    GPUsBusy,
    NoSuchPool,
    NotEnoughCapacity,
    NotEnoughGPUs,
    ResourcedError,
    quoted,
)

from .claims import Claim, Demand
from .pools import format_amount


def never_fits(ledger, d: Demand, on: tuple[str, ...] = ()) -> None:
    """Raise when ``d`` could never be granted here, whatever is released: it asks more
    than the machine has (or than the GPUs ``on``, when it may go only there)."""
    if on:
        ours = [u for u in on if u not in ledger.slurm]
        if d.gpus > len(ours):
            raise NotEnoughGPUs(f"{d.gpus} GPU(s) requested, {len(ours)} may be used")
        biggest = max((ledger.gpus[u].memory_bytes for u in ours), default=0)
        if d.vram > biggest:
            raise NotEnoughCapacity(f"{format_amount(d.vram, 'bytes')} of VRAM requested, the "
                                    f"largest GPU it may use has {format_amount(biggest, 'bytes')}")
    ours = len(ledger.gpus) - len(ledger.slurm)
    if d.gpus > ours:
        slurm = f" besides the {len(ledger.slurm)} Slurm schedules" if ledger.slurm else ""
        raise NotEnoughGPUs(f"{d.gpus} GPU(s) requested, the machine has {ours}{slurm}")
    for name, amount in d.pools:
        pool = ledger.pools.get(name)
        if pool is None:
            known = ", ".join(sorted(ledger.pools)) or "none"
            raise NoSuchPool(f"no pool {quoted(name)}; pools: {known}")
        if amount > pool.capacity:
            raise NotEnoughCapacity(
                f"{format_amount(amount, pool.unit)} of {name} requested, "
                f"the pool holds {format_amount(pool.capacity, pool.unit)}")
    if d.vram and d.vram > (biggest := max((g.memory_bytes for u, g in ledger.gpus.items()
                                            if u not in ledger.slurm), default=0)):
        raise NotEnoughCapacity(f"{format_amount(d.vram, 'bytes')} of VRAM requested, "
                                f"the largest GPU has {format_amount(biggest, 'bytes')}")

def short_now(ledger, claim: Claim, busy: frozenset[str]) -> ResourcedError:
    """The error for a request that could not be granted now, saying what is short."""
    queue = list(ledger.waiting)
    ahead = queue[: queue.index(claim)]
    free_view = ledger.view(busy)
    for waiter in ahead:  # all blocked: what they reserve is not free for this one
        free_view.reserve(waiter.demand)
    if claim.on:  # it may go only there: the rest is not free for it
        free_view.free = [u for u in free_view.free if u in claim.on]
        free_view.vram = {u: n for u, n in free_view.vram.items() if u in claim.on}
    d = claim.demand
    after = f" ({len(ahead)} waiting claim(s) ahead of it)" if ahead else ""
    if len(free_view.free) < d.gpus:
        unclaimed = len(free_view.free) + free_view.busy_free
        if unclaimed >= d.gpus:
            return GPUsBusy(f"{d.gpus} GPU(s) requested, {unclaimed} unclaimed but "
                            f"{free_view.busy_free} of them run processes nobody claimed{after}")
        return NotEnoughGPUs(f"{d.gpus} GPU(s) requested, {len(free_view.free)} free{after}")
    for name, amount in d.pools:
        unit = ledger.pools[name].unit
        if free_view.pools[name] < amount:
            return NotEnoughCapacity(f"{format_amount(amount, unit)} of {name} requested, "
                                     f"{format_amount(free_view.pools[name], unit)} free{after}")
    if d.vram:
        most = max(free_view.vram.values(), default=0)
        if most < d.vram and (room := [
                ledger.gpus[g.uuid].label for g in ledger.free_gpus()
                if g.uuid in busy and g.memory_bytes >= d.vram]):
            return GPUsBusy(f"{format_amount(d.vram, 'bytes')} of VRAM requested: it "
                            f"fits only on {', '.join(room)}, where processes nobody "
                            f"claimed run{after}")
        if most < d.vram:
            return NotEnoughCapacity(f"{format_amount(d.vram, 'bytes')} of VRAM requested, at "
                                     f"most {format_amount(most, 'bytes')} free on one GPU{after}")
    return NotEnoughCapacity(f"the request does not fit now: reserved for{after or ' others'}")
