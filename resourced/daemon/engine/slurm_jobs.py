"""Slurm jobs as claims, the daemon's side: what a job's claim is called, which processes
are its own, and which GPUs the config gives Slurm.

A job's processes are found through its step daemons: slurmd starts one ``slurmstepd``
per step (``[1234.0]``, ``[1234.batch]``, ``[1234.extern]``), which titles itself
``slurmstepd: [<job>.<step>]`` and is the parent of the step's tasks.  Whatever the
process-tracking plugin (cgroup, linuxproc, pgid), the steps and their descendants are
the job's processes on this node; the daemon reads the titles (``/proc/<pid>/cmdline``,
readable by anyone) of root's processes named ``slurmstepd`` only.
"""

import re

from resourced.core.attribution import ProcInfo
from resourced.core.claims import ProcessRef, check_text
from resourced.evidence.processes import PROC

STEP_TITLE = re.compile(rb"slurmstepd: \[(\d+)\.[\w.+-]+\]")
STEPD = "slurmstepd"


def job_label(job: str, user: str, name: str) -> str:
    """"slurm 1234 alice train.sh": what status and verify show for the job's claim,
    checked as every label is (one short line)."""
    label = " ".join(part for part in ("slurm", job, user, name) if part)
    check_text("label", label)
    return label


def step_job(cmdline: bytes) -> str | None:
    """The job id in a slurmstepd's title, None if it is not one."""
    found = STEP_TITLE.match(cmdline)
    return found.group(1).decode() if found else None


def read_cmdline(pid: int) -> bytes:
    """A process's raw command line (its title), b"" once it is gone (blocking)."""
    try:
        with open(f"{PROC}/{pid}/cmdline", "rb") as f:
            return f.read(256)
    except OSError:
        return b""


def job_steps(table: dict[int, ProcInfo], read=read_cmdline) -> dict[str, set[ProcessRef]]:
    """Job id -> its step daemons, among the processes of ``table`` (blocking: reads the
    titles of the slurmstepd processes).  Only root's count: slurmd runs them as root,
    and anyone may name a process slurmstepd and title it so (to pass their own use for
    a job's, or to keep the job's claim alive)."""
    steps: dict[str, set[ProcessRef]] = {}
    for info in table.values():
        if info.name == STEPD and info.uid == 0:
            job = step_job(read(info.pid))
            if job is not None:
                steps.setdefault(job, set()).add(info.ref)
    return steps


def slurm_gpus(wanted, gpus) -> tuple[frozenset[str], list[str]]:
    """The UUIDs of the managed ``gpus`` that ``[slurm] gpus`` gives Slurm ("all", or
    names: UUID, alias, ``gpuN`` or index), and the names that match none."""
    if wanted == "all":
        return frozenset(g.uuid for g in gpus), []
    found, unknown = set(), []
    for name in wanted:
        match = [g.uuid for g in gpus
                 if name in (g.label, str(g.index)) or name.lower() == g.uuid.lower()]
        if match:
            found.update(match)
        else:
            unknown.append(name)
    return frozenset(found), unknown
