"""resourced-mcp's jobs: a command an agent asks to run now, kept and run as a booked
command is (``resourced.runner``), for agents whose own commands run in a sandbox that
cannot reach the bus or the GPUs.

``start`` books the GPUs from now for the time limit (when they fit now; else it says
where and when they would, and books nothing), writes the booking's job file with the
command, and leaves the rest to the user's runner, which starts the command on the
booking's GPUs, outside the MCP session: it runs on when the session ends, and a
restarted agent finds it again by its reference (the booking's id).  Its booking ends
with it (``Job.release_when_done``), so the GPUs are free as soon as it is over.

Nothing runs that the person did not allow: ``[mcp]`` in their configuration file
(``resourced.config.McpConfig``), read again at each call, must turn ``run`` on and allow
the command (``allow_commands``) and the folder (``allow_dirs``).  Each refusal names the
setting and the file, and nothing is booked or kept.

Everything here but ``start`` and ``stop`` (which take an open client) touches only the
configuration file and the jobs directory.
"""

import os
import shlex
from pathlib import Path

from resourced.errors import InvalidArgs, ResourcedError

ORIGIN = "mcp"
LOG_CHUNK = 64 * 1024
"""Bytes ``logs`` answers by default; MAX_LOG_CHUNK at most."""
MAX_LOG_CHUNK = 1024 * 1024
START_WAIT = 3.0
"""Seconds ``run`` waits for the runner to start the command before it answers (pending)."""
STOP_WAIT = 5.0
"""Seconds ``stop`` waits for the command to be gone before it answers (stopping)."""
REASON = "stopped through resourced-mcp"
RUNNER_HINT = ("outside the sandbox, run `gpuctl runner --bus {bus}` (in a terminal of its "
               "own), or enable it once: systemctl --user enable --now "
               "resourced-runner.service")


class Refused(Exception):
    """A ``run`` the person's configuration does not allow, or one that cannot start (no
    runner): nothing was booked or kept.  The MCP server answers it as a tool error whose
    code is ``NotAllowed`` (here only: never a bus error)."""

    code = "NotAllowed"

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


# -- what the person allows ------------------------------------------------------------------
def policy(environ=None):
    """``(the [mcp] settings, the file they came from or "")``, from the configuration file
    found as every resourced program finds it; Refused naming the problem of a bad file."""
    from resourced.config import ConfigError, find_config, load_config

    environ = os.environ if environ is None else environ
    try:
        found = load_config(find_config(None, environ))
    except ConfigError as exc:
        raise Refused(f"the configuration file cannot be read, so nothing may run: {exc}") \
            from None
    return found.mcp, found.source


def _file(source: str) -> str:
    return source or "your configuration file (~/.config/resourced/config.toml; none yet)"


def allowed(environ=None) -> dict:
    """What ``run`` may start now, as ``agent context`` and the ``run`` tool say it."""
    try:
        settings, source = policy(environ)
    except Refused as exc:
        return {"run": False, "allow_commands": [], "allow_dirs": [], "config": None,
                "problem": exc.message}
    return {"run": settings.run, "allow_commands": list(settings.allow_commands),
            "allow_dirs": list(settings.allow_dirs), "config": source or None, "problem": None}


def described(environ=None) -> str:
    """One sentence for the ``run`` tool's description: what is allowed here."""
    now = allowed(environ)
    if now["problem"]:
        return f"Nothing may run now: {now['problem']}"
    where = now["config"] or "the user's configuration file"
    if not now["run"]:
        return (f"Off here: the user has not turned it on (run = true under [mcp] in {where});"
                " every call is refused until they do.")
    commands = ", ".join(repr(c) for c in now["allow_commands"]) or "none"
    folders = ", ".join(repr(d) for d in now["allow_dirs"]) or "none"
    return (f"Allowed here ({where}, read again at each call): commands starting with "
            f"{commands}; in the folders {folders} and below.")


def check(argv: list[str], cwd: str, environ=None) -> str:
    """Refused unless the configuration turns ``run`` on and allows ``argv`` in ``cwd``;
    the folder, symbolic links resolved (where the command is run)."""
    settings, source = policy(environ)
    environ = os.environ if environ is None else environ
    where = _file(source)
    if not settings.run:
        raise Refused(f"running commands through MCP is off: the user turns it on with "
                      f"run = true under [mcp] in {where} (mcp.run), and lists what may run "
                      "(mcp.allow_commands) and where (mcp.allow_dirs)")
    folder = _folder(cwd, settings.allow_dirs, where)
    if not _command_allowed(argv, folder, environ.get("PATH"), settings.allow_commands):
        shown = shlex.join(argv[:3]) + (" ..." if len(argv) > 3 else "")
        listed = ", ".join(repr(c) for c in settings.allow_commands) or "nothing"
        raise Refused(f"{shown} is not allowed: mcp.allow_commands in {where} allows "
                      f"{listed} (its first words, the program as resolved on PATH); ask "
                      "the user to add it")
    return folder


def _folder(cwd: str, allow_dirs, where: str) -> str:
    cwd = os.path.expanduser(cwd)
    if not os.path.isabs(cwd):
        raise InvalidArgs(f"cwd must be an absolute folder, not {cwd!r}")
    real = os.path.realpath(cwd)
    if not os.path.isdir(real):
        raise InvalidArgs(f"cwd {cwd} is not a folder")
    for allowed_dir in allow_dirs:
        base = os.path.realpath(os.path.expanduser(allowed_dir))
        if os.path.commonpath([real, base]) == base:
            return real
    listed = ", ".join(repr(d) for d in allow_dirs) or "none"
    raise Refused(f"the folder {real} is not allowed: mcp.allow_dirs in {where} allows "
                  f"{listed} (with the folders below them, symbolic links resolved); ask the "
                  "user to add it")


def _command_allowed(argv: list[str], cwd: str, path: str | None, allow_commands) -> bool:
    """Whether an entry's words are the first of ``argv``: the first as the same program
    (the file each resolves to, links resolved: a name on PATH, a path), the rest equal."""
    ran = program(argv[0], cwd, path, trusted_only=False)
    if ran is None:
        return False
    for entry in allow_commands:
        words = shlex.split(entry)
        if len(words) > len(argv) or argv[1:len(words)] != words[1:]:
            continue
        if program(os.path.expanduser(words[0]), "/", path, trusted_only=True) == ran:
            return True
    return False


def program(word: str, cwd: str, path: str | None, trusted_only: bool) -> str | None:
    """The file ``execvp`` would run for ``word`` from ``cwd`` with ``path`` as PATH, its
    links resolved; None if none.  ``trusted_only`` (an entry of the configuration): a
    relative path, or a relative folder on PATH (a file the agent could put there), finds
    nothing."""
    if "/" in word:
        if trusted_only and not os.path.isabs(word):
            return None
        return _runnable(os.path.join(cwd, word))
    for folder in (os.defpath if path is None else path).split(os.pathsep):
        if not os.path.isabs(folder or "."):
            if trusted_only:
                continue
            folder = os.path.join(cwd, folder or ".")
        found = _runnable(os.path.join(folder, word))
        if found is not None:
            return found
    return None


def _runnable(candidate: str) -> str | None:
    real = os.path.realpath(candidate)
    return real if os.path.isfile(real) and os.access(real, os.X_OK) else None


# -- run ---------------------------------------------------------------------------------------
def start(c, argv: list[str], cwd: str, duration, request: dict, session: str | None,
          op_id: str, dry_run: bool, environ=None) -> dict:
    """Run ``argv`` in ``cwd`` now on what ``request`` asks for (gpus, vram, ram, cpu),
    for at most ``duration``: status ``started`` (or ``exists``: this operation id's job,
    ``dry-run``: it would start), or ``later`` (the earliest start that fits) or
    ``nowhere``, with nothing booked.  Refused (nothing booked) when the configuration
    does not allow it, or no runner is running to start it."""
    from resourced.client.arguments import span
    from resourced.errors import NotEnoughCapacity
    from resourced.protocol.time import Usec, iso_utc, now_usec, whole_second
    from resourced.runner import jobs

    environ = os.environ if environ is None else environ
    folder = check(argv, cwd, environ)
    directory = jobs.jobs_dir(environ)
    if not dry_run and (earlier := by_operation(directory, op_id)) is not None:
        if (earlier.argv, earlier.cwd) != (list(argv), folder):
            raise InvalidArgs(f"operation id {op_id!r} was used for another request; use a "
                              "new id for a new intent")
        return {"status": "exists", "started": True, **described_job(earlier, None)}
    instance = c.instance()  # (and the bus, once connected)
    if not jobs.runner_is_running(directory, c.bus):
        raise Refused(f"no runner is running for the {c.bus} bus to start the command: "
                      + RUNNER_HINT.format(bus=c.bus) + "; nothing was started")
    length = Usec(span("duration", duration))
    texts = {"task_name": jobs.one_line(shlex.join(argv)),
             "label": jobs.one_line(f"{ORIGIN} {folder}")}
    for attempt in range(3):  # (a second may pass between the look and the booking)
        try:
            probe = c.book(length, dry_run=True, session=session, **request)["booking"]
        except NotEnoughCapacity as exc:
            return {"status": "nowhere", "started": False,
                    "reason": f"{exc.message}; nothing was started"}
        if probe["start_usec"] > whole_second(now_usec()):
            return {"status": "later", "started": False, "start": iso_utc(probe["start_usec"]),
                    "gpu_indices": probe["gpu_indices"],
                    "reason": "it does not fit now; it would fit from start (nothing was "
                              "started: call run again then, or book it with the book tool)"}
        if dry_run:
            return {"status": "dry-run", "started": False, "gpu_indices": probe["gpu_indices"],
                    "argv": list(argv), "cwd": folder}
        try:
            made = c.book(length, start=Usec(probe["start_usec"]), session=session,
                          op_id=op_id, **texts, **request)
            break
        except (InvalidArgs, NotEnoughCapacity):
            if attempt == 2:
                raise
    booking = made["booking"]
    ref = booking["id"]
    job = jobs.load(directory, ref) if made["status"] == "exists" else None
    if job is None:
        job = jobs.new_job(ref, argv, folder, environ, c.bus, now_usec(), instance)
        from dataclasses import replace

        job = replace(job, origin=ORIGIN, session=booking.get("session", ""), op_id=op_id,
                      release_when_done=True)
        try:
            jobs.ensure_dir(directory)
            jobs.create(directory, job)
        except (jobs.JobError, OSError) as exc:
            c.cancel(ref, reason="its command could not be kept")
            raise Refused(f"cannot keep the command: {exc}; nothing was started") from None
        try:
            booking = c.report_job(ref, "pending")
        except ResourcedError:
            pass  # the runner reports it when it sees the job
    return {"status": made["status"] if made["status"] == "exists" else "started",
            "started": True, **described_job(job, booking)}


def by_operation(directory: Path, op_id: str):
    """The job of this operation id in ``directory`` (resourced-mcp's), or None."""
    from resourced.runner import jobs

    for ref in reversed(jobs.job_ids(directory)):
        try:
            job = jobs.load(directory, ref)
        except jobs.JobError:
            continue
        if job is not None and job.origin == ORIGIN and job.op_id == op_id:
            return job
    return None


def waited(ref: str, done, seconds: float):
    """The job of ``ref`` once ``done(job)`` holds, or as it is after ``seconds`` (None:
    it has no job file, or one that cannot be read)."""
    import time

    from resourced.runner import jobs

    directory = jobs.jobs_dir()
    deadline = time.monotonic() + seconds
    while True:
        try:
            job = jobs.load(directory, ref)
        except jobs.JobError:
            return None
        if job is None or done(job) or time.monotonic() >= deadline:
            return job
        time.sleep(0.1)


# -- job, logs, stop ----------------------------------------------------------------------------
def mine(ref: str, environ=None):
    """The job of ``ref`` in my jobs directory; NoSuchClaim if it has none."""
    from resourced.errors import NoSuchClaim
    from resourced.runner import jobs

    directory = jobs.jobs_dir(os.environ if environ is None else environ)
    try:
        job = jobs.load(directory, ref) if jobs.valid_id(ref) else None
    except jobs.JobError as exc:
        raise InvalidArgs(f"the job file of {ref}: {exc}") from None
    if job is None:
        raise NoSuchClaim(f"no job {ref} here (a job is the reference run answered, its "
                          "booking's id; the list tool shows my bookings)")
    return job


def described_job(job, booking: dict | None) -> dict:
    """What the ``job`` tool says of a job: its state, exit code, command, folder, session,
    the size of its log, and its booking (None: not read, or gone)."""
    from resourced.protocol.time import iso_utc, with_times
    from resourced.runner import jobs

    log_bytes = len_log(jobs.job_path(jobs.jobs_dir(), job.booking, ".log"))
    return {"job": job.booking, "state": job.state, "final": job.final,
            "exit_code": job.exit_code if job.final else None, "detail": job.detail,
            "argv": job.argv, "cwd": job.cwd, "session": job.session,
            "started_at": iso_utc(job.started_usec) if job.started_usec else None,
            "ended_at": iso_utc(job.ended_usec) if job.ended_usec else None,
            "log_bytes": log_bytes,
            "booking": with_times(booking) if booking else None}


def len_log(path: Path) -> int:
    from resourced.runner.jobs import older_log

    total = 0
    for part in (older_log(path), path):
        try:
            total += part.stat().st_size
        except OSError:
            pass
    return total


def read_log(job, offset: int, limit: int) -> dict:
    """At most ``limit`` bytes of the job's output from ``offset`` (into what the log holds:
    its last 5 to 10 MiB), as text (cut at a whole character); ``next_offset`` to go on."""
    from resourced.runner import jobs

    path = jobs.job_path(jobs.jobs_dir(), job.booking, ".log")
    held = jobs.read_log(path)
    chunk = held[offset:offset + limit]
    if offset + len(chunk) < len(held):
        chunk = _whole_characters(chunk)
    return {"job": job.booking, "state": job.state, "final": job.final,
            "offset": offset, "next_offset": offset + len(chunk), "size": len(held),
            "more": offset + len(chunk) < len(held),
            "text": chunk.decode("utf-8", errors="replace")}


def _whole_characters(data: bytes) -> bytes:
    """``data`` without an incomplete UTF-8 character at its end (the next read has it)."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 != 0x80:  # the first byte of the last character
            size = 1 if byte < 0x80 else 2 if byte >> 5 == 6 else 3 if byte >> 4 == 14 else \
                4 if byte >> 3 == 30 else 1
            return data[:-back] if size > back else data
    return data


def stop(c, ref: str, op_id: str, dry_run: bool) -> dict:
    """End the job's booking (its claim with it): the runner then sends the command's
    process group SIGTERM, and SIGKILL after its grace.  The booking as it is now."""
    try:
        return c.cancel(ref, reason=REASON, op_id=op_id, dry_run=dry_run)
    except InvalidArgs as exc:
        if "ended already" not in exc.message:
            raise
        return c.booking(ref)
