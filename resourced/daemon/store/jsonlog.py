"""An append-only log of JSON lines in a private directory that one daemon locks.

Theory of operation: the file holds a header line, then one record per change.  Each
batch of records is one ``write(2)`` on an ``O_APPEND`` descriptor, done before the
daemon replies, so a crash at any instant leaves every acknowledged record in the file.
A ``durable`` log must outlive a power cut too: ``synced()`` returns once an ``fsync``
has put every line written so far on disk, and the daemon awaits it before replying.
The ``fsync`` runs in a thread of its own, so a slow disk delays the replies that wait
for it, never the loop (pings, properties, other calls go on); one ``fsync`` serves
every write made before it began (a group commit).  A crash in the middle of a write can
only tear the *last* line, which was never acknowledged and is ignored.  The owner
compacts the log (a snapshot, written to a temporary file, synced and renamed over it)
when it grows well past what it describes, so appending stays O(1) and reading stays
O(what is live).

A file that cannot be trusted (a corrupt line before the end, a record its owner cannot
apply) is moved aside as ``<name>.corrupt-<time>`` with a log line, and the owner starts
from the records before the damage.
"""

import asyncio
import fcntl
import json
import logging
import os
import stat
import time
from collections.abc import Callable
from pathlib import Path

from resourced.linux.atomic_file import write_atomically
from resourced.linux.threads import OneThread

log = logging.getLogger("resourced")

LOCK_NAME = "lock"


class StoreError(Exception):
    """A directory or log that cannot be used (symlink, foreign owner, unwritable)."""


class StoreBusy(StoreError):
    """Another daemon holds the directory's lock."""


def prepare_private_dir(path: Path, what: str) -> Path:
    """Create the directory private to us (0700), refusing symlinks and foreign owners;
    ``what`` names it in messages ("runtime directory")."""
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        st = os.lstat(path)
    except OSError as exc:
        raise StoreError(f"cannot use {what} {path}: {exc.strerror}") from exc
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise StoreError(f"{what} {path} is a symlink or not a directory; refusing it")
    _keep_private(path, st, 0o700, f"{what} ")
    return path


def _keep_private(path: Path, st: os.stat_result, mode: int, what: str) -> None:
    """Refuse another user's file; reset (and say so) a mode that lets others in."""
    if st.st_uid != os.geteuid():
        raise StoreError(f"{what}{path} belongs to uid {st.st_uid}, not to us; refusing it")
    if st.st_mode & 0o077:
        log.warning("%s%s was mode %04o; reset to %04o", what, path, st.st_mode & 0o7777, mode)
        os.chmod(path, mode)


def check_log_file(path: Path) -> None:
    """A log must be a regular file of ours, private (0600): say what is wrong, and reset
    a mode that let others read it."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise StoreError(f"cannot use {path}: {exc.strerror}") from exc
    if not stat.S_ISREG(st.st_mode):
        what = "a directory" if stat.S_ISDIR(st.st_mode) else "a symlink" if stat.S_ISLNK(
            st.st_mode) else "not a regular file"
        raise StoreError(f"{path} is {what}; move it away (the daemon keeps its records there)")
    _keep_private(path, st, 0o600, "")


DAMAGE = (ValueError, KeyError, TypeError, AttributeError)
"""What applying a damaged record can raise: the file is not to be trusted past it."""


class JsonLog:
    """One log file in one directory, which it locks for its lifetime."""

    def __init__(self, directory: Path, name: str, what: str, durable: bool = False,
                 damage: tuple[type[Exception], ...] = DAMAGE):
        self.dir = prepare_private_dir(directory, what)
        self.path = self.dir / name
        self.what = what
        self.durable = durable
        self.damage = damage
        self.records = 0  # lines in the file, header included
        self._lock_fd = self._lock()
        self._fd: int | None = None
        self._written = self._synced = 0  # writes made, and those known to be on disk
        self._syncing: asyncio.Future | None = None
        self._syncer = OneThread(f"resourced-sync-{name}")

    def _lock(self) -> int:
        fd = os.open(self.dir / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW,
                     0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise StoreBusy(f"another resourced is using {self.what} {self.dir}") from None
        return fd

    def read(self, header: Callable[[dict], bool], apply: Callable[[dict], None]) -> bool:
        """Hand the header to ``header`` (False: the records are void, stop) and each
        record to ``apply``, in order; a damaged line or record sets the file aside.
        True when the file was there and read whole, every line trusted: then ``records``
        counts them, and the owner may ``keep`` it as it is."""
        check_log_file(self.path)
        try:
            lines = self.path.read_bytes().split(b"\n")
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise StoreError(f"cannot read {self.path}: {exc.strerror}") from exc
        complete, torn = lines[:-1], lines[-1]
        if torn:
            log.warning("%s: ignoring an incomplete last record (a crash mid-write)", self.path)
        for number, line in enumerate(complete, 1):
            try:
                record = json.loads(line)
                if number == 1:
                    if not header(record):
                        return False
                    continue
                apply(record)
            except self.damage as exc:
                self._set_aside(f"line {number}: {exc}")
                return False
        self.records = len(complete)
        return not torn

    def _set_aside(self, why: str) -> None:
        aside = self.path.with_name(f"{self.path.name}.corrupt-{int(time.time())}")
        os.replace(self.path, aside)
        log.error("%s is damaged (%s); moved to %s, starting from the records before it",
                  self.path, why, aside.name)

    def rewrite(self, lines: list[dict]) -> None:
        """Replace the log with ``lines`` (the header first), atomically."""
        write_atomically(self.path, _encode(lines))
        self._synced = self._written  # what the old file held, the new one holds, synced
        self.records = len(lines)
        self.keep()

    def keep(self) -> None:
        """Append to the file as it is now (after ``rewrite``, or a ``read`` that found
        it whole)."""
        if self._fd is not None:
            os.close(self._fd)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW)

    def append(self, lines: list[dict]) -> None:
        """Add ``lines`` in one write.  A durable log starts syncing it to disk (off the
        loop; ``synced`` awaits it), or syncs at once where no loop runs."""
        if not lines:
            return
        data = _encode(lines)
        if os.write(self._fd, data) != len(data):
            raise OSError(f"short write to {self.path}")
        self.records += len(lines)
        if not self.durable:
            return
        self._written += 1
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            os.fsync(self._fd)
            self._synced = self._written
        else:
            self._start_sync()

    async def synced(self) -> None:
        """Return once every line written so far is on disk; the ``OSError`` of an
        ``fsync`` that failed (the lines are in the file, maybe not on the disk)."""
        target = self._written
        while self._synced < target:
            error = await asyncio.shield(self._start_sync())
            if error is not None:
                raise error

    def _start_sync(self) -> asyncio.Future:
        """The sync in flight, or a new one: an ``fsync`` of a duplicate descriptor (a
        compaction may close ours meanwhile), resolving to None or its ``OSError``."""
        if self._syncing is None:
            self._syncing = asyncio.ensure_future(self._sync(self._written, os.dup(self._fd)))
        return self._syncing

    async def _sync(self, upto: int, fd: int) -> OSError | None:
        try:
            await asyncio.get_running_loop().run_in_executor(self._syncer, _fsync_closing, fd)
        except OSError as exc:
            log.error("cannot sync %s to disk: %s", self.path, exc.strerror or exc)
            return exc
        else:
            self._synced = max(self._synced, upto)
            return None
        finally:
            self._syncing = None

    def close(self) -> None:
        if self._fd is not None and self._synced < self._written:
            os.fsync(self._fd)  # at exit: what a sync in flight had not reached yet
        for fd in (self._fd, self._lock_fd):
            if fd is not None:
                os.close(fd)
        self._fd = self._lock_fd = None


def _fsync_closing(fd: int) -> None:
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _encode(lines: list[dict]) -> bytes:
    return b"".join(json.dumps(r).encode() + b"\n" for r in lines)
