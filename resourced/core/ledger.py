"""The ledger: every live claim, and the only place that grants and releases.

Theory of operation: the ledger is a plain in-memory structure that the daemon consults
synchronously between two awaits, so a decision (read state, pick GPUs, record the claim)
is atomic by construction and no two callers can win the same GPU.  Evidence about the
GPUs (which ones run processes nobody claimed) is gathered *before* the decision and
handed in as a snapshot; the ledger never waits for anything.

Every mutation returns the events it caused; the caller persists them, then publishes
them.  ``check_invariants`` states the property the tests hammer: an exclusive GPU has
at most one holder and every held GPU exists.
"""

from collections.abc import Iterable
from dataclasses import dataclass

from ..errors import GPUsBusy, InvalidRequest, NoSuchClaim, NotEnoughGPUs
from .claims import Claim, ClaimRequest, ProcessRef
from .inventory import Gpu


@dataclass(frozen=True)
class ClaimGranted:
    claim: Claim


@dataclass(frozen=True)
class ClaimReleased:
    claim: Claim
    reason: str  # released | owner-exited | forced


@dataclass(frozen=True)
class OwnerDied:
    claim: Claim


@dataclass(frozen=True)
class MembersChanged:
    claim: Claim


Event = ClaimGranted | ClaimReleased | OwnerDied | MembersChanged


class Ledger:
    """Live claims over a fixed inventory of GPUs."""

    def __init__(self, gpus: Iterable[Gpu]):
        self.gpus: dict[str, Gpu] = {g.uuid: g for g in sorted(gpus, key=lambda g: g.index)}
        self.claims: dict[str, Claim] = {}
        self._holder: dict[str, str] = {}  # GPU uuid -> claim id

    # -- queries ---------------------------------------------------------------------
    def holder(self, uuid: str) -> Claim | None:
        claim_id = self._holder.get(uuid)
        return self.claims[claim_id] if claim_id else None

    def free_gpus(self) -> list[Gpu]:
        return [g for uuid, g in self.gpus.items() if uuid not in self._holder]

    def get(self, claim_id: str) -> Claim:
        try:
            return self.claims[claim_id]
        except KeyError:
            raise NoSuchClaim(f"no claim {claim_id!r} (unknown or already released)") from None

    def gpu_by_name(self, name: str) -> Gpu:
        """A GPU by alias, ``gpuN``, index or UUID."""
        for g in self.gpus.values():
            if name in (g.uuid, g.label, str(g.index)):
                return g
        raise InvalidRequest(f"no GPU called {name!r}")

    # -- decisions -------------------------------------------------------------------
    def grant(
        self,
        request: ClaimRequest,
        claim_id: str,
        now_usec: int,
        busy: frozenset[str] = frozenset(),
    ) -> list[Event]:
        """Grant ``request.gpus`` free GPUs, all or nothing, skipping ``busy`` ones.

        ``busy`` holds the UUIDs on which evidence shows processes nobody claimed.
        """
        if claim_id in self.claims:
            raise InvalidRequest(f"claim id {claim_id!r} is taken")
        free = self.free_gpus()
        usable = [g for g in free if g.uuid not in busy]
        if len(usable) < request.gpus:
            if len(free) >= request.gpus:
                raise GPUsBusy(
                    f"{request.gpus} GPU(s) requested, {len(free)} unclaimed but "
                    f"{len(free) - len(usable)} of them run processes nobody claimed"
                )
            raise NotEnoughGPUs(f"{request.gpus} GPU(s) requested, {len(free)} free")
        chosen = tuple(g.uuid for g in usable[: request.gpus])
        claim = Claim(
            id=claim_id,
            mode=request.mode,
            gpus=chosen,
            owner=request.owner,
            uid=request.uid,
            user=request.user,
            label=request.label,
            task_name=request.task_name,
            created_usec=now_usec,
            members=request.members - {request.owner},
        )
        self.claims[claim_id] = claim
        for uuid in chosen:
            self._holder[uuid] = claim_id
        return [ClaimGranted(claim)]

    def restore(self, claims: Iterable[Claim]) -> list[tuple[Claim, str]]:
        """Take back claims from before a restart; returns those refused, with the reason."""
        refused = []
        for claim in claims:
            missing = [u for u in claim.gpus if u not in self.gpus]
            taken = [u for u in claim.gpus if u in self._holder]
            if missing or taken or claim.id in self.claims:
                why = f"GPU {missing[0]} is gone" if missing else (
                    f"GPU {taken[0]} is held twice" if taken else "duplicate id")
                refused.append((claim, why))
                continue
            self.claims[claim.id] = claim
            for uuid in claim.gpus:
                self._holder[uuid] = claim.id
        return refused

    def release(self, claim_id: str, reason: str = "released") -> list[Event]:
        claim = self.get(claim_id)
        del self.claims[claim_id]
        for uuid in claim.gpus:
            del self._holder[uuid]
        return [ClaimReleased(claim, reason)]

    def owner_died(self, claim_id: str, now_usec: int = 0) -> list[Event]:
        """The owner process is gone. A run claim ends once its members are gone too;
        a dev claim stays, marked dead (``release_dead_owner`` may end it later)."""
        claim = self.claims.get(claim_id)
        if claim is None or not claim.owner_alive:
            return []
        if claim.mode == "run" and not claim.members:
            return self.release(claim_id, "owner-exited")
        claim.owner_alive = False
        claim.owner_died_usec = now_usec
        return [OwnerDied(claim)]

    def add_members(self, claim_id: str, refs: Iterable[ProcessRef]) -> list[Event]:
        """Processes found to descend from the claim's processes become its members."""
        claim = self.claims.get(claim_id)
        if claim is None:
            return []
        new = frozenset(refs) - claim.members - {claim.owner}
        if not new:
            return []
        claim.members = claim.members | new
        return [MembersChanged(claim)]

    def member_exited(self, claim_id: str, ref: ProcessRef) -> list[Event]:
        """A member is gone; a run claim whose owner and members are all gone ends."""
        claim = self.claims.get(claim_id)
        if claim is None or ref not in claim.members:
            return []
        claim.members = claim.members - {ref}
        if claim.mode == "run" and not claim.owner_alive and not claim.members:
            return self.release(claim_id, "owner-exited")
        return [MembersChanged(claim)]

    def dead_owner_claims(self, now_usec: int, grace_usec: int) -> list[Claim]:
        """Dev claims whose owner died at least ``grace_usec`` ago (none when grace is 0)."""
        if grace_usec <= 0:
            return []
        return [
            c for c in self.claims.values()
            if c.mode == "dev" and not c.owner_alive and now_usec - c.owner_died_usec >= grace_usec
        ]

    # -- the invariant ---------------------------------------------------------------
    def check_invariants(self) -> None:
        seen: dict[str, str] = {}
        for claim in self.claims.values():
            assert claim.gpus, f"{claim.id} holds no GPU"
            for uuid in claim.gpus:
                assert uuid in self.gpus, f"{claim.id} holds unknown GPU {uuid}"
                assert uuid not in seen, f"{uuid} held by {seen.get(uuid)} and {claim.id}"
                seen[uuid] = claim.id
        assert seen == self._holder, "holder index out of step with the claims"
