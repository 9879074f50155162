"""Live claims on disk, so a daemon restart or crash loses nothing it acknowledged.

Theory of operation: the runtime directory (tmpfs: ``/run/resourced`` or
``$XDG_RUNTIME_DIR/resourced``) holds ``claims.log``, an append-only log of JSON lines:
a header naming the boot, then one record per change.  Each change is one ``write(2)``
on an ``O_APPEND`` descriptor, done before the daemon replies, so a crash at any
instant leaves every acknowledged change in the file (the kernel keeps the page even if
the process dies; a reboot clears tmpfs, which is what "reboot clears claims" wants).
A crash in the middle of a write can only tear the *last* line, which was never
acknowledged and is ignored.  The log is compacted (rewritten as a snapshot, atomically
by rename) when it grows well past the number of live claims, so appending stays O(1)
and restart stays O(live claims).

A file that cannot be trusted (bad header, a corrupt line before the end) is moved
aside as ``claims.log.corrupt-<time>`` with a log line, and the daemon starts with the
records it read before the damage.  A header from another boot discards the claims.
"""

import fcntl
import json
import logging
import os
import stat
import time
from pathlib import Path

from .core.claims import Claim, Demand, ProcessRef
from .core.ledger import (
    ClaimGranted,
    ClaimQueued,
    ClaimReleased,
    Event,
    MembersChanged,
    OwnerDied,
    ReclaimAsked,
    ReclaimWithdrawn,
)
from .errors import ResourcedError

log = logging.getLogger("resourced")

FORMAT = 2
LOG_NAME = "claims.log"
LOCK_NAME = "lock"
COMPACT_SLACK = 256


class StoreError(Exception):
    """The runtime directory cannot be used (symlink, foreign owner, unwritable)."""


class StoreBusy(StoreError):
    """Another daemon holds the runtime directory's lock."""


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
    }


def claim_from_record(data: dict) -> Claim:
    d = data["demand"]
    return Claim(**{
        **data,
        "demand": Demand(d["gpus"], d["vram"], tuple((n, a) for n, a in d["pools"])),
        "owner": ProcessRef(**data["owner"]),
        "gpus": tuple(data["gpus"]),
        "members": frozenset(ProcessRef(pid, start) for pid, start in data["members"]),
    })


def prepare_runtime_dir(path: Path) -> Path:
    """Create the directory private to us (0700), refusing symlinks and foreign owners."""
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        st = os.lstat(path)
    except OSError as exc:
        raise StoreError(f"cannot use runtime directory {path}: {exc.strerror}") from exc
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise StoreError(f"runtime directory {path} is a symlink or not a directory; refusing it")
    _keep_private(path, st, 0o700, "runtime directory ")
    return path


def _keep_private(path: Path, st: os.stat_result, mode: int, what: str) -> None:
    """Refuse another user's file; reset (and say so) a mode that lets others in."""
    if st.st_uid != os.geteuid():
        raise StoreError(f"{what}{path} belongs to uid {st.st_uid}, not to us; refusing it")
    if st.st_mode & 0o077:
        log.warning("%s%s was mode %04o; reset to %04o", what, path, st.st_mode & 0o7777, mode)
        os.chmod(path, mode)


def check_log_file(path: Path) -> None:
    """The claims log must be a regular file of ours, private (0600): say what is wrong,
    and reset a mode that let others read it."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise StoreError(f"cannot use {path}: {exc.strerror}") from exc
    if not stat.S_ISREG(st.st_mode):
        what = "a directory" if stat.S_ISDIR(st.st_mode) else "a symlink" if stat.S_ISLNK(
            st.st_mode) else "not a regular file"
        raise StoreError(f"{path} is {what}; move it away (the daemon keeps its claims there)")
    _keep_private(path, st, 0o600, "")


class ClaimStore:
    """The claims log in one runtime directory, which it locks for its lifetime."""

    def __init__(self, runtime_dir: Path, boot_id: str):
        self.dir = prepare_runtime_dir(runtime_dir)
        self.path = self.dir / LOG_NAME
        self.boot_id = boot_id
        self._lock_fd = self._lock()
        self._fd: int | None = None
        self._records = 0

    def _lock(self) -> int:
        fd = os.open(self.dir / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise StoreBusy(f"another resourced is using runtime directory {self.dir}") from None
        return fd

    # -- restore -----------------------------------------------------------------------
    def load(self) -> dict[str, Claim]:
        """The claims the log holds (none from another boot); then the log is compacted."""
        claims = self._read()
        self.rewrite(claims.values())
        return claims

    def _read(self) -> dict[str, Claim]:
        check_log_file(self.path)
        try:
            lines = self.path.read_bytes().split(b"\n")
        except FileNotFoundError:
            return {}
        except OSError as exc:
            raise StoreError(f"cannot read {self.path}: {exc.strerror}") from exc
        claims: dict[str, Claim] = {}
        complete, torn = lines[:-1], lines[-1]
        if torn:
            log.warning("%s: ignoring an incomplete last record (a crash mid-write)", self.path)
        for number, line in enumerate(complete, 1):
            try:
                record = json.loads(line)
                if number == 1:
                    if record.get("format") != FORMAT:
                        raise ValueError(f"unknown format {record.get('format')!r}")
                    if record.get("boot_id") != self.boot_id:
                        log.warning("%s is from another boot; its claims are void", self.path)
                        return {}
                    continue
                self._apply(claims, record)
            # Anything a damaged record can raise: the file is not to be trusted past here.
            except (ValueError, KeyError, TypeError, AttributeError, ResourcedError) as exc:
                self._set_aside(f"line {number}: {exc}")
                return claims
        return claims

    @staticmethod
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

    def _set_aside(self, why: str) -> None:
        aside = self.path.with_name(f"{LOG_NAME}.corrupt-{int(time.time())}")
        os.replace(self.path, aside)
        log.error("%s is damaged (%s); moved to %s, starting from the records before it",
                  self.path, why, aside.name)

    # -- writing -----------------------------------------------------------------------
    def rewrite(self, claims) -> None:
        """Replace the log with a snapshot of ``claims`` (atomic: temp file, fsync, rename)."""
        lines = [{"format": FORMAT, "boot_id": self.boot_id}]
        lines += [{"op": "grant", "claim": claim_to_record(c)} for c in claims]
        tmp = self.path.with_name(LOG_NAME + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            os.write(fd, b"".join(json.dumps(r).encode() + b"\n" for r in lines))
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.path)
        self._reopen()
        self._records = len(lines)

    def _reopen(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW)

    def record(self, events: list[Event], live_claims: dict[str, Claim]) -> None:
        """Append the events, one write; compact when the log has grown past its use."""
        records = []
        for event in events:
            if isinstance(event, (ClaimGranted, ClaimQueued)):
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
        if not records:
            return
        data = b"".join(json.dumps(r).encode() + b"\n" for r in records)
        if os.write(self._fd, data) != len(data):
            raise OSError(f"short write to {self.path}")
        self._records += len(records)
        if self._records > 2 * len(live_claims) + COMPACT_SLACK:
            self.rewrite(live_claims.values())

    def close(self) -> None:
        for fd in (self._fd, self._lock_fd):
            if fd is not None:
                os.close(fd)
        self._fd = self._lock_fd = None
