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
import signal
import sys
import time

DEADLINE = 1.5
"""Seconds a hook may take in all (the job waits for the prolog)."""
NAME_TIMEOUT = 5.0
"""Seconds to wait for slurmctld to tell the job's name, when the environment lacks it
(off the job's path: see ``_name_later``)."""
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
    name = environ.get("SLURM_JOB_NAME", "")
    lookup = None if name else _ask_job_name(job, environ)  # runs while the client loads
    with _client(start) as client:
        client.claim_job(job, gpus, uid, _printable(name))
    if lookup is not None:
        _name_later(job, lookup)


def _name_later(job: str, lookup) -> None:
    """The job starts now; a child of ours names the job's claim once slurmctld has
    answered, so the job does not wait for that."""
    if not _detached():
        return
    try:
        name = _job_name(lookup)
        if name:
            from .client import Client

            with Client(timeout=NAME_TIMEOUT) as client:
                client.claim_job(job, [], None, _printable(name))
    except Exception as exc:  # noqa: BLE001 - to syslog; the job goes on regardless
        _warn(f"prolog of Slurm job {job}: could not name its claim: {exc}")
    finally:
        os._exit(0)


def _epilog(job: str, environ, start: float) -> None:
    """The job has ended: its claim ends before the epilog does, so that the next job
    on these GPUs (which slurmd starts only after the epilog) finds them free."""
    with _client(start) as client:
        client.release_job(job)


def _detached() -> bool:
    """Fork: False in the parent (which goes on at once), True in the child, which is in a
    session of its own with no output (slurmd waits for neither) and must ``os._exit``."""
    if os.fork():
        return False
    os.setsid()
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    return True


def _client(start: float):
    from .client import Client

    return Client(timeout=max(0.1, DEADLINE - (time.monotonic() - start)))


def _ask_job_name(job: str, environ):
    """Start asking slurmctld for the job's name (22.05 gives the prolog no
    SLURM_JOB_NAME): the running ``scontrol``, or None without one."""
    import shutil
    import subprocess

    scontrol = shutil.which("scontrol", path=environ.get("PATH") or "/usr/bin:/usr/local/bin")
    if scontrol is None:
        return None
    try:
        return subprocess.Popen([scontrol, "show", "job", "-o", job], env=dict(environ),
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, text=True)
    except OSError:
        return None


def _job_name(lookup) -> str:
    """The name ``scontrol`` answers with; "" if it does not in NAME_TIMEOUT."""
    import subprocess

    try:
        out, _ = lookup.communicate(timeout=NAME_TIMEOUT)
    except subprocess.TimeoutExpired:
        lookup.kill()
        lookup.wait()
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
    import syslog

    print(f"gpuctl: {message}", file=sys.stderr)
    syslog.openlog("gpuctl-slurm", syslog.LOG_PID, syslog.LOG_DAEMON)
    syslog.syslog(syslog.LOG_WARNING, message)

