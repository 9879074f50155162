"""``gpuctl slurm prolog`` and ``gpuctl slurm epilog``: a Slurm job's GPUs as a claim.

slurmd runs them as root (``SlurmdUser``) in the job's environment: ``SLURM_JOB_ID``,
``SLURM_JOB_UID`` and the GPUs (``job_gpus``).  The prolog asks the daemon to make the
GPUs the job's claim (``Manager.ClaimJob``), the epilog to end it (``ReleaseJob``).

slurmd makes every job wait for the prolog, so the hooks are lean: ``gpuctl`` sends them
here before loading its command line (``resourced.gpuctl``), they import no D-Bus library
and make their one call with ``busctl`` (a C program).  Python's D-Bus client would cost
every job about 25 ms more of imports.  The daemon is the system service's, or the one
``$RESOURCED_BUS`` names (``session``, ``shared``).

Neither ever stops a job: Slurm drains a node whose prolog or epilog fails, so once run
by slurmd they exit 0 whatever happens, within ``DEADLINE`` seconds (every wait has a
deadline; busctl is killed past its own), and say what went
wrong on stderr and in syslog (ident ``gpuctl-slurm``).  Exit 2 only when not run by
slurmd at all (no ``SLURM_JOB_ID``).
"""

import os
import select
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
_MANAGER = ("org.resourced", "/org/resourced", "org.resourced.Manager")


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
    try:
        (_prolog if hook == "prolog" else _epilog)(job, environ, start)
    except Exception as exc:  # noqa: BLE001 - a hook must never fail a job: log, exit 0
        _warn(f"{hook} of Slurm job {job}: {exc}")
    return EXIT_OK


def _prolog(job: str, environ, start: float) -> None:
    gpus = job_gpus(environ)
    if not gpus:
        return  # no GPU here: nothing to claim
    uid = environ.get("SLURM_JOB_UID", "")
    name = environ.get("SLURM_JOB_NAME", "")
    lookup = None if name else _ask_job_name(job, environ)
    options = [*(["UID", "u", uid] if uid.isdigit() else []),
               *(["Name", "s", _printable(name)] if name else [])]
    _call(environ, _left(start), "ClaimJob", "sasa{sv}", job, str(len(gpus)), *gpus,
          str(len(options) // 3), *options)
    if lookup is not None:
        _name_later(job, lookup, environ)


def _epilog(job: str, environ, start: float) -> None:
    """The job has ended: its claim ends before the epilog does, so that the next job
    on these GPUs (which slurmd starts only after the epilog) finds them free."""
    _call(environ, _left(start), "ReleaseJob", "s", job)


def _name_later(job: str, lookup: tuple[int, int], environ) -> None:
    """The job starts now; a child of ours names the job's claim once slurmctld has
    answered (ClaimJob with a Name and no GPUs), so the job does not wait for that."""
    if not _detached():
        os.close(lookup[1])
        return
    try:
        name = _job_name(lookup)
        if name:
            _call(environ, NAME_TIMEOUT, "ClaimJob", "sasa{sv}", job, "0", "1", "Name", "s",
                  _printable(name))
    except Exception as exc:  # noqa: BLE001 - to syslog; the job goes on regardless
        _warn(f"prolog of Slurm job {job}: could not name its claim: {exc}")
    finally:
        os._exit(0)


def _call(environ, timeout: float, method: str, *args: str) -> None:
    """One call to the daemon's Manager with busctl; RuntimeError says why it failed.
    ``--`` ends busctl's options before the call: the arguments come from the job (its
    name is the user's to choose), and busctl reads options anywhere else on its line."""
    bus = environ.get("RESOURCED_BUS", "")
    if bus == "shared":
        from resourced.client.discovery import target

        where = [f"--address={target(environ).address}"]
    else:
        where = ["--user"] if bus == "session" else ["--system"]
    pid, out = _spawn(["busctl", *where, f"--timeout={timeout:.3f}", "--", "call", *_MANAGER,
                       method, *args], environ)
    text, ended = _read_all(out, time.monotonic() + timeout + 0.1)
    if not ended:  # busctl outlived its own timeout
        os.kill(pid, 9)  # SIGKILL (the signal module would cost every job 8 ms of imports)
    _, status = os.waitpid(pid, 0)
    if not ended:
        raise RuntimeError(f"no answer in {timeout:.1f} s; the job goes on")
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(text.strip() or f"busctl {method} failed")


def _spawn(argv: list[str], environ) -> tuple[int, int]:
    """Start ``argv`` (from $PATH) with stdout and stderr into a pipe: (pid, its read end)."""
    read, write = os.pipe()
    actions = [(os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
               (os.POSIX_SPAWN_DUP2, write, 1), (os.POSIX_SPAWN_DUP2, write, 2),
               (os.POSIX_SPAWN_CLOSE, read)]
    try:
        pid = os.posix_spawnp(argv[0], argv, dict(environ), file_actions=actions)
    finally:
        os.close(write)
    return pid, read


def _read_all(fd: int, deadline: float) -> tuple[str, bool]:
    """What a child writes to ``fd`` until it closes it or ``deadline`` passes, and
    whether it closed it (its end, normally)."""
    chunks, ended = [], False
    try:
        while (left := deadline - time.monotonic()) > 0 and select.select([fd], [], [], left)[0]:
            chunk = os.read(fd, 65536)
            if not chunk:
                ended = True
                break
            chunks.append(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks).decode(errors="replace"), ended


def _left(start: float) -> float:
    return max(0.1, DEADLINE - 0.1 - (time.monotonic() - start))


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


def _ask_job_name(job: str, environ) -> tuple[int, int] | None:
    """Start asking slurmctld for the job's name (22.05 gives the prolog no
    SLURM_JOB_NAME): the running ``scontrol`` (pid, output), or None without one."""
    try:
        return _spawn(["scontrol", "show", "job", "-o", job], environ)
    except OSError:
        return None


def _job_name(lookup: tuple[int, int]) -> str:
    """The name ``scontrol`` answers with; "" if it does not in NAME_TIMEOUT."""
    text, _ = _read_all(lookup[1], time.monotonic() + NAME_TIMEOUT)  # (not our child now)
    start = text.find(" JobName=")  # "JobId=1234 JobName=train.sh UserId=alice(1000) ..."
    end = text.find(" UserId=", start)
    return text[start + len(" JobName="):end] if 0 <= start < end else ""


def _printable(text: str, limit: int = 100) -> str:
    """A job name fit for a label: one line, at most ``limit`` characters."""
    return "".join(c if c.isprintable() else "?" for c in text)[:limit]


def _warn(message: str) -> None:
    """To stderr and syslog (the daemon's audit log has the claims themselves)."""
    import syslog

    print(f"gpuctl: {message}", file=sys.stderr)
    syslog.openlog("gpuctl-slurm", syslog.LOG_PID, syslog.LOG_DAEMON)
    syslog.syslog(syslog.LOG_WARNING, message)
