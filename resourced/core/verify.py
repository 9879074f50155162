"""Comparing the claims with what really runs on each GPU: the verify statuses."""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .ledger import Ledger

OK = "OK"
IDLE_CLAIM = "IDLE CLAIM"            # claimed, nothing running
UNCLAIMED_USE = "UNCLAIMED USE"      # a process on a GPU nobody claimed
FOREIGN_PROCESS = "FOREIGN PROCESS"  # a process on a claimed GPU that is not the claimant's
MISSING = "MISSING"                  # a managed or configured GPU the driver does not report
UNKNOWN = "UNKNOWN"                  # the driver did not answer
OVERDUE = "OVERDUE"                  # held past its time: a booking waits for it

PROBLEMS = frozenset({UNCLAIMED_USE, FOREIGN_PROCESS, MISSING, UNKNOWN, OVERDUE})


@dataclass(frozen=True)
class SeenProcess:
    """A compute process on a GPU, with whatever could be learnt about it."""

    pid: int
    used_memory_bytes: int = 0
    uid: int = -1
    user: str = ""
    command: str = ""
    claim_id: str = ""   # the claim it belongs to, "" for none
    ambiguous: str = ""  # why it cannot be attributed, if it cannot
    container: str = ""  # the container it runs in ("docker 3f2a..."), "" for none


@dataclass(frozen=True)
class GpuReport:
    uuid: str
    alias: str
    index: int
    status: str
    claim_id: str  # the holder, or the sharing claims joined by commas; "" if unclaimed
    processes: tuple[SeenProcess, ...] = ()
    detail: str = ""


def _waited_for(ledger: Ledger, claim, uuid: str) -> bool:
    """Whether the booking an overdue claim was granted until waits for GPU ``uuid``
    (a booking's claim waits for exactly its GPUs; one no longer known: say so)."""
    booking = ledger.claims.get(claim.until_booking)
    return booking is None or uuid in booking.on


def verify(
    ledger: Ledger,
    seen: Mapping[str, Sequence[SeenProcess]] | None,
    unknown_reason: str = "",
    configured_missing: Sequence[tuple[str, str, int]] = (),
) -> list[GpuReport]:
    """One report per GPU. ``seen`` maps UUIDs to processes, None if the driver did not
    answer; ``configured_missing`` lists (uuid, alias, index) of configured GPUs absent."""
    reports = []
    for gpu in ledger.gpus.values():
        claimants = {c.id for c in ledger.claims_on(gpu.uuid)}
        claim_id = ",".join(sorted(claimants))
        if seen is None:
            reports.append(GpuReport(gpu.uuid, gpu.label, gpu.index, UNKNOWN, claim_id,
                                     detail=unknown_reason))
            continue
        if gpu.uuid not in seen:
            reports.append(GpuReport(gpu.uuid, gpu.label, gpu.index, MISSING, claim_id,
                                     detail="the driver does not report this GPU"))
            continue
        procs = tuple(seen[gpu.uuid])
        overdue = [c for c in ledger.claims_on(gpu.uuid) if c.overdue
                   and _waited_for(ledger, c, gpu.uuid)]
        detail = ""
        if not claimants:
            status = UNCLAIMED_USE if procs else OK
        elif any(p.claim_id not in claimants for p in procs):
            status = FOREIGN_PROCESS
        elif overdue:
            status = OVERDUE
            detail = "; ".join(f"{c.id} ({c.user or c.uid}) was granted until booking "
                               f"{c.until_booking} began; it waits for this GPU"
                               for c in overdue)
        else:
            status = OK if procs else IDLE_CLAIM
        reports.append(GpuReport(gpu.uuid, gpu.label, gpu.index, status, claim_id, procs,
                                 detail))
    for uuid, alias, index in configured_missing:
        reports.append(GpuReport(uuid, alias, index, MISSING, "",
                                 detail="configured, but the driver does not report it"))
    return reports
