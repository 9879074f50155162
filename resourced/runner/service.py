"""gpuctl runner, gpuctl logs: the commands of a user's bookings, started at their start.

``gpuctl book ... -- COMMAND`` keeps the command in the user's own job file
(``resourced.runner.jobs``).  The runner runs as that user (in the foreground, or as the systemd
user unit resourced-runner.service) and:

- listens for its own ``BookingChanged`` signals (``/org/resourced/user/<uid>``), and
  reads its bookings at start, when the daemon comes back, and every 30 s;
- when a booking with a pending job becomes active (and its claim is granted), starts the
  command through a shim (``resourced.runner.jobs``) in its own session and process group, with
  the environment of ``gpuctl run --allocation REF``, and reports it running;
- sends the group SIGTERM ``--grace`` seconds (default: ``[runner] grace`` in the
  configuration file) before the booking's end and SIGKILL at the end (timed-out),
  re-reading the end as the booking changes; a booking cancelled or released under its
  job: SIGTERM, SIGKILL ``--grace`` seconds later (cancelled);
- a command run now through resourced-mcp (``release_when_done`` in its job file): once
  it has ended, ends its booking, so that its GPUs are free at once;
- reports how the command ended: succeeded, failed (its exit code), timed-out,
  cancelled; a pending job whose booking was cancelled, cancelled; one whose booking had
  started more than 60 s before the runner saw it (the runner was not there), missed.

One runner per user at a time (a lock in the jobs directory).  Jobs outlive the runner:
one that restarts adopts the commands still running and reads how the others ended.
It exits 1 only when it loses its bus connection (Restart=on-failure brings it back);
SIGTERM ends it at once, leaving the commands running.
"""

import contextlib
import logging
import os
import signal
import time
from dataclasses import dataclass, replace

from resourced.exits import EXIT_UNREACHABLE, EXIT_USAGE, GpuctlError

log = logging.getLogger("resourced.runner")

TICK = 0.25           # seconds between looks at the clock, the processes and the ends
SCAN_EVERY = 30.0     # seconds between readings of all bookings (signals may be lost)
REFRESH_EVERY = 5.0   # seconds between readings of a running job's booking
CALL_TIMEOUT = 10.0
UNKNOWN = object()    # a booking the runner has not read yet


@dataclass
class Watched:
    """A running job: its shim (None once adopted from an earlier runner), the last signal
    sent to its group, and when SIGTERM was sent (monotonic)."""

    job: object
    proc: object = None
    sent: int | None = None
    term_at: float | None = None


class Runner:
    def __init__(self, requested_bus: str | None, grace_usec: int, directory=None,
                 environ=None):
        from resourced.protocol.time import seconds_of_usec

        from .jobs import jobs_dir

        self.requested_bus = requested_bus
        self.grace_usec = grace_usec
        self.grace = seconds_of_usec(grace_usec)  # for the monotonic clock and the log
        self.dir = directory if directory is not None else jobs_dir()
        self.environ = os.environ if environ is None else environ
        self.bus: str | None = None
        self.instance = ""  # the daemon's Instance, once it has answered
        self.client = None
        self.records: dict[str, object] = {}   # booking id -> its record, or None: gone
        self.seen: dict[str, int] = {}          # booking id -> when first seen active
        self.watched: dict[str, Watched] = {}
        self.waiting: dict[str, float] = {}     # booking id -> when to try to start it again
        self.daemon_up = False
        self.quit = False
        self._next_tick = 0.0
        self._next_scan = 0.0
        self._next_refresh = 0.0

    # -- the loop ----------------------------------------------------------------------
    def run(self) -> int:
        from collections import deque

        from resourced.client.sync import Client

        from .jobs import JobError, ensure_dir

        try:
            ensure_dir(self.dir)
        except (JobError, OSError) as exc:
            raise GpuctlError(f"cannot use the jobs directory: {exc}") from None
        from resourced.client.discovery import choose_bus

        self.bus = choose_bus(self.requested_bus)
        lock = self._lock()
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, self._asked_to_quit)
        conn, heard = self._connect()
        self.client = Client(bus=self.bus, timeout=CALL_TIMEOUT)
        queue: deque = deque()
        try:
            with conn.filter(heard, queue=queue):  # the daemon's signals alone
                self.recover()
                self.daemon_up = heard.owner is not None
                if self.daemon_up:
                    self.scan()
                log.info("runner for uid %d on the %s bus (%s), jobs in %s, grace %g s",
                         os.getuid(), self.bus, "resourced is running" if self.daemon_up
                         else "resourced is not running yet", self.dir, self.grace)
                while not self.quit:
                    try:
                        msg = conn.recv_until_filtered(queue, timeout=TICK)
                    except TimeoutError:
                        msg = None
                    if msg is not None:
                        self.handle(msg)
                    self.tick()
        except (OSError, EOFError) as exc:
            raise GpuctlError(f"lost the connection to the {self.bus} bus ({exc})") from None
        finally:
            self.client.close()
            conn.close()
            os.close(lock)
        if self.watched:
            log.info("stopping; %d command(s) left running: %s (a runner started again "
                     "adopts them)", len(self.watched), ", ".join(sorted(self.watched)))
        return 0

    def _asked_to_quit(self, signum, frame):
        self.quit = True

    def handle(self, msg) -> None:
        """One signal: a booking of ours changed, or resourced came or went."""
        from jeepney.low_level import HeaderFields

        from resourced.client.bookings import record
        from resourced.protocol.names import BUS_NAME

        member = msg.header.fields.get(HeaderFields.member)
        body = msg.body
        if member == "BookingChanged" and len(body) == 3:
            booking_id, what, data = body
            try:
                rec = record(data)
            except (TypeError, ValueError, AttributeError):
                log.warning("ignoring a malformed BookingChanged of %s", booking_id)
                return
            self.records[booking_id] = rec
            if what == "started":  # seen as it started: never missed
                self.seen.setdefault(booking_id, rec["start_usec"])
            self._note_active(booking_id, rec, self.now())
            self.evaluate(booking_id)
        elif member == "NameOwnerChanged" and len(body) == 3 and body[0] == BUS_NAME:
            self.daemon_up = bool(body[2])
            log.info("resourced %s", "is back" if body[2] else "went away")
            if body[2]:
                self.scan()

    def tick(self) -> None:
        """At most every TICK seconds: start what waits for its grant, watch the running."""
        mono = time.monotonic()
        if mono < self._next_tick:
            return
        self._next_tick = mono + TICK
        if self.daemon_up and mono >= self._next_scan:
            self.scan()
        elif self.daemon_up and self.watched and mono >= self._next_refresh:
            self._next_refresh = mono + REFRESH_EVERY
            for booking_id in list(self.watched):
                self._read_booking(booking_id)
        now = self.now()
        for booking_id, when in list(self.waiting.items()):
            if mono >= when:  # a pending job whose booking is active, its claim not granted
                self.waiting.pop(booking_id, None)
                self.evaluate(booking_id)
        for booking_id, watched in list(self.watched.items()):
            self.watch(booking_id, watched, now)

    # -- deciding ----------------------------------------------------------------------
    def evaluate(self, booking_id: str) -> None:
        """Act on what the job of ``booking_id`` (if any) and its booking say now."""
        from resourced.core.lifecycle import MISSED, PENDING, RUNNING

        from .jobs import START, advance, pending_decision

        job = self._load(booking_id)
        if job is None:
            self._forget(booking_id)  # a booking without a command: nothing to keep
            return
        if job.state == PENDING:
            rec = self.records.get(booking_id, UNKNOWN)
            if rec is UNKNOWN:
                rec = self._read_booking(booking_id)
                if rec is UNKNOWN:
                    return
            decision = pending_decision(rec, self.seen.get(booking_id))
            if decision is None:
                pass
            elif decision[0] == START:
                started = self.start(job)
                if started is None:  # its claim is not granted yet: ask again in a second
                    self.waiting[booking_id] = time.monotonic() + 1.0
                else:
                    self.waiting.pop(booking_id, None)
            else:
                state, why = decision
                self.waiting.pop(booking_id, None)
                self._store(advance(job, state, detail=why, ended_usec=self.now()))
                log.log(logging.WARNING if state == MISSED else logging.INFO,
                        "job of %s %s: %s", booking_id, state, why)
        elif job.state == RUNNING and booking_id not in self.watched:
            self._adopt_or_end(job)
        if self.report(booking_id):
            self._forget(booking_id)  # over, and the daemon knows

    def _confine(self, booking_id: str, proc, write_end: int) -> bool:
        """Put the shim, before it runs the command, in the booking's scope (an isolated
        booking); False, with the shim gone, when that fails (the next tick tries again)."""
        from resourced.errors import ResourcedError

        try:
            self.client.confine(booking_id, proc.pid)
            return True
        except ResourcedError as exc:
            os.close(write_end)  # the shim reads nothing and runs nothing
            proc.wait()
            log.error("cannot isolate the job of %s (%s); not started", booking_id, exc)
            return False

    def start(self, job):
        """Start a pending job whose booking is active, once its claim is granted; the job
        marked running (before the command can run), or None if it must wait."""
        import json
        import subprocess
        import sys

        from resourced.core.lifecycle import RUNNING
        from resourced.errors import ResourcedError

        from .jobs import advance, boot_id, command_env, process_start, save

        booking_id = job.booking
        try:
            granted = self.client.allocation(booking_id)
        except ResourcedError:
            return None  # not granted yet (or the daemon is away): the next tick asks again
        held = granted["allocation"]
        if held["state"] != "granted":
            return None
        env = command_env(job, granted["env"], booking_id, held.get("session", ""),
                          self.environ)
        read_end, write_end = os.pipe()
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", "resourced.runner.jobs", "shim", str(self.dir), booking_id],
                stdin=read_end, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                start_new_session=True, cwd="/")
        except OSError as exc:
            os.close(write_end)
            log.error("cannot start the job of %s: %s", booking_id, exc)
            return None
        finally:
            os.close(read_end)
        if held.get("isolated") and not self._confine(booking_id, proc, write_end):
            return None
        rec = self.records.get(booking_id)
        running = advance(job, RUNNING, pid=proc.pid, pid_start=process_start(proc.pid) or 0,
                          boot_id=boot_id(), started_usec=self.now(),
                          end_usec=rec["end_usec"] if isinstance(rec, dict) else 0)
        try:
            save(self.dir, running)  # the mark first: a crash from here on never reruns it
        except OSError as exc:
            os.close(write_end)  # the shim reads nothing and runs nothing
            proc.wait()
            log.error("cannot mark the job of %s running (%s); not started", booking_id, exc)
            return None
        self.watched[booking_id] = Watched(job=running, proc=proc)
        spec = json.dumps({"argv": job.argv, "cwd": job.cwd, "env": env}).encode()
        try:
            view = memoryview(spec)
            while view:
                view = view[os.write(write_end, view):]
        except OSError as exc:
            log.error("the shim of %s went away before it was told to run (%s)", booking_id, exc)
        finally:
            os.close(write_end)
        log.info("job of %s started (pid %d): %s", booking_id, proc.pid, _shown(job.argv))
        return running

    def watch(self, booking_id: str, watched: Watched, now: int) -> None:
        """A running job: has it ended? Is it time to signal it?"""
        from .jobs import alive, ended_job, read_exit, signal_name, stop_step

        job = watched.job
        gone = watched.proc.poll() is not None if watched.proc is not None else not alive(job)
        if gone:
            ended = ended_job(job, read_exit(self.dir, booking_id),
                              killed=watched.sent == signal.SIGKILL, now_usec=now)
            del self.watched[booking_id]
            self._store(ended)
            log.info("job of %s %s (exit %d%s)", booking_id, ended.state, ended.exit_code,
                     f", {ended.detail}" if ended.detail else "")
            self.report(booking_id)
            return
        rec = self.records.get(booking_id, UNKNOWN)
        if rec is UNKNOWN:  # not read yet (adopted while resourced is away): its last end
            if not job.end_usec:
                return
            rec = {"state": "active", "end_usec": job.end_usec}
        elif rec is not None and rec["end_usec"] != job.end_usec:
            job = self._store(replace(job, end_usec=rec["end_usec"]))
        grace_over = watched.term_at is not None and \
            time.monotonic() - watched.term_at >= self.grace
        step = stop_step(rec, now, self.grace_usec, watched.sent, job.stopping, grace_over)
        if step.stopping != job.stopping:
            job = self._store(replace(job, stopping=step.stopping))
        if step.signal is None:
            return
        try:
            os.killpg(job.pid, step.signal)
        except ProcessLookupError:
            pass
        except OSError as exc:
            log.error("cannot signal the job of %s: %s", booking_id, exc)
            return
        watched.sent = step.signal
        if step.signal == signal.SIGTERM:
            watched.term_at = time.monotonic()
        log.info("job of %s: %s to its process group (%s)", booking_id,
                 signal_name(step.signal), step.stopping)

    # -- after a restart, and the daemon's view ----------------------------------------
    def recover(self) -> None:
        """Jobs marked running by an earlier runner: adopt those still there, end the rest."""
        from resourced.core.lifecycle import RUNNING

        for booking_id in self._job_ids():
            job = self._load(booking_id)
            if job is not None and job.state == RUNNING and booking_id not in self.watched:
                self._adopt_or_end(job)

    def _adopt_or_end(self, job) -> None:
        from .jobs import alive, ended_job, read_exit

        if alive(job):
            self.watched[job.booking] = Watched(job=job)
            log.info("adopted the job of %s, still running (pid %d)", job.booking, job.pid)
            return
        ended = self._store(ended_job(job, read_exit(self.dir, job.booking), killed=False,
                                      now_usec=self.now()))
        log.warning("job of %s %s while no runner watched it (exit %d%s)", job.booking,
                    ended.state, ended.exit_code, f", {ended.detail}" if ended.detail else "")

    def scan(self) -> None:
        """Read all our bookings: start, end or report what the signals may have missed."""
        from resourced.errors import DaemonUnreachable, ResourcedError

        self._next_scan = time.monotonic() + SCAN_EVERY
        try:
            mine = {b["id"]: b for b in self.client.bookings()}
        except DaemonUnreachable:
            return
        except ResourcedError as exc:
            log.warning("cannot list the bookings: %s", exc)
            return
        now = self.now()
        for booking_id in self._job_ids():
            job = self._load(booking_id)
            if job is None or (job.final and job.reported):
                continue
            if booking_id in mine:
                self.records[booking_id] = mine[booking_id]
                self._note_active(booking_id, mine[booking_id], now)
            else:
                self._read_booking(booking_id)
            self.evaluate(booking_id)

    def _read_booking(self, booking_id: str):
        """The daemon's record of one booking (None: it has none), or UNKNOWN if it cannot
        say now."""
        from resourced.errors import NoSuchClaim, ResourcedError

        try:
            rec = self.client.booking(booking_id)
        except NoSuchClaim:
            rec = None
        except ResourcedError:
            return UNKNOWN
        self.records[booking_id] = rec
        if rec is not None:
            self._note_active(booking_id, rec, self.now())
        return rec

    def report(self, booking_id: str) -> bool:
        """Tell the daemon how the job stands, unless it knows already; whether the job is
        over and the daemon knows."""
        from resourced.errors import DaemonUnreachable, ResourcedError

        job = self._load(booking_id)
        if job is None or job.reported:
            return job is not None and job.final
        rec = self.records.get(booking_id)
        known = isinstance(rec, dict) and (rec.get("job"), rec.get("job_exit"),
                                            rec.get("job_detail")) == (job.state, job.exit_code,
                                                                       job.detail)
        if not known:
            try:
                self.records[booking_id] = self.client.report_job(
                    booking_id, job.state, job.exit_code, job.detail[:200])
            except DaemonUnreachable:
                return False  # told when it is back
            except ResourcedError as exc:
                log.warning("cannot report the job of %s as %s: %s", booking_id, job.state, exc)
        self._store(replace(job, reported=True))
        if job.final and job.release_when_done:
            self._end_booking(booking_id)
        return job.final

    def _end_booking(self, booking_id: str) -> None:
        """A command run now (resourced-mcp's run) is over: its booking ends with it (an
        active one is released), so its GPUs are free at once rather than at its end."""
        from resourced.errors import ResourcedError

        rec = self.records.get(booking_id)
        if isinstance(rec, dict) and rec.get("state") == "ended":
            return
        try:
            self.records[booking_id] = self.client.cancel(
                booking_id, reason="its command ended")
        except ResourcedError as exc:  # it ends at its end
            log.warning("cannot end the booking of %s after its command: %s", booking_id, exc)
            return
        log.info("booking %s ended with its command", booking_id)

    # -- small helpers -----------------------------------------------------------------
    def now(self) -> int:
        from resourced.errors import InvalidArgs
        from resourced.protocol.time import now_usec, wall_clock

        try:
            return now_usec()
        except InvalidArgs as exc:  # a simulated clock file gone bad: the last word is
            log.warning("%s; using the wall clock", exc)
            return wall_clock()

    def _forget(self, booking_id: str) -> None:
        if booking_id not in self.watched:
            for known in (self.records, self.seen, self.waiting):
                known.pop(booking_id, None)

    def _note_active(self, booking_id: str, rec: dict, now: int) -> None:
        if rec.get("state") == "active":
            self.seen.setdefault(booking_id, now)

    def _job_ids(self) -> list[str]:
        from .jobs import job_ids

        return job_ids(self.dir)

    def _load(self, booking_id: str):
        """The job of ``booking_id`` if it is this bus's; None otherwise (or unreadable)."""
        from .jobs import JobError, load

        try:
            job = load(self.dir, booking_id)
        except JobError as exc:
            log.error("ignoring the job file of %s: %s", booking_id, exc)
            return None
        if job is None or (job.bus and job.bus != self.bus):
            return None
        if job.daemon and job.daemon != self._instance():
            return None  # booked with another daemon on a bus of this kind
        return job

    def _instance(self) -> str:
        """The daemon's Instance ("" while it cannot be asked: then no job is taken for
        another's, and none is left for good)."""
        if not self.instance:
            from resourced.errors import ResourcedError

            with contextlib.suppress(ResourcedError, OSError):
                self.instance = self.client.instance()
        return self.instance

    def _store(self, job):
        from .jobs import save

        save(self.dir, job)
        if job.booking in self.watched:
            self.watched[job.booking].job = job
        return job

    def _lock(self) -> int:
        import fcntl

        from .jobs import runner_lock

        path = runner_lock(self.dir, self.bus)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            other = (os.read(fd, 256).decode(errors="replace").split() or ["?"])[0]
            os.close(fd)
            raise GpuctlError(f"another runner is running for the {self.bus} bus (pid {other}, "
                              f"jobs in {self.dir})") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        return fd

    def _connect(self):
        from resourced.client import signals
        from resourced.protocol.names import USER_IFACE, user_path

        rules = [signals.rule(USER_IFACE, "BookingChanged", user_path(os.getuid()))]
        try:
            return signals.listen(self.bus, rules, CALL_TIMEOUT)
        except (OSError, KeyError, ValueError, TimeoutError) as exc:
            from resourced.client.sync import Client

            # what every client says when the bus cannot be had: which, why, what to do
            said = Client(bus=self.bus, timeout=CALL_TIMEOUT)._unreachable(self.bus, exc)
            raise GpuctlError(str(said), EXIT_UNREACHABLE) from None


def _shown(argv: list[str]) -> str:
    import shlex

    text = shlex.join(argv)
    return text if len(text) <= 200 else text[:197] + "..."


def configured_grace() -> float:
    """``[runner] grace`` from the configuration file, found as the daemon finds it (its
    default where there is none); a file with a problem is an error (exit 2)."""
    from resourced.config import ConfigError, find_config, load_config

    try:
        return load_config(find_config(None, os.environ)).runner.grace
    except ConfigError as exc:
        raise GpuctlError(str(exc), EXIT_USAGE) from None
