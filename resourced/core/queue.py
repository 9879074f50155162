"""The waiting claims: in serving order, by what they want, and counted per user and
session (what the limits count)."""

import bisect
from collections import Counter
from collections.abc import Iterable, Iterator

from .claims import SLURM, Claim, Demand
from .view import GPUS, View


def rank(claim: Claim) -> tuple[int, int]:
    """Serving order: higher priority first, then arrival."""
    return (-claim.priority, claim.seq)


def wants(d: Demand) -> list[str]:
    """The lanes of the queue a waiter with this demand is in."""
    return ([GPUS] if d.wants_gpu else []) + [name for name, _ in d.pools]


def count(counter: Counter, claim: Claim, delta: int) -> None:
    """Add ``delta`` to the claim's user and session in ``counter`` (keys at 0 go); a
    Slurm job's claim counts against Slurm's limits, not ours."""
    if not delta or claim.mode == SLURM:
        return
    for key in (claim.uid, (claim.uid, claim.session)):
        counter[key] += delta
        if not counter[key]:
            del counter[key]


def counted(claims: Iterable[Claim], amount=lambda c: 1) -> Counter:
    counter: Counter = Counter()
    for claim in claims:
        count(counter, claim, amount(claim))
    return counter


class WaitQueue:
    """Waiting claims in the order they will be served, each also in the lane of every
    thing it wants (a GPU, a pool), so that a walk visits only the waiters for what is
    left."""

    def __init__(self):
        self._claims: list[Claim] = []
        self.lanes: dict[str, list[Claim]] = {}  # want -> the waiting claims with it
        self.wanting_gpus = 0                    # waiters that want GPUs or VRAM
        self.of: Counter = Counter()             # uid, (uid, session) -> waiters

    def __iter__(self) -> Iterator[Claim]:
        return iter(self._claims)

    def __len__(self) -> int:
        return len(self._claims)

    def add(self, claim: Claim) -> None:
        bisect.insort(self._claims, claim, key=rank)
        for want in wants(claim.demand):
            bisect.insort(self.lanes.setdefault(want, []), claim, key=rank)
        count(self.of, claim, 1)
        self.wanting_gpus += claim.demand.wants_gpu

    def remove(self, claim: Claim) -> None:
        for lane in [self._claims, *(self.lanes[want] for want in wants(claim.demand))]:
            i = bisect.bisect_left(lane, rank(claim), key=rank)
            assert lane[i] is claim, f"{claim.id} is not where the queue says"
            del lane[i]
        self.wanting_gpus -= claim.demand.wants_gpu
        count(self.of, claim, -1)

    def visit(self, view: View, reclaim: bool) -> Iterator[Claim]:
        """The waiters a walk must look at, in serving order: those that want something
        the view still has.  The others could neither be placed nor reserve anything,
        so with 2,000 waiters for GPUs and every GPU held, a walk for a pool amount
        visits none of them.  (With claims that may be asked back, all are visited.)

        Each want has its lane (a sorted sub-queue); the walk merges the lanes whose want
        is left, and drops a lane as soon as the view runs out of its want: the view
        only shrinks during a walk, so a dropped lane never comes back."""
        if reclaim:
            yield from list(self._claims)
            return
        lanes = {want: list(q) for want, q in self.lanes.items() if q and view.has(want)}
        at = dict.fromkeys(lanes, 0)
        seen: set[str] = set()
        while lanes:
            want = min(lanes, key=lambda w: rank(lanes[w][at[w]]))
            claim = lanes[want][at[want]]
            at[want] += 1
            if at[want] == len(lanes[want]):
                del lanes[want]
            if claim.id in seen:  # in two lanes: a GPU and a pool amount, say
                continue
            seen.add(claim.id)
            yield claim
            for gone in [w for w in lanes if not view.has(w)]:
                del lanes[gone]

    def check(self, waiting: list[Claim]) -> None:
        """The indexes hold exactly ``waiting`` (the queued claims, in serving order)."""
        assert waiting == self._claims, "queue index out of step with the claims"
        lanes = {want: [c for c in waiting if want in wants(c.demand)] for want in self.lanes}
        assert lanes == self.lanes and set(self.lanes) >= {w for c in waiting
                                                           for w in wants(c.demand)}, "lanes"
        assert counted(waiting) == self.of, "waiting claims per user and session"
        assert sum(c.demand.wants_gpu for c in waiting) == self.wanting_gpus
