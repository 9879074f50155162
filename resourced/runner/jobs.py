"""A booking's command: the job file that keeps it, private to its owner, and the shim
that runs it.

``gpuctl book ... -- COMMAND`` writes ``<jobs dir>/<booking id>.json`` (the command's
argv, its working directory and environment) in the owner's own state directory,
``$XDG_STATE_HOME/resourced/jobs`` (default ``~/.local/state/resourced/jobs``): the
directory is 0700, the files 0600, each written whole (a temporary file, fsync, rename).
The command never goes to the daemon; the daemon only hears how it stands (``ReportJob``).

The owner's runner (``gpuctl runner``, ``resourced.runner.service``) starts it at the
booking's start.  It is started at most once, whatever crashes when: the runner starts a
*shim* (``python -m resourced.runner.jobs shim DIR ID``) that waits on a pipe, marks the job
file ``running`` with the shim's pid and process start time, and only then tells the
shim to go.  A runner that dies before that leaves a shim that reads end-of-file and
exits without running anything; one that dies after finds the job marked running when
it comes back, and adopts the shim if it is still there (same pid, start time and boot),
else reports the job failed.

The shim is the job's process-group and session leader (the runner signals the whole
group: the command and whatever it started), ignores the signals meant for the command,
runs the command with its output into a pipe, writes that output to ``<id>.log`` (bounded,
see ``LogWriter``), and when the command is gone writes its exit status to ``<id>.exit``.
It outlives the runner, so a restarted runner still learns how the command ended.

Everything here but ``shim_main`` is pure or touches only the jobs directory; the unit
tests exercise it directly.
"""

import contextlib
import hashlib
import json
import os
import re
import signal
import stat
import sys
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

from resourced.core.lifecycle import (
    CANCELLED,
    FAILED,
    JOB,
    JOB_STATES,
    MISSED,
    PENDING,
    SUCCEEDED,
    TIMED_OUT,
)
from resourced.linux.atomic_file import write_atomically
from resourced.linux.xdg import base_dir
from resourced.protocol.time import MINUTE, USEC
from resourced.supervision.stopping import stop_signal

MISSED_AFTER_USEC = MINUTE
"""A job whose booking had started longer than this before the runner saw it is missed."""
LOG_LIMIT = 10 * 1024 * 1024
"""A job's log keeps at most this much: the newest output, in two halves (see LogWriter)."""
RESTART_DETAIL = "runner restarted; the command's end was not seen"
SHIM_NOT_TOLD = 125
"""The shim's exit status when the runner went away before telling it to run."""
FILE_VERSION = 1
MAX_DETAIL = 256  # the daemon's limit on a text (core.claims.MAX_TEXT)

_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")

DROPPED_ENV = frozenset({
    # the terminal the booking was made on
    "TERM", "COLORTERM", "TERM_PROGRAM", "TERM_PROGRAM_VERSION", "TERM_SESSION_ID",
    "COLUMNS", "LINES", "WINDOWID", "TMUX", "TMUX_PANE", "STY", "WINDOW", "GPG_TTY",
    # the login session: its SSH connection and agent, its display, its bus
    "SSH_TTY", "SSH_CLIENT", "SSH_CONNECTION", "SSH_AUTH_SOCK", "SSH_AGENT_PID",
    "GPG_AGENT_INFO", "DISPLAY", "WAYLAND_DISPLAY", "XAUTHORITY", "XDG_SESSION_ID",
    "XDG_SESSION_TYPE", "XDG_SESSION_CLASS", "XDG_SESSION_DESKTOP", "XDG_SEAT", "XDG_VTNR",
    "DBUS_SESSION_BUS_ADDRESS", "XDG_RUNTIME_DIR",
    # the shell, and the service manager of whatever ran gpuctl
    "SHLVL", "OLDPWD", "PWD", "_", "INVOCATION_ID", "JOURNAL_STREAM", "NOTIFY_SOCKET",
    "LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES", "MANAGERPID", "SYSTEMD_EXEC_PID",
    "WATCHDOG_PID", "WATCHDOG_USEC",
    # a claim's own (booked from inside `gpuctl run` or `env`): the booking's come instead
    "CUDA_VISIBLE_DEVICES", "RESOURCED_ALLOCATION", "RESOURCED_GPU_UUIDS",
    "RESOURCED_VRAM_BYTES", "RESOURCED_POOLS",
})
"""Variables of the moment of booking, not of the command: they would be stale or wrong
hours later.  Everything else is kept (PATH, HOME, a virtualenv's, PYTHONPATH, CUDA_HOME,
LD_LIBRARY_PATH, HF_HOME, tokens...)."""
LIVE_ENV = ("DBUS_SESSION_BUS_ADDRESS", "XDG_RUNTIME_DIR")
"""Taken from the runner when it starts the command (it has the current ones)."""


class JobError(Exception):
    """A job file or the jobs directory cannot be used, or a move is not allowed."""


@dataclass(frozen=True)
class Job:
    """What a job file holds."""

    booking: str
    argv: list[str]
    cwd: str
    env: dict[str, str]
    bus: str = ""                 # the bus of the daemon the booking was made on
    daemon: str = ""              # and that daemon's Instance: its runner's alone
    created_usec: int = 0
    state: str = PENDING
    pid: int = 0                  # the shim's (the process group's leader), once running
    pid_start: int = 0            # its start time, /proc/<pid>/stat field 22 (clock ticks)
    boot_id: str = ""             # and the boot it ran in
    started_usec: int = 0
    end_usec: int = 0             # the booking's end, as last known (a runner restarted
                                  # while the daemon is away still stops it then)
    ended_usec: int = 0
    exit_code: int = -1
    detail: str = ""
    stopping: str = ""            # timed-out or cancelled: why the runner is stopping it
    reported: bool = False        # whether the daemon has been told this state
    origin: str = ""              # what made it: "" gpuctl book, "mcp" resourced-mcp's run
    session: str = ""             # the agent session its booking belongs to (as booked)
    op_id: str = ""               # the operation id it was asked with (resourced-mcp)
    release_when_done: bool = False  # end the booking once the command has ended (run now)
    version: int = FILE_VERSION
    extra: dict = field(default_factory=dict, compare=False)  # keys of newer versions

    def to_json(self) -> str:
        data = asdict(self)
        extra = data.pop("extra")
        return json.dumps({**extra, **data}, sort_keys=True, indent=1) + "\n"

    @classmethod
    def from_json(cls, text: str) -> "Job":
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise JobError(f"not JSON: {exc}") from None
        if not isinstance(data, dict):
            raise JobError("not a JSON object")
        known = {f.name for f in fields(cls)} - {"extra"}
        try:
            job = cls(**{k: v for k, v in data.items() if k in known},
                      extra={k: v for k, v in data.items() if k not in known})
        except TypeError as exc:
            raise JobError(str(exc)) from None
        if job.version > FILE_VERSION:
            raise JobError(f"written by a newer resourced (version {job.version})")
        if (not isinstance(job.argv, list) or not job.argv
                or not all(isinstance(a, str) for a in job.argv)
                or not isinstance(job.env, dict) or job.state not in JOB_STATES):
            raise JobError("malformed job file")
        return job

    @property
    def final(self) -> bool:
        return self.state in JOB.final


def advance(job: Job, state: str, **changes) -> Job:
    """``job`` moved to ``state`` (not yet told to the daemon); a move the job's lifecycle
    (``core.lifecycle.JOB``) does not allow raises JobError."""
    if not JOB.allows(job.state, state):
        raise JobError(f"job {job.booking} is {job.state}; it cannot become {state}")
    if "detail" in changes:
        changes["detail"] = one_line(changes["detail"])
    return replace(job, state=state, reported=False, **changes)


def one_line(text: str, limit: int = MAX_DETAIL) -> str:
    """``text`` as the daemon takes a detail: one line of at most ``limit`` characters."""
    text = "".join(" " if ord(c) < 0x20 or ord(c) == 0x7F else c for c in text)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def final_state(exit_code: int, stopping: str) -> str:
    """How a command that ran ended: the reason it was being stopped, else by its code."""
    if stopping:
        return stopping
    return SUCCEEDED if exit_code == 0 else FAILED


# -- where job files live --------------------------------------------------------------
def jobs_dir(environ=None) -> Path:
    """``$XDG_STATE_HOME/resourced/jobs``; a relative XDG_STATE_HOME is ignored (XDG)."""
    return Path(base_dir("XDG_STATE_HOME", os.environ if environ is None else environ),
                "resourced", "jobs")


def ensure_dir(path: Path) -> Path:
    """Create ``path`` (and its missing parents) 0700; refuse one that is a symlink or
    not ours, and make it 0700 if it is not."""
    missing = []
    parent = path
    while not parent.exists() and parent != parent.parent:
        missing.append(parent)
        parent = parent.parent
    for directory in reversed(missing):
        with contextlib.suppress(FileExistsError):
            os.mkdir(directory, 0o700)
            os.chmod(directory, 0o700)  # whatever the umask
    try:
        st = os.lstat(path)
    except OSError as exc:
        raise JobError(f"cannot use {path}: {exc.strerror}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise JobError(f"{path} is not a directory (a symlink is refused)")
    if st.st_uid != os.getuid():
        raise JobError(f"{path} belongs to uid {st.st_uid}, not to you")
    if stat.S_IMODE(st.st_mode) != 0o700:
        os.chmod(path, 0o700)
    return path


def runner_lock(directory: Path, bus: str) -> Path:
    """The file the runner for ``bus`` holds locked (flock) while it runs: one runner per
    user and bus, so the session's daemon and the system's each have theirs."""
    name = bus if bus in ("session", "system") else \
        "bus-" + hashlib.sha256(bus.encode()).hexdigest()[:12]
    return directory / f"runner-{name}.lock"


def runner_is_running(directory: Path, bus: str) -> bool:
    """Whether a runner for ``bus`` holds its lock in the jobs directory now."""
    import fcntl

    try:
        fd = os.open(runner_lock(directory, bus), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def valid_id(booking_id: str) -> bool:
    return bool(_ID.match(booking_id))


def job_path(directory: Path, booking_id: str, suffix: str = ".json") -> Path:
    if not valid_id(booking_id):
        raise JobError(f"{booking_id!r} is not a booking reference")
    return directory / f"{booking_id}{suffix}"


def save(directory: Path, job: Job) -> None:
    write_atomically(job_path(directory, job.booking), job.to_json())


def create(directory: Path, job: Job) -> None:
    """Write a new job file; one already there for that booking is kept (JobError)."""
    path = job_path(directory, job.booking)
    if path.exists():
        raise JobError(f"booking {job.booking} already has a command")
    save(directory, job)


def load(directory: Path, booking_id: str) -> Job | None:
    """The job of ``booking_id``; None if it has none; JobError if the file is bad."""
    try:
        text = job_path(directory, booking_id).read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise JobError(f"cannot read the job of {booking_id}: {exc.strerror}") from None
    job = Job.from_json(text)
    if job.booking != booking_id:
        raise JobError(f"the job file of {booking_id} names {job.booking}")
    return job


def job_ids(directory: Path) -> list[str]:
    """The bookings that have a job file, sorted."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    return sorted(n[:-5] for n in names if n.endswith(".json") and valid_id(n[:-5]))


def new_job(booking_id: str, argv: list[str], cwd: str, environ, bus: str,
            now_usec: int, daemon: str = "") -> Job:
    """A pending job for ``argv``, run in ``cwd`` with ``environ`` as kept_env keeps it,
    booked with the daemon ``daemon`` (its Instance) on ``bus``."""
    if not argv:
        raise JobError("no command given")
    return Job(booking=booking_id, argv=list(argv), cwd=cwd, env=kept_env(environ), bus=bus,
               daemon=daemon, created_usec=now_usec)


def kept_env(environ) -> dict[str, str]:
    """The environment a command booked now should run with later: see DROPPED_ENV."""
    return {k: v for k, v in environ.items() if k not in DROPPED_ENV}


def command_env(job: Job, claim_env: dict[str, str], booking_id: str, session: str,
                runner_env) -> dict[str, str]:
    """What the command runs with: the kept environment, the runner's live variables,
    then the booking's claim (CUDA_VISIBLE_DEVICES...), RESOURCED_ALLOCATION and, when
    the booking has one, RESOURCED_SESSION."""
    env = dict(job.env)
    env.update({k: runner_env[k] for k in LIVE_ENV if k in runner_env})
    env.update(claim_env)
    env["RESOURCED_ALLOCATION"] = booking_id
    if session:
        env["RESOURCED_SESSION"] = session
    env["PWD"] = job.cwd
    return env


# -- what the runner decides -----------------------------------------------------------
START = "start"


def pending_decision(booking: dict | None, seen_usec: int | None) -> tuple[str, str] | None:
    """What to do with a pending job, given its booking's record (None: the daemon no
    longer has it) and when the runner first saw the booking active (None: not yet):
    (START, ""), (MISSED or CANCELLED, why), or None to wait."""
    if booking is None:
        return MISSED, "its booking is gone"
    if booking["state"] == "scheduled":
        return None
    if booking["state"] == "ended":
        how = booking.get("ended", "")
        if how == "expired":
            return MISSED, "the booking ended before its command could start"
        reason = booking.get("reason") or ""
        return CANCELLED, f"the booking was {how or 'ended'}" + (f": {reason}" if reason else "")
    if seen_usec is None:
        return None
    late = seen_usec - booking["start_usec"]
    if late > MISSED_AFTER_USEC:
        return MISSED, (f"the runner saw the booking {late // USEC} s after its start "
                        f"(more than {MISSED_AFTER_USEC // USEC} s)")
    return START, ""


@dataclass(frozen=True)
class StopStep:
    """A running job's next step: the signal to send now (None: none) and why it is being
    stopped ("": it is not)."""

    signal: int | None
    stopping: str


GRACE_SHARE = 4
"""The grace before a booking's end is at most a quarter of the booking: a 30 s grace would
stop the command of a 20 s booking at once."""


def grace_for(booking: dict, grace_usec: int) -> int:
    """The grace before this booking's end: the runner's, capped at a part of its length."""
    return min(grace_usec, (booking["end_usec"] - booking["start_usec"]) // GRACE_SHARE)


def stop_step(booking: dict | None, now_usec: int, grace_usec: int, sent: int | None,
              stopping: str, grace_over: bool) -> StopStep:
    """For a running job, as ``stop_signal`` decides (``sent``: the last signal sent to its
    group; ``grace_over``: whether the grace has passed since its SIGTERM): a booking
    cancelled, released or gone, SIGTERM now and SIGKILL after the grace (cancelled);
    else SIGTERM ``grace_usec`` (at most a quarter of the booking: ``grace_for``) before
    the booking's end and SIGKILL at it, the end not the grace (timed-out)."""
    ended = booking is None or booking["state"] == "ended"
    if ended and (booking is None or booking.get("ended") != "expired"):
        return StopStep(stop_signal(sent, True, grace_over), stopping or CANCELLED)
    end = booking["end_usec"]
    kill_due = ended or now_usec >= end
    if not kill_due and now_usec < end - grace_for(booking, grace_usec):
        return StopStep(None, stopping)
    return StopStep(stop_signal(sent, True, False, kill_due), stopping or TIMED_OUT)


def ended_job(job: Job, exit_status: dict | None, killed: bool, now_usec: int) -> Job:
    """A running job whose shim is gone: how it ended, from the shim's exit file, or if
    there is none, ``killed`` (the runner SIGKILLed its group) or not seen at all."""
    if exit_status is not None:
        code = int(exit_status.get("exit_code", -1))
        detail = str(exit_status.get("detail") or exit_status.get("signal") or "")
    elif killed:
        code, detail = 128 + signal.SIGKILL, "SIGKILL"
    else:
        code, detail = -1, RESTART_DETAIL
    return advance(job, final_state(code, job.stopping), exit_code=code, detail=detail,
                   ended_usec=now_usec)


# -- processes -------------------------------------------------------------------------
def boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def process_start(pid: int) -> int | None:
    """``pid``'s start time (clock ticks since boot: /proc/<pid>/stat field 22), or None if
    there is no such process or it is a zombie."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    rest = text[text.rfind(")") + 2:].split()  # fields 3... (the name may hold anything)
    if len(rest) < 20 or rest[0] in ("Z", "X"):
        return None
    return int(rest[19])


def alive(job: Job, boot: str | None = None) -> bool:
    """Whether the job's shim is still the process it recorded (pid, start time, boot)."""
    if not job.pid:
        return False
    boot = boot_id() if boot is None else boot
    if job.boot_id and boot and job.boot_id != boot:
        return False
    return process_start(job.pid) == job.pid_start


def read_exit(directory: Path, booking_id: str) -> dict | None:
    """What the shim wrote when the command ended; None if it wrote nothing (readable)."""
    try:
        data = json.loads(job_path(directory, booking_id, ".exit").read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


# -- the log ---------------------------------------------------------------------------
class LogWriter:
    """A job's output, kept to at most ``limit`` bytes: it is written to ``path`` until
    that holds half the limit, then ``path`` becomes ``path.1`` (the older half before it
    is dropped) and a new ``path`` begins.  So the log always has the newest output, at
    least half the limit of it once there was that much, and what is dropped is the
    oldest (``gpuctl logs`` says so).  Files are 0600."""

    def __init__(self, path: Path, limit: int = LOG_LIMIT):
        self.path = path
        self.older = older_log(path)
        self.segment = max(1, limit // 2)
        self.dropped = 0  # bytes of output no longer in either file
        self._open()

    def _open(self) -> None:
        self.fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW,
                          0o600)
        self.size = os.fstat(self.fd).st_size

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            room = self.segment - self.size
            if room <= 0:
                self.rotate()
                continue
            written = os.write(self.fd, view[:room])
            self.size += written
            view = view[written:]

    def rotate(self) -> None:
        os.close(self.fd)
        with contextlib.suppress(FileNotFoundError):
            self.dropped += os.stat(self.older).st_size
        os.replace(self.path, self.older)
        self._open()

    def close(self) -> None:
        os.close(self.fd)


def older_log(path: Path) -> Path:
    return path.with_name(path.name + ".1")


def read_log(path: Path) -> bytes:
    """All a job's log holds, oldest first."""
    out = b""
    for part in (older_log(path), path):
        with contextlib.suppress(FileNotFoundError):
            out += part.read_bytes()
    return out


# -- the shim --------------------------------------------------------------------------
IGNORED_BY_SHIM = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT,
                   signal.SIGUSR1, signal.SIGUSR2, signal.SIGPIPE)
LEFTOVER_DRAIN = 2.0
"""Seconds the shim still copies output after the command exited (what it left behind
in its group is sent SIGTERM)."""


def shim_main(args: list[str]) -> int:
    """``python -m resourced.runner.jobs shim DIR ID``: read the command (JSON: argv, cwd, env,
    log_limit) from stdin, run it with its output into the job's log, write the exit file;
    exit with the command's status.  Nothing is run if stdin ends empty (the runner
    never said go)."""
    import select
    import time

    if len(args) != 3 or args[0] != "shim":
        sys.stderr.write("usage: python -m resourced.runner.jobs shim DIR ID\n")
        return 2
    directory, booking_id = Path(args[1]), args[2]
    for sig in IGNORED_BY_SHIM:  # meant for the command (the runner signals the group)
        signal.signal(sig, signal.SIG_IGN)
    chunks = []
    while chunk := os.read(0, 65536):
        chunks.append(chunk)
    if not chunks:
        return SHIM_NOT_TOLD
    spec = json.loads(b"".join(chunks))
    log = LogWriter(job_path(directory, booking_id, ".log"), int(spec.get("log_limit", LOG_LIMIT)))
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe2(os.O_CLOEXEC)  # says why the exec failed
    pid = os.fork()
    if pid == 0:  # the command
        _exec_command(spec, out_r, out_w, err_r, err_w)
    os.close(out_w)
    os.close(err_w)
    status = None
    drain_until = None
    try:
        while True:
            timeout = 0.5 if drain_until is None else max(0.0, drain_until - time.monotonic())
            ready, _, _ = select.select([out_r], [], [], timeout)
            if ready:
                data = os.read(out_r, 65536)
                if not data:
                    break
                log.write(data)
            if status is None:
                done, wait_status = os.waitpid(pid, os.WNOHANG)
                if done:
                    status = wait_status
                    if os.getpgrp() == os.getpid():  # what the command left in our group
                        with contextlib.suppress(OSError):  # (we ignore SIGTERM)
                            os.killpg(os.getpgrp(), signal.SIGTERM)
                    drain_until = time.monotonic() + LEFTOVER_DRAIN
            elif time.monotonic() >= drain_until:
                break
        if status is None:
            _, status = os.waitpid(pid, 0)
    finally:
        log.close()
    why = b""
    while chunk := os.read(err_r, 4096):
        why += chunk
    code = os.waitstatus_to_exitcode(status)
    died_of = signal_name(-code) if code < 0 else ""
    code = 128 - code if code < 0 else code
    write_atomically(job_path(directory, booking_id, ".exit"), json.dumps(
        {"exit_code": code, "signal": died_of,
         "detail": why.decode(errors="replace") or died_of}) + "\n")
    return code


def _exec_command(spec: dict, out_r: int, out_w: int, err_r: int, err_w: int) -> None:
    """In the forked child: default signals, output into the pipe, exec; never returns
    (126: cannot run it or enter its directory, 127: not found)."""
    code = 126
    try:
        for sig in IGNORED_BY_SHIM:
            signal.signal(sig, signal.SIG_DFL)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(out_w, 1)
        os.dup2(out_w, 2)
        for fd in (null, out_r, out_w, err_r):
            os.close(fd)
        argv = spec["argv"]
        try:
            os.chdir(spec["cwd"])
        except OSError as exc:
            why = f"cannot enter {spec['cwd']}: {exc.strerror}"
        else:
            try:
                os.execvpe(argv[0], argv, spec["env"])
            except OSError as exc:
                why = f"cannot run {argv[0]}: {exc.strerror}"
                code = 127 if isinstance(exc, FileNotFoundError) else 126
        os.write(2, f"gpuctl runner: {why}\n".encode())
        os.write(err_w, why.encode())
    finally:
        os._exit(code)


if __name__ == "__main__":
    sys.exit(shim_main(sys.argv[1:]))
