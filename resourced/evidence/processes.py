"""Processes as (pid, start time): reading /proc, and the boot they belong to."""

import os

from ..core.claims import ProcessRef

PROC = "/proc"


def _stat_fields(pid: int) -> list[str]:
    """Fields 3.. of /proc/<pid>/stat (the command name may hold spaces and parentheses)."""
    with open(f"{PROC}/{pid}/stat", "rb") as f:
        data = f.read()
    return data[data.rindex(b")") + 2 :].decode().split()


def process_ref(pid: int) -> ProcessRef | None:
    """The live process with this pid, or None if there is none (zombies count as gone)."""
    if pid <= 0:
        return None
    try:
        fields = _stat_fields(pid)
    except (OSError, ValueError):
        return None
    if fields[0] in ("Z", "X"):
        return None
    return ProcessRef(pid, int(fields[19]))


def is_alive(ref: ProcessRef) -> bool:
    """True while the very process ``ref`` names runs (a reused pid is another process)."""
    return process_ref(ref.pid) == ref


def process_uid(pid: int) -> int | None:
    """The real uid of a process, or None if it is gone."""
    try:
        return os.stat(f"{PROC}/{pid}").st_uid
    except OSError:
        return None


def boot_id() -> str:
    with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
        return f.read().strip()
