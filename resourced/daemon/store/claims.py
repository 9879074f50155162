"""Live claims on disk, so a daemon restart or crash loses nothing it acknowledged.

The runtime directory (tmpfs: ``/run/resourced`` or ``$XDG_RUNTIME_DIR/resourced``) holds
``claims.log``, a ``jsonlog.JsonLog`` (which says how appends, torn lines, damage and
compaction work): a header naming the boot, then one record per change, appended before
the daemon replies.  A reboot clears tmpfs, which is what "reboot clears claims" wants,
and a header from another boot discards the claims.  The log is compacted when it grows
well past the number of live claims, so restart stays O(live claims).
"""

import logging
from pathlib import Path

from resourced.core.claims import Claim, Demand, ProcessRef
from resourced.core.ledger import (
    ClaimGranted,
    ClaimQueued,
    ClaimReleased,
    Event,
    MembersChanged,
    OwnerDied,
    ReclaimAsked,
    ReclaimWithdrawn,
    Relabelled,
    UntilChanged,
)
from resourced.errors import ResourcedError

from .jsonlog import DAMAGE, JsonLog, prepare_private_dir

log = logging.getLogger("resourced")

FORMAT = 2
LOG_NAME = "claims.log"
COMPACT_SLACK = 256


def claim_to_record(claim: Claim) -> dict:
    # Written out rather than dataclasses.asdict, which deep-copies: this is on every grant.
    d = claim.demand
    return {
        "id": claim.id, "mode": claim.mode, "state": claim.state, "seq": claim.seq,
        "demand": {"gpus": d.gpus, "vram": d.vram, "pools": [list(p) for p in d.pools]},
        "gpus": list(claim.gpus),
        "owner": {"pid": claim.owner.pid, "start_time": claim.owner.start_time},
        "uid": claim.uid, "user": claim.user, "label": claim.label,
        "task_name": claim.task_name, "created_usec": claim.created_usec,
        "priority": claim.priority, "reclaimable": claim.reclaimable,
        "reclaim_for": claim.reclaim_for, "queue_deadline_usec": claim.queue_deadline_usec,
        "owner_alive": claim.owner_alive, "owner_died_usec": claim.owner_died_usec,
        "members": sorted([m.pid, m.start_time] for m in claim.members),
        "end_usec": claim.end_usec, "on": list(claim.on), "until_usec": claim.until_usec,
        "until_booking": claim.until_booking, "overdue": claim.overdue,
        "session": claim.session, "job": claim.job, "reply_to": claim.reply_to,
        "reply_serial": claim.reply_serial, "isolated": claim.isolated,
    }


def claim_from_record(data: dict) -> Claim:
    d = data["demand"]
    return Claim(**{
        **data,
        "demand": Demand(d["gpus"], d["vram"], tuple((n, a) for n, a in d["pools"])),
        "owner": ProcessRef(**data["owner"]),
        "gpus": tuple(data["gpus"]),
        "on": tuple(data.get("on", ())),
        "members": frozenset(ProcessRef(pid, start) for pid, start in data["members"]),
    })


def prepare_runtime_dir(path: Path) -> Path:
    """Create the runtime directory private to us (0700), refusing symlinks and foreign
    owners."""
    return prepare_private_dir(path, "runtime directory")


class ClaimStore:
    """The claims log in one runtime directory, which it locks for its lifetime."""

    def __init__(self, runtime_dir: Path, boot_id: str):
        self.log = JsonLog(runtime_dir, LOG_NAME, "runtime directory",
                           damage=(*DAMAGE, ResourcedError))
        self.dir, self.path = self.log.dir, self.log.path
        self.boot_id = boot_id

    # -- restore -----------------------------------------------------------------------
    def load(self) -> dict[str, Claim]:
        """The claims the log holds (none from another boot).  A log read whole is kept
        as it is, to be compacted when it grows past its use as always (a quarter of a
        restart with 10,000 claims was spent writing its snapshot); any other (torn,
        damaged, from another boot, missing) is replaced by a snapshot at once."""
        claims: dict[str, Claim] = {}

        def header(record: dict) -> bool:
            if record.get("format") != FORMAT:
                raise ValueError(f"unknown format {record.get('format')!r}")
            if record.get("boot_id") != self.boot_id:
                log.warning("%s is from another boot; its claims are void", self.path)
                return False
            return True

        if self.log.read(header, lambda record: _apply(claims, record)):
            self.log.keep()
        else:
            self.rewrite(claims.values())
        return claims

    # -- writing -----------------------------------------------------------------------
    def rewrite(self, claims) -> None:
        """Replace the log with a snapshot of ``claims``."""
        self.log.rewrite([{"format": FORMAT, "boot_id": self.boot_id},
                          *({"op": "grant", "claim": claim_to_record(c)} for c in claims)])

    def record(self, events: list[Event], live_claims: dict[str, Claim]) -> None:
        """Append the events, one write; compact when the log has grown past its use."""
        records = []
        for event in events:
            if isinstance(event, (ClaimGranted, ClaimQueued, UntilChanged, Relabelled)):
                records.append({"op": "grant", "claim": claim_to_record(event.claim)})
            elif isinstance(event, ClaimReleased):
                records.append({"op": "release", "id": event.claim.id})
            elif isinstance(event, OwnerDied):
                records.append({"op": "owner-died", "id": event.claim.id,
                                "usec": event.claim.owner_died_usec})
            elif isinstance(event, MembersChanged):
                records.append({"op": "members", "id": event.claim.id,
                                "members": claim_to_record(event.claim)["members"]})
            elif isinstance(event, (ReclaimAsked, ReclaimWithdrawn)):
                records.append({"op": "reclaim", "id": event.claim.id,
                                "for": event.claim.reclaim_for})
        self.log.append(records)
        if self.log.records > 2 * len(live_claims) + COMPACT_SLACK:
            self.rewrite(live_claims.values())

    def close(self) -> None:
        self.log.close()


def _apply(claims: dict[str, Claim], record: dict) -> None:
    op = record["op"]
    if op == "grant":
        claim = claim_from_record(record["claim"])
        claims[claim.id] = claim
    elif op == "release":
        claims.pop(record["id"], None)
    elif op == "owner-died":
        if record["id"] in claims:
            claims[record["id"]].owner_alive = False
            claims[record["id"]].owner_died_usec = record.get("usec", 0)
    elif op == "members":
        if record["id"] in claims:
            claims[record["id"]].members = frozenset(ProcessRef(p, s) for p, s in record["members"])
    elif op == "reclaim":
        if record["id"] in claims:
            claims[record["id"]].reclaim_for = record["for"]
    else:
        raise ValueError(f"unknown op {op!r}")
