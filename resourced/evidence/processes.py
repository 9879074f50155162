"""Processes as (pid, start time): reading /proc, and the boot they belong to."""

import errno
import functools
import os

from ..core.claims import ProcessRef

PROC = "/proc"
GONE = (errno.ESRCH, errno.EINVAL)
"""What pidfd_open says of a process that is not there (EINVAL: a thread id, not a
process).  Anything else (EMFILE when the descriptor table is full, say) says nothing
about the process and is raised: a live owner must never be taken for a dead one."""


@functools.cache
def pid_max() -> int:
    """The largest pid the kernel hands out (``/proc/sys/kernel/pid_max``, read once)."""
    try:
        with open(f"{PROC}/sys/kernel/pid_max", "rb") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 2**22  # the kernel's own ceiling on 64-bit machines


def open_pidfd(pid: int) -> int | None:
    """A pidfd for ``pid``, or None if no such process exists; other failures raise."""
    if not 0 < pid <= pid_max():
        return None
    try:
        return os.pidfd_open(pid)
    except OSError as exc:
        if exc.errno in GONE:
            return None
        raise


def _stat_fields(pid: int) -> list[str]:
    """Fields 3.. of /proc/<pid>/stat (the command name may hold spaces and parentheses)."""
    with open(f"{PROC}/{pid}/stat", "rb") as f:
        data = f.read()
    return data[data.rindex(b")") + 2 :].decode().split()


def _is_process(pid: int) -> bool:
    """False for a thread id: /proc/<tid> exists for threads too, but only a leader is a process."""
    with open(f"{PROC}/{pid}/status", "rb") as f:
        for line in f:
            if line.startswith(b"Tgid:"):
                return int(line.split()[1]) == pid
    return False


def process_ref(pid: int) -> ProcessRef | None:
    """The live process with this pid, or None if there is none (zombies and threads are not)."""
    if pid <= 0:
        return None
    try:
        fields = _stat_fields(pid)
        if fields[0] in ("Z", "X") or not _is_process(pid):
            return None
    except (OSError, ValueError):
        return None
    return ProcessRef(pid, int(fields[19]))


def pin_process(pid: int) -> tuple[ProcessRef, int] | None:
    """The live process ``pid`` and a pidfd pinning it, or None (gone, zombie, or a thread id:
    pidfd_open refuses those).  One /proc read, where ``process_ref`` needs two.  Raises
    ``OSError`` when the pidfd cannot be had for another reason (``EMFILE``)."""
    fd = open_pidfd(pid)
    if fd is None:
        return None
    try:
        fields = _stat_fields(pid)
        if fields[0] not in ("Z", "X"):
            return ProcessRef(pid, int(fields[19])), fd
    except (OSError, ValueError):
        pass
    os.close(fd)
    return None


def is_alive(ref: ProcessRef) -> bool:
    """True while the very process ``ref`` names runs (a reused pid is another process)."""
    try:
        fields = _stat_fields(ref.pid)
    except (OSError, ValueError):
        return False
    return fields[0] not in ("Z", "X") and int(fields[19]) == ref.start_time


def process_uid(pid: int) -> int | None:
    """The real uid of a process (the ``Uid:`` line of its status), or None if it is gone."""
    try:
        with open(f"{PROC}/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"Uid:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


def process_session(pid: int) -> int | None:
    """The Unix session id of a process (field 6 of its stat), or None if it is gone."""
    try:
        return int(_stat_fields(pid)[3])
    except (OSError, ValueError, IndexError):
        return None


def boot_id() -> str:
    with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
        return f.read().strip()
