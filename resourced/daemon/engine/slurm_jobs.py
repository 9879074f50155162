"""Slurm jobs as claims, the daemon's side: what a job's claim is called, which processes
are its own, and which GPUs the config gives Slurm.

A job's processes are found through its step daemons: slurmd starts one ``slurmstepd``
per step (``[1234.0]``, ``[1234.batch]``, ``[1234.extern]``), which titles itself
``slurmstepd: [<job>.<step>]`` and is the parent of the step's tasks.  Whatever the
process-tracking plugin (cgroup, linuxproc, pgid), the steps and their descendants are
the job's processes on this node; the daemon reads the titles (``/proc/<pid>/cmdline``,
readable by anyone) of root's processes named ``slurmstepd`` only.
"""

import logging
import re

from resourced.core.attribution import ProcInfo
from resourced.core.caller import Caller
from resourced.core.claims import Claim, ProcessRef, check_text
from resourced.core.lifecycle import CANCELLED, JOB_ENDED
from resourced.errors import InvalidArgs, quoted
from resourced.evidence.processes import PROC
from resourced.protocol.time import MINUTE, USEC

log = logging.getLogger("resourced")

STEP_TITLE = re.compile(rb"slurmstepd: \[(\d+)\.[\w.+-]+\]")
STEPD = "slurmstepd"
JOB_START_GRACE = MINUTE
"""Microseconds a Slurm job's claim waits for the job's first process (its prolog runs
before any); one that never came ends then (the epilog may have been missed)."""


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


class SlurmJobs:
    """Slurm jobs' claims: made by a job's prolog, ended by its epilog."""

    def __init__(self, engine):
        self.engine = engine

    async def claim(self, caller: Caller, job: str, gpu_names: list[str], uid: int,
                    name: str = "") -> Claim:
        """Slurm job ``job``'s GPUs here (names: index, UUID or alias) become its claim,
        in mode ``slurm``, for user ``uid``, labelled "slurm <job> <user> <name>"; its
        prolog asks, as root.  The claim is bound to the job's processes (its slurmstepd
        daemons and their descendants, adopted by the tracking sweep) and ends with them,
        at ``release_job`` (the epilog), or JOB_START_GRACE after it was made if none
        appeared.  A job that has a claim gets that claim back, labelled with ``name`` if
        one is given (the prolog claims at once, and names the job once slurmctld told
        it the name)."""
        if not (job.isascii() and job.isdigit()):
            raise InvalidArgs(f"a Slurm job id is a number, not {quoted(job)}")
        existing = self._job_claim(job)
        if existing is not None:
            if name:
                label = job_label(job, existing.user, name)
                self.engine.commit(self.engine.ledger.relabel(existing.id, label))
            return existing
        if not gpu_names:  # (with a name: naming the job's claim, which has ended)
            raise InvalidArgs(f"Slurm job {job} has no GPU here: nothing to claim")
        uuids = tuple(dict.fromkeys(self._job_gpu(n) for n in gpu_names))
        user = await self.engine.user_name(uid)
        label = job_label(job, user, name)
        self.engine.alarms.run_due()
        if (made := self._job_claim(job)) is not None:  # while the user name was looked up
            return made
        claim_id = self.engine.new_id()
        events = self.engine.ledger.start_job(claim_id, job, uuids, uid, user, label,
                                              self.engine.clock())
        self.engine.commit(events, undo=lambda: self.engine.ledger.release(claim_id, CANCELLED))
        for uuid in uuids:
            if uuid not in self.engine.ledger.slurm:
                log.warning("Slurm job %s runs on %s, which [slurm] gpus does not give Slurm",
                            job, self.engine.ledger.gpus[uuid].label)
        return self.engine.ledger.claims[claim_id]

    def release(self, job: str) -> list[str]:
        """End Slurm job ``job``'s claim (its epilog); the claims ended, none if it had
        ended already."""
        claim = self._job_claim(job)
        if claim is None:
            return []
        self.engine.end(claim.id, JOB_ENDED, None, "")
        return [claim.id]

    def _job_gpu(self, name: str) -> str:
        """The UUID of a GPU as Slurm names it: by UUID or alias, or by Slurm's number k,
        which counts the node's GPUs in gres.conf's order: the k-th of [slurm] gpus by
        index (our index k when the config gives Slurm none)."""
        slurm = sorted(self.engine.ledger.slurm, key=lambda u: self.engine.ledger.gpus[u].index)
        if not (slurm and name.isascii() and name.isdigit()):
            return self.engine.ledger.gpu_by_name(name).uuid
        if int(name) >= len(slurm):
            raise InvalidArgs(f"Slurm's GPU {name} is not here: [slurm] gpus gives Slurm "
                              f"{len(slurm)} GPU(s), numbered from 0 in index order")
        return slurm[int(name)]

    def _job_claim(self, job: str) -> Claim | None:
        return next((c for c in self.engine.ledger.claims.values() if c.job == job), None)

    def end_unstarted(self) -> None:
        now = self.engine.clock()
        for claim in list(self.engine.ledger.claims.values()):
            if claim.job and not claim.members and now - claim.created_usec > JOB_START_GRACE:
                self.engine.end(claim.id, JOB_ENDED, None,
                                f"no process of Slurm job {claim.job} appeared in "
                                f"{JOB_START_GRACE // USEC} s")
