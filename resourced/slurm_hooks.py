"""``gpuctl slurm prolog`` and ``gpuctl slurm epilog``: a Slurm job's GPUs as a claim.

slurmd runs them as root (``SlurmdUser``) in the job's environment: ``SLURM_JOB_ID``,
``SLURM_JOB_UID``, ``SLURM_JOB_USER`` and the GPUs (``slurm_jobs.job_gpus``).  The
prolog asks the daemon to make the GPUs the job's claim (``Client.claim_job``), the
epilog to end it (``Client.release_job``).

Neither ever stops a job: Slurm drains a node whose prolog or epilog fails, so once run
by slurmd they exit 0 whatever happens, within ``DEADLINE`` seconds, and say what went
wrong on stderr and in syslog (ident ``gpuctl-slurm``).  Exit 2 only when not run by
slurmd at all (no ``SLURM_JOB_ID``).
"""

import os
import re
import shutil
import signal
import subprocess
import sys
import syslog
import time

DEADLINE = 1.5
"""Seconds a hook may take in all (the job waits for the prolog)."""
NAME_TIMEOUT = 0.5
"""Seconds to ask slurmctld for the job's name, when the environment lacks it."""
GPU_VARIABLES = ("SLURM_JOB_GPUS", "SLURM_STEP_GPUS", "CUDA_VISIBLE_DEVICES")
"""Where a job's GPUs on this node are read from, first found first: the prolog and epilog
get ``SLURM_JOB_GPUS``; a task gets ``SLURM_STEP_GPUS`` and ``CUDA_VISIBLE_DEVICES``."""
EXIT_OK = 0
EXIT_USAGE = 2
_JOB_NAME = re.compile(r"\bJobName=(.*?) UserId=")


class _Late(Exception):
    """The deadline passed."""


def job_gpus(environ) -> list[str]:
    """The job's GPUs as the first of ``GPU_VARIABLES`` set names them: Slurm's numbers
    (the node's GPUs counted from 0 in gres.conf's order; the daemon maps them to its
    own, see ``Engine.claim_job``) or UUIDs (``GPU-...``)."""
    for name in GPU_VARIABLES:
        value = environ.get(name, "").strip()
        if value and value != "NoDevFiles":
            return [part.strip() for part in value.split(",") if part.strip()]
    return []


def run(hook: str, environ=os.environ) -> int:
    """Run the ``prolog`` or ``epilog`` for the job in ``environ``; the exit code."""
    job = environ.get("SLURM_JOB_ID", "")
    if not job:
        print(f"gpuctl: slurm {hook} is run by slurmd (Prolog=, Epilog= in slurm.conf); "
              "SLURM_JOB_ID is not set", file=sys.stderr)
        return EXIT_USAGE
    start = time.monotonic()
    previous = signal.signal(signal.SIGALRM, _late)
    signal.setitimer(signal.ITIMER_REAL, DEADLINE)
    try:
        (_prolog if hook == "prolog" else _epilog)(job, environ, start)
    except _Late:
        _warn(f"{hook} of Slurm job {job}: gave up after {DEADLINE:g} s; the job goes on")
    except Exception as exc:  # noqa: BLE001 - a hook must never fail a job: log, exit 0
        _warn(f"{hook} of Slurm job {job}: {exc}")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    return EXIT_OK


def _prolog(job: str, environ, start: float) -> None:
    gpus = job_gpus(environ)
    if not gpus:
        return  # no GPU here: nothing to claim
    uid = int(environ["SLURM_JOB_UID"]) if environ.get("SLURM_JOB_UID", "").isdigit() else None
    name = environ.get("SLURM_JOB_NAME") or _job_name(job, environ)
    with _client(start) as client:
        client.claim_job(job, gpus, uid, _printable(name))


def _epilog(job: str, environ, start: float) -> None:
    with _client(start) as client:
        client.release_job(job)


def _client(start: float):
    from .client import Client

    return Client(timeout=max(0.1, DEADLINE - (time.monotonic() - start)))


def _job_name(job: str, environ) -> str:
    """The job's name from slurmctld (22.05 gives the prolog no SLURM_JOB_NAME); "" if
    it does not answer in NAME_TIMEOUT."""
    scontrol = shutil.which("scontrol", path=environ.get("PATH") or "/usr/bin:/usr/local/bin")
    if scontrol is None:
        return ""
    try:
        out = subprocess.run([scontrol, "show", "job", "-o", job], check=False, capture_output=True,
                             text=True, timeout=NAME_TIMEOUT, env=dict(environ),
                             stdin=subprocess.DEVNULL).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""
    found = _JOB_NAME.search(out)
    return found.group(1) if found else ""


def _printable(text: str, limit: int = 100) -> str:
    """A job name fit for a label: one line, at most ``limit`` characters."""
    return "".join(c if c.isprintable() else "?" for c in text)[:limit]


def _late(signum, frame):
    raise _Late


def _warn(message: str) -> None:
    """To stderr and syslog (the daemon's audit log has the claims themselves)."""
    print(f"gpuctl: {message}", file=sys.stderr)
    syslog.openlog("gpuctl-slurm", syslog.LOG_PID, syslog.LOG_DAEMON)
    syslog.syslog(syslog.LOG_WARNING, message)

