"""gpuctl book ... -- COMMAND and gpuctl runner, end to end: a real daemon on the private
bus with simulated GPUs and the simulated clock, gpuctl and the runner as processes, and
a command (tests/bus/_job.py's body, written to tmp_path) that writes down what it got.

Time starts at 09:00 UTC and moves only when a test sets the clock; the daemon and the
runner look at it at least once a second, so every effect is awaited (bounded).  Every
runner is killed on the way out, and every command left running with it.
"""

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from resourced.runner import jobs

from ..conftest import eventually
from .conftest import at

WAIT = 15.0  # seconds any one effect may take

JOB = r'''
import json, os, pathlib, signal, sys, time

out, mode = pathlib.Path(sys.argv[1]), sys.argv[2]
with open(out / "starts", "a") as f:
    f.write(f"{os.getpid()}\n")
seen = {"uid": os.getuid(), "cwd": os.getcwd(), "pgid": os.getpgrp(), "sid": os.getsid(0),
        **{k: os.environ.get(k) for k in ("CUDA_VISIBLE_DEVICES", "RESOURCED_ALLOCATION",
                                          "CUDA_DEVICE_ORDER", "KEPT", "TERM")}}
(out / "env.tmp").write_text(json.dumps(seen))
os.replace(out / "env.tmp", out / "env.json")
print("hello from the job", flush=True)
print("and from its stderr", file=sys.stderr, flush=True)
if mode == "ignore-term":
    signal.signal(signal.SIGTERM, lambda *_: (out / "got-term").write_text("yes"))
deadline = time.monotonic() + 60
while not (out / "release").exists():
    if time.monotonic() > deadline:
        sys.exit(99)
    time.sleep(0.05)
print("released", flush=True)
sys.exit(int((out / "release").read_text() or "0"))
'''


@pytest.fixture
def jobs_daemon(tmp_path, clocked_daemon):
    """The daemon, on the simulated clock (a restart on the same directories keeps the
    calendar)."""
    return clocked_daemon(runtime_dir=tmp_path / "daemon-run")


@pytest.fixture
def job_env(tmp_path, jobs_daemon):
    """The environment for gpuctl and the runner (the jobs directory under tmp_path);
    kills whatever job is left running afterwards."""
    state = tmp_path / "state"
    env = {**os.environ, "XDG_STATE_HOME": str(state), "TZ": "UTC", "KEPT": "from-booking",
           "TERM": "xterm-from-booking"}
    yield env
    directory = state / "resourced" / "jobs"
    for booking_id in jobs.job_ids(directory):
        with contextlib.suppress(jobs.JobError, OSError):
            job = jobs.load(directory, booking_id)
            if job is not None and job.pid and jobs.alive(job):
                os.killpg(job.pid, signal.SIGKILL)


@pytest.fixture
def out(tmp_path):
    """Where the command writes; its script."""
    path = tmp_path / "out"
    path.mkdir()
    (tmp_path / "job.py").write_text(JOB)
    return path


def ctl(env, *args, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "resourced.cli", *args], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=30, check=False)


def ok(env, *args, cwd=None) -> subprocess.CompletedProcess:
    r = ctl(env, *args, cwd=cwd)
    assert r.returncode == 0, (args, r.stdout, r.stderr)
    return r


def book(env, out: Path, *args, mode="wait", at_="10:00", length="1h") -> str:
    """Book 1 GPU at ``at_`` with the test command; its reference."""
    r = ok(env, "book", "--gpus", "1", "--for", length, "--at", at_, *args, "--",
           sys.executable, str(out.parent / "job.py"), str(out), mode, cwd=out.parent)
    return r.stdout.strip()


def booking(env, ref: str) -> dict:
    [found] = [b for b in json.loads(ok(env, "bookings", "--json").stdout) if b["id"] == ref]
    return found


def job_is(env, ref: str, state: str) -> dict:
    """Wait until the daemon says the job is ``state``; the booking."""
    return eventually(lambda: (b := booking(env, ref))["job"] == state and b, WAIT)


@contextlib.contextmanager
def runner(env, tmp_path, grace=5):
    """gpuctl runner (with ``--grace`` unless ``grace`` is None) as a process, its stderr
    in a file; waits until it listens, and is killed (SIGKILL) at the end of the block if
    still running."""
    log_path = tmp_path / f"runner-{time.monotonic_ns()}.log"
    option = [] if grace is None else ["--grace", f"{grace}s"]
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "resourced.cli", "runner", *option],
                                env=env, stdout=log, stderr=subprocess.STDOUT)
    proc.log_path = log_path
    try:
        eventually(lambda: "runner for uid" in log_path.read_text() or proc.poll() is not None,
                   WAIT)
        assert proc.poll() is None, log_path.read_text()
        yield proc
    except BaseException:
        print(f"--- runner log ---\n{log_path.read_text()}")
        raise
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)


def caught_up(env, tmp_path) -> None:
    """Wait until the runner has acted on every booking signal sent before now: the
    command of a booking that starts at once runs only once it reached that booking's
    signals, which come after them."""
    marker = tmp_path / f"marker-{time.monotonic_ns()}"
    ok(env, "book", "--gpus", "1", "--for", "1h", "--", "touch", str(marker))
    eventually(marker.exists, WAIT, what="the command of a booking that starts at once")


def other_job(env, tmp_path, length: str) -> Path:
    """Where a second command writes, booked at 10:00 for ``length`` and ignoring SIGTERM:
    once it got one, the runner has looked at a clock past the end of its booking less the
    grace, and at every running job on that clock (it looks at them all on one reading)."""
    other = tmp_path / "other"
    other.mkdir()
    book(env, other, mode="ignore-term", length=length)
    return other


def job_file(env, ref: str) -> jobs.Job:
    return jobs.load(jobs.jobs_dir(env), ref)


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z"


def started_pids(out: Path) -> list[int]:
    path = out / "starts"
    return [int(line) for line in path.read_text().split()] if path.exists() else []


# -- the tests -------------------------------------------------------------------------
def test_a_booked_command_runs_at_the_start_as_its_owner_on_the_booked_gpus(
        job_env, out, clock, tmp_path):
    with runner(job_env, tmp_path):
        second = ctl(job_env, "runner")
        assert second.returncode == 1 and "another runner is running" in second.stderr
        r = ok(job_env, "book", "--gpus", "1", "--for", "1h", "--at", "10:00", "--",
               sys.executable, str(tmp_path / "job.py"), str(out), "wait", cwd=tmp_path)
        ref = r.stdout.strip()
        assert "no runner" not in r.stderr
        path = jobs.jobs_dir(job_env) / f"{ref}.json"
        assert path.stat().st_mode & 0o777 == 0o600
        assert path.parent.stat().st_mode & 0o777 == 0o700
        kept = job_file(job_env, ref)
        assert kept.argv[-2:] == [str(out), "wait"] and kept.cwd == str(tmp_path)
        assert "TERM" not in kept.env and kept.env["KEPT"] == "from-booking"
        assert booking(job_env, ref)["job"] == "pending"
        caught_up(job_env, tmp_path)
        assert not (out / "starts").exists()  # not before its start

        clock.set("2026-12-01T10:00:00Z")
        seen = eventually(lambda: (out / "env.json").exists()
                          and json.loads((out / "env.json").read_text()), WAIT)
        b = job_is(job_env, ref, "running")
        assert seen["uid"] == os.getuid() and seen["cwd"] == str(tmp_path)
        assert seen["CUDA_VISIBLE_DEVICES"] == ",".join(b["gpu_uuids"]) != ""
        assert seen["RESOURCED_ALLOCATION"] == ref
        assert seen["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
        assert seen["KEPT"] == "from-booking" and seen["TERM"] is None
        assert seen["pgid"] == seen["sid"] != os.getsid(0)  # its own session and group

        (out / "release").write_text("0")
        b = job_is(job_env, ref, "succeeded")
        assert b["job_exit"] == 0
        assert len(started_pids(out)) == 1
        logs = ok(job_env, "logs", ref).stdout
        assert "hello from the job\n" in logs and "and from its stderr\n" in logs
        assert "released\n" in logs
        table = ok(job_env, "bookings").stdout
        assert "JOB" in table.splitlines()[0] and "succeeded" in table


def test_a_failing_command_is_reported_failed_with_its_exit_code(job_env, out, clock,
                                                                 tmp_path):
    with runner(job_env, tmp_path):
        ref = book(job_env, out)
        clock.set("2026-12-01T10:00:00Z")
        job_is(job_env, ref, "running")
        (out / "release").write_text("3")
        b = job_is(job_env, ref, "failed")
        assert b["job_exit"] == 3
        assert "failed (3)" in ok(job_env, "bookings").stdout


def test_a_long_command_gets_sigterm_before_the_end_and_is_gone_by_it(job_env, out, clock,
                                                                      tmp_path):
    with runner(job_env, tmp_path, grace=5):
        ref = book(job_env, out, mode="ignore-term", length="10m")
        other = other_job(job_env, tmp_path, "9m52s")  # its grace begins at 10:09:47
        clock.set("2026-12-01T10:00:00Z")
        job_is(job_env, ref, "running")
        [pid] = eventually(lambda: started_pids(out), WAIT)
        eventually(lambda: started_pids(other), WAIT)
        clock.set("2026-12-01T10:09:50Z")  # 10 s before the end: not yet
        eventually(lambda: (other / "got-term").exists(), WAIT)
        assert not (out / "got-term").exists()
        clock.set("2026-12-01T10:09:56Z")  # within the grace of 5 s
        eventually(lambda: (out / "got-term").exists(), WAIT)
        assert not gone(pid)               # it ignores SIGTERM: still there until the end
        assert booking(job_env, ref)["job"] == "running"
        clock.set("2026-12-01T10:10:00Z")
        b = job_is(job_env, ref, "timed-out")
        assert gone(pid)
        assert b["job_exit"] == 137 and b["job_detail"] == "SIGKILL"


def configured(env, tmp_path, text: str) -> dict:
    """``env`` with $RESOURCED_CONFIG naming a file of ``text``."""
    path = tmp_path / f"config-{time.monotonic_ns()}.toml"
    path.write_text(text)
    return {**env, "RESOURCED_CONFIG": str(path)}


def test_the_grace_comes_from_the_config_unless_grace_is_given(private_bus, tmp_path):
    env = configured({**os.environ, **private_bus.env(), "XDG_STATE_HOME": str(tmp_path)},
                     tmp_path, "[runner]\ngrace = 7\n")
    for grace, said in ((None, "grace 7 s"), (3, "grace 3 s")):
        with runner(env, tmp_path, grace=grace) as proc:
            assert said in proc.log_path.read_text()
    bad = ctl(configured(env, tmp_path, "[runner]\ngrace = -1\n"), "runner")
    assert bad.returncode == 2
    assert bad.stderr.endswith("runner.grace: must be a number from 0 to 86400, not -1\n")


def test_an_extended_booking_moves_the_sigterm(job_env, out, clock, tmp_path):
    with runner(configured(job_env, tmp_path, "[runner]\ngrace = 5\n"), tmp_path, grace=None):
        ref = book(job_env, out, mode="ignore-term", length="10m")
        other = other_job(job_env, tmp_path, "10m")  # its grace begins at 10:09:55
        clock.set("2026-12-01T10:00:00Z")
        job_is(job_env, ref, "running")
        eventually(lambda: started_pids(other), WAIT)
        ok(job_env, "extend", ref, "--by", "10m")
        caught_up(job_env, tmp_path)  # the runner knows the new end
        clock.set("2026-12-01T10:09:58Z")  # within the grace of the old end
        eventually(lambda: (other / "got-term").exists(), WAIT)
        assert not (out / "got-term").exists()
        clock.set("2026-12-01T10:19:57Z")
        eventually(lambda: (out / "got-term").exists(), WAIT)


def test_cancelling_the_booking_of_a_running_command_stops_it(job_env, out, clock, tmp_path):
    with runner(job_env, tmp_path, grace=5):
        ref = book(job_env, out)
        clock.set("2026-12-01T10:00:00Z")
        job_is(job_env, ref, "running")
        [pid] = eventually(lambda: started_pids(out), WAIT)
        ok(job_env, "cancel", ref)
        b = job_is(job_env, ref, "cancelled")
        assert gone(pid)
        assert b["job_exit"] == 128 + signal.SIGTERM and b["job_detail"] == "SIGTERM"
        assert job_file(job_env, ref).state == "cancelled"


def test_cancelling_a_booking_whose_command_is_pending_marks_it_cancelled(job_env, out, clock,
                                                                         tmp_path):
    with runner(job_env, tmp_path):
        ref = book(job_env, out)
        ok(job_env, "cancel", ref)
        job_is(job_env, ref, "cancelled")
        kept = job_file(job_env, ref)
        assert kept.state == "cancelled" and kept.argv[-1] == "wait"  # marked, not removed
        clock.set("2026-12-01T10:00:00Z")
        caught_up(job_env, tmp_path)
        assert not (out / "starts").exists()


def _started_then_runner_killed(job_env, out, clock, tmp_path) -> tuple[str, int]:
    """A booking whose command a runner started, the runner then SIGKILLed: (the booking,
    the command's pid)."""
    with runner(job_env, tmp_path) as first:
        ref = book(job_env, out)
        clock.set("2026-12-01T10:00:00Z")
        job_is(job_env, ref, "running")
        [pid] = eventually(lambda: started_pids(out), WAIT)
        first.kill()
        first.wait(10)
    return ref, pid


def test_a_runner_killed_while_its_command_runs_adopts_it_and_never_runs_it_twice(
        job_env, out, clock, tmp_path):
    ref, pid = _started_then_runner_killed(job_env, out, clock, tmp_path)
    assert not gone(pid)  # the command outlives its runner
    with runner(job_env, tmp_path) as second:
        eventually(lambda: "adopted the job of" in second.log_path.read_text(), WAIT)
        caught_up(job_env, tmp_path)
        assert started_pids(out) == [pid]
        (out / "release").write_text("0")
        b = job_is(job_env, ref, "succeeded")
        assert b["job_exit"] == 0  # the shim saw the end and wrote it down
    assert started_pids(out) == [pid]


def test_a_command_gone_while_no_runner_watched_is_reported_failed(job_env, out, clock,
                                                                   tmp_path):
    ref, pid = _started_then_runner_killed(job_env, out, clock, tmp_path)
    os.killpg(job_file(job_env, ref).pid, signal.SIGKILL)  # shim and command, unseen
    eventually(lambda: gone(pid), WAIT)
    with runner(job_env, tmp_path):
        b = job_is(job_env, ref, "failed")
        assert b["job_detail"] == jobs.RESTART_DETAIL
        caught_up(job_env, tmp_path)
    assert started_pids(out) == [pid]


def test_a_booking_that_starts_at_once_runs_its_command_at_once(job_env, out, clock,
                                                               tmp_path):
    with runner(job_env, tmp_path):
        r = ok(job_env, "book", "--gpus", "1", "--for", "1h", "--", sys.executable,
               str(tmp_path / "job.py"), str(out), "wait", cwd=tmp_path)
        ref = r.stdout.strip()
        job_is(job_env, ref, "running")
        (out / "release").write_text("0")
        job_is(job_env, ref, "succeeded")
    assert len(started_pids(out)) == 1


def test_the_runner_outlives_a_restart_of_the_daemon(job_env, jobs_daemon, out, clock,
                                                    clocked_daemon, tmp_path):
    with runner(job_env, tmp_path) as proc:
        ref = book(job_env, out)
        jobs_daemon.stop()
        eventually(lambda: "resourced went away" in proc.log_path.read_text(), WAIT)
        clocked_daemon(runtime_dir=tmp_path / "daemon-run")
        eventually(lambda: "resourced is back" in proc.log_path.read_text(), WAIT)
        clock.set("2026-12-01T10:00:00Z")
        job_is(job_env, ref, "running")
        (out / "release").write_text("0")
        job_is(job_env, ref, "succeeded")
        assert proc.poll() is None


def test_a_runner_started_long_after_the_start_reports_the_command_missed(
        job_env, out, clock, tmp_path):
    r = ok(job_env, "book", "--gpus", "1", "--for", "1h", "--at", "10:00", "--",
           sys.executable, str(tmp_path / "job.py"), str(out), "wait", cwd=tmp_path)
    ref = r.stdout.strip()
    assert "no runner is running" in r.stderr
    clock.set("2026-12-01T10:02:00Z")
    eventually(lambda: booking(job_env, ref)["state"] == "active", WAIT)
    with runner(job_env, tmp_path):
        b = job_is(job_env, ref, "missed")
        assert "after its start" in b["job_detail"]
        caught_up(job_env, tmp_path)
    assert not (out / "starts").exists()
    assert job_file(job_env, ref).state == "missed"


def test_a_runner_started_just_after_the_start_still_runs_the_command(job_env, out, clock,
                                                                      tmp_path):
    ref = book(job_env, out)
    clock.set("2026-12-01T10:00:30Z")
    eventually(lambda: booking(job_env, ref)["state"] == "active", WAIT)
    with runner(job_env, tmp_path):
        job_is(job_env, ref, "running")
        (out / "release").write_text("0")
        job_is(job_env, ref, "succeeded")


def test_logs_follow_prints_until_the_job_ends_and_exit_6_without_a_job(job_env, out, clock,
                                                                        tmp_path):
    assert ctl(job_env, "logs", "bnosuch").returncode == 6
    with runner(job_env, tmp_path):
        ref = book(job_env, out)
        plain = ok(job_env, "logs", ref)
        assert plain.stdout == "" and "no output yet (the job is pending)" in plain.stderr
        follow = subprocess.Popen([sys.executable, "-m", "resourced.cli", "logs", ref,
                                   "--follow"], env=job_env, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
        try:
            clock.set("2026-12-01T10:00:00Z")
            job_is(job_env, ref, "running")
            assert select.select([follow.stdout], [], [], WAIT)[0], "nothing followed"
            first = follow.stdout.readline()
            assert first == "hello from the job\n" and follow.poll() is None  # following
            (out / "release").write_text("0")
            rest, _ = follow.communicate(timeout=WAIT)
            stdout = first + rest
        finally:
            if follow.poll() is None:
                follow.kill()
                follow.wait(5)
        assert follow.returncode == 0
        assert stdout.startswith("hello from the job\n") and stdout.endswith("released\n")


def test_book_refuses_a_stray_word_and_a_dry_run_keeps_nothing(job_env, out, clock):
    r = ctl(job_env, "book", "--gpus", "1", "--for", "1h", "tomorrow")
    assert r.returncode == 2 and "goes after --" in r.stderr
    r = ok(job_env, "book", "--gpus", "1", "--for", "1h", "--at", "10:00", "--dry-run", "--",
           "true")
    assert "nothing kept" in r.stderr
    assert jobs.job_ids(jobs.jobs_dir(job_env)) == []
    b = json.loads(ok(job_env, "book", "--gpus", "1", "--for", "1h", "--at", "11:00", "--json",
                      "--", "true").stdout)
    assert b["booking"]["job"] == "pending"
    assert at("2026-12-01T11:00:00+00:00") == b["booking"]["start_usec"]


def test_a_runner_with_no_bus_to_reach_says_which_why_and_what_to_do(tmp_path):
    """It said only 'cannot reach the system bus: [Errno 2] No such file or directory'."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DBUS_", "RESOURCED_"))}
    env |= {"DBUS_SESSION_BUS_ADDRESS": "", "XDG_STATE_HOME": str(tmp_path / "state"),
            "DBUS_SYSTEM_BUS_ADDRESS": f"unix:path={tmp_path}/no-bus"}
    r = ctl(env, "runner")
    assert r.returncode == 5, r.stderr
    assert "cannot reach the system bus (No such file or directory)" in r.stderr, r.stderr
    assert "start the daemon" in r.stderr and "[Errno" not in r.stderr


def test_a_runner_leaves_alone_a_job_booked_with_another_daemon(job_env, out, clock,
                                                                  tmp_path):
    """Two daemons on buses of one kind (the demo's and the user's own, say) keep their
    jobs apart: a job file naming another daemon is neither run nor marked missed."""
    ours = book(job_env, out)
    assert job_file(job_env, ours).daemon  # the daemon's Instance, as book wrote it
    other = jobs.new_job("bzzzzzz", ["true"], str(tmp_path), {}, "session", 1,
                         daemon="0123456789abcdef")
    jobs.create(jobs.jobs_dir(job_env), other)
    clock.set("2026-12-01T10:00:30Z")
    with runner(job_env, tmp_path) as proc:
        job_is(job_env, ours, "running")
        (out / "release").write_text("0")
        job_is(job_env, ours, "succeeded")
    assert job_file(job_env, "bzzzzzz") == other  # untouched
    assert "bzzzzzz" not in proc.log_path.read_text()
