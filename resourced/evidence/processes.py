"""Processes as (pid, start time): reading /proc, and the boot they belong to."""

import errno
import functools
import os

from resourced.core.claims import ProcessRef

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


def _read(path: str) -> bytes:
    """A whole /proc file, read with plain system calls (a buffered ``open`` costs twice
    as much, and a claim reads two or three of these)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = [os.read(fd, 4096)]
        while chunks[-1]:
            chunks.append(os.read(fd, 65536))
    finally:
        os.close(fd)
    return b"".join(chunks)


def _stat_fields(pid: int) -> list[str]:
    """Fields 3.. of /proc/<pid>/stat (the command name may hold spaces and parentheses)."""
    data = _read(f"{PROC}/{pid}/stat")
    return data[data.rindex(b")") + 2 :].decode().split()


def _status_field(pid: int, name: bytes) -> bytes | None:
    """The first value of a line of /proc/<pid>/status (``name`` with its colon)."""
    for line in _read(f"{PROC}/{pid}/status").split(b"\n"):
        if line.startswith(name):
            return line.split()[1]
    return None


def _is_process(pid: int) -> bool:
    """False for a thread id: /proc/<tid> exists for threads too, but only a leader is a process."""
    tgid = _status_field(pid, b"Tgid:")
    return tgid is not None and int(tgid) == pid


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


def parent_and_name(pid: int) -> tuple[int, str] | None:
    """The parent pid and command name of a live process, or None."""
    try:
        data = _read(f"{PROC}/{pid}/stat")
    except OSError:
        return None
    name = data[data.index(b"(") + 1:data.rindex(b")")].decode(errors="replace")
    return int(data[data.rindex(b")") + 2:].split()[1]), name


def process_uid(pid: int) -> int | None:
    """The real uid of a process (the ``Uid:`` line of its status), or None if it is gone."""
    try:
        uid = _status_field(pid, b"Uid:")
        return None if uid is None else int(uid)
    except (OSError, ValueError):
        return None


def process_session(pid: int) -> int | None:
    """The Unix session id of a process (field 6 of its stat, as ``getsid`` answers it
    without a read of /proc: 0 when the session leader is outside our PID namespace),
    or None if it is gone."""
    try:
        return os.getsid(pid)
    except OSError:
        return None


def boot_id() -> str:
    with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
        return f.read().strip()
