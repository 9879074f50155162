"""Which claim a process belongs to, from a snapshot of the process table.

A process belongs to a claim if it is one of the claim's processes (the owner while it
lives, and the members: descendants seen earlier, kept even after re-parenting to init)
or a descendant of one of them.  Processes are (pid, start time), so a reused pid never
inherits a claim.  A process in a container is placed the same way (our table sees its
real parents), or by the claim its environment names; one the table cannot place (not
visible here, or in a container started by nobody's claim) is *ambiguous*: reported as
such, never guessed.
"""

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

from .claims import Claim, ProcessRef


@dataclass(frozen=True)
class ProcInfo:
    """One row of the process table."""

    pid: int
    ppid: int
    start_time: int
    uid: int = -1
    nested_namespace: bool = False  # its NSpid has more than one level below ours
    name: str = ""  # its command name (comm), as /proc/<pid>/stat gives it

    @property
    def ref(self) -> ProcessRef:
        return ProcessRef(self.pid, self.start_time)


@dataclass(frozen=True)
class Attribution:
    claim_id: str = ""  # "" = no claim
    ambiguous: str = ""  # why it cannot be attributed, when it cannot


def children_of(table: Mapping[int, ProcInfo]) -> dict[int, list[ProcInfo]]:
    """pid -> its children: the index ``descendants`` walks, built once per table."""
    children: dict[int, list[ProcInfo]] = {}
    for info in table.values():
        children.setdefault(info.ppid, []).append(info)
    return children


def descendants(table: Mapping[int, ProcInfo], roots: Iterable[ProcessRef],
                children: Mapping[int, list[ProcInfo]] | None = None) -> set[ProcessRef]:
    """Every living process below ``roots`` (roots that are no longer alive are skipped).

    Pass ``children_of(table)`` when asking for many roots of one table (a sweep over
    every claim), so the index is built once rather than once per claim."""
    if children is None:
        children = children_of(table)
    found: set[ProcessRef] = set()
    stack = [r.pid for r in roots if r.pid in table and table[r.pid].ref == r]
    while stack:
        for child in children.get(stack.pop(), ()):
            if child.ref not in found:
                found.add(child.ref)
                stack.append(child.pid)
    return found


def claim_processes(claims: Iterable[Claim]) -> dict[ProcessRef, tuple[str, ...]]:
    """The claims' own processes (owners and members), each mapped to the claims it is
    one of: a claim it owns first, then those that adopted it as a member."""
    claims = list(claims)
    found: dict[ProcessRef, tuple[str, ...]] = {}
    for claim in claims:
        if claim.owner_alive:
            found[claim.owner] = (*found.get(claim.owner, ()), claim.id)
    for claim in claims:
        for ref in claim.members - {claim.owner}:
            found[ref] = (*found.get(ref, ()), claim.id)
    return found


def attribute(chain: Sequence[ProcInfo], owned: Mapping[ProcessRef, tuple[str, ...]],
              started_for: str = "", holders: Collection[str] = ()) -> Attribution:
    """Attribute a process from its ancestry (itself first, then its parent, up to init).

    It belongs to every claim one of whose processes is on that chain, in a container too
    (the chain is ours, whatever the container numbers it); on a GPU it is the claim's
    among them that holds the GPU (``holders``), else the nearest (a claim it owns before
    one that adopted it).  So a process that owns claim A, below a shell that owns claim
    B, is A's on A's GPUs and B's on B's: ``gpuctl verify`` and release's check both ask
    this.  Else, one in a container belongs to the claim it was ``started_for`` (its
    environment names a live claim of its user), or is ambiguous."""
    if not chain:
        return Attribution(ambiguous="not visible here: another pid namespace, or already gone")
    mine = [claim_id for info in chain for claim_id in owned.get(info.ref, ())]
    if mine:
        return Attribution(claim_id=next((c for c in mine if c in holders), mine[0]))
    if chain[0].nested_namespace:
        if started_for:
            return Attribution(claim_id=started_for)
        return Attribution(ambiguous="runs in another pid namespace")
    return Attribution()
