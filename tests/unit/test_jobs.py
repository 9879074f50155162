"""resourced.runner.jobs: the job file, its states, the never-twice rule, the runner's decisions,
the bounded log and the shim."""

import fcntl
import json
import os
import signal
import stat
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from resourced.core.lifecycle import (
    CANCELLED,
    FAILED,
    JOB,
    JOB_STATES,
    MISSED,
    PENDING,
    RUNNING,
    SUCCEEDED,
    TIMED_OUT,
)
from resourced.runner import jobs
from resourced.runner.jobs import START, Job, JobError

SEC = 1_000_000
T0 = 1_800_000_000 * SEC


def job(**changes) -> Job:
    base = jobs.new_job("b1x2y3z", ["python", "train.py", "--lr", "3e-4"], "/home/alice/project",
                        {"PATH": "/usr/bin", "HOME": "/home/alice"}, "session", T0)
    return replace(base, **changes) if changes else base


def booking(state="active", start=T0, end=T0 + 3600 * SEC, ended="", reason="") -> dict:
    return {"id": "b1x2y3z", "state": state, "start_usec": start, "end_usec": end,
            "ended": ended, "reason": reason}


@pytest.fixture
def directory(tmp_path):
    return jobs.ensure_dir(tmp_path / "state" / "resourced" / "jobs")


# -- where -----------------------------------------------------------------------------
def test_jobs_dir_follows_xdg_state_home_and_ignores_a_relative_one():
    assert jobs.jobs_dir({"XDG_STATE_HOME": "/s", "HOME": "/h"}) == Path("/s/resourced/jobs")
    default = Path("/h/.local/state/resourced/jobs")
    assert jobs.jobs_dir({"XDG_STATE_HOME": "rel", "HOME": "/h"}) == default
    assert jobs.jobs_dir({"HOME": "/h"}) == default


def test_the_directories_made_are_0700_and_a_loose_jobs_dir_is_tightened(tmp_path):
    os.umask(0o022)
    path = jobs.ensure_dir(tmp_path / "a" / "b" / "jobs")
    for p in (tmp_path / "a", tmp_path / "a" / "b", path):
        assert stat.S_IMODE(p.stat().st_mode) == 0o700, p
    path.chmod(0o755)
    jobs.ensure_dir(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o700


def test_a_symlinked_jobs_dir_is_refused(tmp_path):
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "jobs").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(JobError, match="symlink"):
        jobs.ensure_dir(tmp_path / "jobs")


# -- the file --------------------------------------------------------------------------
def test_a_job_file_is_written_whole_0600_and_read_back(directory):
    jobs.create(directory, job())
    path = directory / "b1x2y3z.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert jobs.load(directory, "b1x2y3z") == job()
    assert os.listdir(directory) == ["b1x2y3z.json"]  # no temporary file left
    data = json.loads(path.read_text())
    assert data["argv"] == ["python", "train.py", "--lr", "3e-4"] and data["cwd"] == "/home/alice/project"
    assert data["state"] == "pending" and data["bus"] == "session"
    assert jobs.job_ids(directory) == ["b1x2y3z"]
    assert jobs.load(directory, "bnothere") is None


def test_create_never_replaces_a_job_file(directory):
    jobs.create(directory, job())
    with pytest.raises(JobError, match="already has a command"):
        jobs.create(directory, job(argv=["other"]))
    assert jobs.load(directory, "b1x2y3z").argv[0] == "python"


def test_a_failed_write_leaves_the_old_file_and_no_temporary(directory, monkeypatch):
    jobs.create(directory, job())

    def broken_fsync(fd):
        raise OSError(5, "I/O error")

    monkeypatch.setattr(jobs.os, "fsync", broken_fsync)
    with pytest.raises(OSError):
        jobs.save(directory, jobs.advance(job(), CANCELLED))
    monkeypatch.undo()
    assert jobs.load(directory, "b1x2y3z").state == PENDING
    assert os.listdir(directory) == ["b1x2y3z.json"]


def test_bad_files_and_names_are_refused(directory):
    (directory / "bbad.json").write_text("{not json")
    with pytest.raises(JobError, match="not JSON"):
        jobs.load(directory, "bbad")
    (directory / "bnew.json").write_text(job(booking="bnew", version=99).to_json())
    with pytest.raises(JobError, match="newer"):
        jobs.load(directory, "bnew")
    with pytest.raises(JobError, match="not a booking reference"):
        jobs.job_path(directory, "../etc/passwd")
    assert not jobs.valid_id("") and not jobs.valid_id("a/b") and jobs.valid_id("b3x9k2q")


def test_keys_of_a_newer_version_are_kept_when_rewritten():
    data = json.loads(job().to_json())
    data["future"] = 42
    again = Job.from_json(json.dumps(data))
    assert json.loads(again.to_json())["future"] == 42


# -- the environment -------------------------------------------------------------------
def test_the_environment_kept_drops_what_belongs_to_the_session_of_booking():
    environ = {"PATH": "/venv/bin:/usr/bin", "HOME": "/home/a", "VIRTUAL_ENV": "/venv",
               "HF_TOKEN": "x", "PYTHONPATH": "/src", "TERM": "xterm", "SSH_AUTH_SOCK": "/tmp/s",
               "DISPLAY": ":0", "XDG_SESSION_ID": "3", "DBUS_SESSION_BUS_ADDRESS": "unix:x",
               "CUDA_VISIBLE_DEVICES": "GPU-old", "RESOURCED_ALLOCATION": "cold", "SHLVL": "2",
               "OLDPWD": "/", "TMUX": "/tmp/tmux", "RESOURCED_CONFIG": "/c.toml"}
    assert jobs.kept_env(environ) == {
        "PATH": "/venv/bin:/usr/bin", "HOME": "/home/a", "VIRTUAL_ENV": "/venv", "HF_TOKEN": "x",
        "PYTHONPATH": "/src", "RESOURCED_CONFIG": "/c.toml"}


def test_the_command_gets_the_claims_variables_and_the_runners_live_ones():
    kept = job(env={"PATH": "/bin", "OMP_NUM_THREADS": "4", "CUDA_DEVICE_ORDER": "FASTEST_FIRST"})
    claim = {"CUDA_VISIBLE_DEVICES": "GPU-1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
             "RESOURCED_ALLOCATION": "b1x2y3z", "RESOURCED_GPU_UUIDS": "GPU-1"}
    runner_env = {"DBUS_SESSION_BUS_ADDRESS": "unix:path=/run/user/1/bus", "TERM": "dumb"}
    env = jobs.command_env(kept, claim, "b1x2y3z", "sid:42", runner_env)
    assert env == {"PATH": "/bin", "OMP_NUM_THREADS": "4", **claim,
                   "DBUS_SESSION_BUS_ADDRESS": "unix:path=/run/user/1/bus",
                   "RESOURCED_SESSION": "sid:42", "PWD": "/home/alice/project"}


# -- states ----------------------------------------------------------------------------
def test_the_moves_a_job_may_make():
    running = jobs.advance(job(), RUNNING, pid=12)
    assert running.state == RUNNING and not running.reported
    for final in (SUCCEEDED, FAILED, TIMED_OUT, CANCELLED):
        assert jobs.advance(running, final).final
    for state in (CANCELLED, MISSED, FAILED):
        assert jobs.advance(job(), state).final
    with pytest.raises(JobError):
        jobs.advance(job(), SUCCEEDED)  # it never ran
    with pytest.raises(JobError):
        jobs.advance(running, MISSED)
    for final in JOB.final:
        for state in JOB_STATES:
            with pytest.raises(JobError):
                jobs.advance(job(state=final), state)


def test_never_twice_a_job_marked_running_cannot_be_started_again(directory):
    jobs.create(directory, job())
    jobs.save(directory, jobs.advance(jobs.load(directory, "b1x2y3z"), RUNNING, pid=99))
    after_a_crash = jobs.load(directory, "b1x2y3z")
    assert after_a_crash.state == RUNNING and after_a_crash.pid == 99
    with pytest.raises(JobError, match="cannot become running"):
        jobs.advance(after_a_crash, RUNNING)
    with pytest.raises(JobError):
        jobs.advance(after_a_crash, PENDING)


def test_a_detail_is_one_short_line():
    moved = jobs.advance(job(), FAILED, detail="line one\nline two\t" + "x" * 500)
    assert "\n" not in moved.detail and "\t" not in moved.detail
    assert len(moved.detail) == jobs.MAX_DETAIL and moved.detail.endswith("...")


def test_final_state_comes_from_the_exit_code_unless_the_runner_stopped_it():
    assert jobs.final_state(0, "") == SUCCEEDED
    assert jobs.final_state(3, "") == FAILED
    assert jobs.final_state(0, TIMED_OUT) == TIMED_OUT
    assert jobs.final_state(143, CANCELLED) == CANCELLED


# -- the runner's decisions ------------------------------------------------------------
@pytest.mark.parametrize("rec, seen, expected", [
    (booking(state="scheduled"), None, None),
    (booking(), None, None),                                        # active, not seen yet
    (booking(), T0, (START, "")),                                   # seen as it started
    (booking(), T0 + 60 * SEC, (START, "")),                        # just in time
    (booking(), T0 + 61 * SEC, MISSED),                             # the runner was not there
    (booking(state="ended", ended="cancelled"), None, CANCELLED),
    (booking(state="ended", ended="released", reason="maintenance"), T0, CANCELLED),
    (booking(state="ended", ended="no-show"), T0, CANCELLED),
    (booking(state="ended", ended="expired"), None, MISSED),
    (None, None, MISSED),                                           # the daemon forgot it
])
def test_what_becomes_of_a_pending_job(rec, seen, expected):
    decision = jobs.pending_decision(rec, seen)
    if expected is None or isinstance(expected, tuple):
        assert decision == expected
    else:
        assert decision[0] == expected and decision[1]


def test_a_cancellation_with_a_reason_says_it():
    _, why = jobs.pending_decision(booking(state="ended", ended="released", reason="broken"), T0)
    assert why == "the booking was released: broken"


GRACE = 30 * SEC
END = T0 + 3600 * SEC


def test_a_running_job_is_left_alone_until_the_grace_before_its_end():
    assert jobs.stop_step(booking(), END - GRACE - 1, GRACE, None, "", False) == \
        jobs.StopStep(None, "")


def test_sigterm_the_grace_before_the_end_then_sigkill_at_it():
    step = jobs.stop_step(booking(), END - GRACE, GRACE, None, "", False)
    assert step == jobs.StopStep(signal.SIGTERM, TIMED_OUT)
    assert jobs.stop_step(booking(), END - 1, GRACE, signal.SIGTERM, TIMED_OUT, True) == \
        jobs.StopStep(None, TIMED_OUT)   # at the end, not after the grace
    assert jobs.stop_step(booking(), END, GRACE, signal.SIGTERM, TIMED_OUT, False) == \
        jobs.StopStep(signal.SIGKILL, TIMED_OUT)
    assert jobs.stop_step(booking(), END + 5, GRACE, signal.SIGKILL, TIMED_OUT, False) == \
        jobs.StopStep(None, TIMED_OUT)


def test_the_grace_of_a_short_booking_is_a_quarter_of_it():
    """A 30 s grace stopped the command of a 20 s booking at once (timed out, 143)."""
    short = booking(end=T0 + 20 * SEC)
    assert jobs.grace_for(short, GRACE) == 5 * SEC
    assert jobs.stop_step(short, T0 + 5 * SEC, GRACE, None, "", False) == jobs.StopStep(None, "")
    assert jobs.stop_step(short, T0 + 15 * SEC, GRACE, None, "", False).signal == signal.SIGTERM
    assert jobs.grace_for(booking(), GRACE) == GRACE  # an hour's booking: the grace as set


def test_an_extended_booking_moves_the_signals():
    later = booking(end=END + 3600 * SEC)
    assert jobs.stop_step(later, END - GRACE, GRACE, None, "", False) == jobs.StopStep(None, "")
    assert jobs.stop_step(later, END + 1, GRACE, signal.SIGTERM, TIMED_OUT, True).signal is None


def test_a_booking_ended_under_its_job():
    expired = booking(state="ended", ended="expired")
    assert jobs.stop_step(expired, END, GRACE, None, "", False) == \
        jobs.StopStep(signal.SIGKILL, TIMED_OUT)
    cancelled = booking(state="ended", ended="released")
    assert jobs.stop_step(cancelled, T0 + 5, GRACE, None, "", False) == \
        jobs.StopStep(signal.SIGTERM, CANCELLED)
    assert jobs.stop_step(cancelled, T0 + 5, GRACE, signal.SIGTERM, CANCELLED, False) == \
        jobs.StopStep(None, CANCELLED)
    assert jobs.stop_step(cancelled, T0 + 5, GRACE, signal.SIGTERM, CANCELLED, True) == \
        jobs.StopStep(signal.SIGKILL, CANCELLED)
    assert jobs.stop_step(None, T0, GRACE, None, "", False).stopping == CANCELLED


def test_how_a_job_whose_shim_is_gone_ended():
    running = jobs.advance(job(), RUNNING, pid=5)
    ok = jobs.ended_job(running, {"exit_code": 0, "signal": "", "detail": ""}, False, T0)
    assert (ok.state, ok.exit_code, ok.detail, ok.ended_usec) == (SUCCEEDED, 0, "", T0)
    bad = jobs.ended_job(running, {"exit_code": 143, "signal": "SIGTERM", "detail": "SIGTERM"},
                         False, T0)
    assert (bad.state, bad.exit_code, bad.detail) == (FAILED, 143, "SIGTERM")
    stopped = replace(running, stopping=TIMED_OUT)
    assert jobs.ended_job(stopped, {"exit_code": 0}, False, T0).state == TIMED_OUT
    killed = jobs.ended_job(stopped, None, True, T0)
    assert (killed.state, killed.exit_code, killed.detail) == (TIMED_OUT, 137, "SIGKILL")
    unseen = jobs.ended_job(running, None, False, T0)
    assert (unseen.state, unseen.exit_code, unseen.detail) == (FAILED, -1, jobs.RESTART_DETAIL)


# -- processes -------------------------------------------------------------------------
def test_a_process_is_known_by_pid_start_time_and_boot():
    me = jobs.process_start(os.getpid())
    assert isinstance(me, int) and me > 0
    boot = jobs.boot_id()
    mine = job(state=RUNNING, pid=os.getpid(), pid_start=me, boot_id=boot)
    assert jobs.alive(mine)
    assert not jobs.alive(replace(mine, pid_start=me + 1))      # the pid was reused
    assert not jobs.alive(replace(mine, boot_id="another-boot"))
    assert not jobs.alive(replace(mine, pid=0))


def test_a_dead_or_zombie_process_has_no_start_time():
    proc = subprocess.Popen(["true"])
    deadline = time.monotonic() + 10
    while jobs.process_start(proc.pid) is not None:  # until it exits: a zombie, not reaped
        assert time.monotonic() < deadline
        time.sleep(0.02)
    proc.wait(timeout=10)
    assert jobs.process_start(proc.pid) is None


# -- the log ---------------------------------------------------------------------------
def test_the_log_keeps_the_newest_output_within_the_limit(tmp_path):
    path = tmp_path / "b.log"
    writer = jobs.LogWriter(path, limit=1000)
    everything = b"".join(f"line {i:04d}\n".encode() for i in range(400))  # 4,000 bytes
    for start in range(0, len(everything), 77):
        writer.write(everything[start:start + 77])
    writer.close()
    kept = jobs.read_log(path)
    assert len(kept) <= 1000 and len(kept) >= 500
    assert everything.endswith(kept)                       # the newest, in order, unbroken
    assert writer.dropped == len(everything) - len(kept)
    for p in (path, jobs.older_log(path)):
        assert stat.S_IMODE(p.stat().st_mode) == 0o600


def test_below_the_limit_nothing_turns_over(tmp_path):
    writer = jobs.LogWriter(tmp_path / "b.log", limit=1000)
    writer.write(b"x" * 500)
    writer.close()
    assert not jobs.older_log(tmp_path / "b.log").exists()
    assert jobs.read_log(tmp_path / "b.log") == b"x" * 500


def test_logs_prints_the_older_half_then_the_newer(tmp_path, capsys):
    from resourced.cli.runner import print_log

    writer = jobs.LogWriter(tmp_path / "b1.log", limit=20)
    writer.write(b"0123456789abcdefghij-tail")
    writer.close()
    out = []
    assert print_log(tmp_path, "b1", out.append, follow=False)
    assert b"".join(out) == jobs.read_log(tmp_path / "b1.log") == b"abcdefghij-tail"
    assert "any earlier output was dropped" in capsys.readouterr().err


def test_logs_follow_goes_on_across_turnovers_until_the_job_ends(directory):
    import threading

    from resourced.cli.runner import print_log

    jobs.create(directory, job())
    writer = jobs.LogWriter(directory / "b1x2y3z.log", limit=64)  # turns over every 32 bytes
    lines = [f"{i:03d}\n".encode() for i in range(100)]

    def command():
        for line in lines:
            writer.write(line)
            time.sleep(0.002)
        writer.close()
        jobs.save(directory, jobs.advance(jobs.advance(job(), RUNNING), SUCCEEDED))

    thread = threading.Thread(target=command)
    thread.start()
    out = []
    try:
        print_log(directory, "b1x2y3z", out.append, follow=True, poll=0.001)
    finally:
        thread.join(10)
    numbers = [int(n) for n in b"".join(out).split()]
    assert numbers[-1] == 99                                    # it followed to the end
    assert numbers == sorted(set(numbers))                      # nothing twice, in order


# -- the shim, and the runner's lock ---------------------------------------------------
def shim(directory, spec: bytes | None, timeout=30):
    return subprocess.run([sys.executable, "-m", "resourced.runner.jobs", "shim", str(directory),
                           "b1x2y3z"], input=spec or b"", capture_output=True, timeout=timeout,
                          start_new_session=True, check=False)


def test_a_shim_never_told_to_go_runs_nothing(directory):
    done = shim(directory, None)  # the runner died before it said go
    assert done.returncode == jobs.SHIM_NOT_TOLD
    assert not (directory / "b1x2y3z.exit").exists() and not (directory / "b1x2y3z.log").exists()


def test_the_shim_runs_the_command_logs_its_output_and_writes_its_exit(directory, tmp_path):
    code = "import os, sys; print('out', os.getcwd()); print('err', file=sys.stderr); sys.exit(3)"
    spec = {"argv": [sys.executable, "-c", code], "cwd": str(tmp_path), "env": {"A": "1"}}
    done = shim(directory, json.dumps(spec).encode())
    assert done.returncode == 3
    log = jobs.read_log(directory / "b1x2y3z.log").decode()
    assert f"out {tmp_path}\n" in log and "err\n" in log
    assert jobs.read_exit(directory, "b1x2y3z") == {"exit_code": 3, "signal": "", "detail": ""}


def test_the_shim_says_why_a_command_could_not_run(directory, tmp_path):
    spec = {"argv": ["no-such-command-here"], "cwd": str(tmp_path), "env": {"PATH": "/nowhere"}}
    assert shim(directory, json.dumps(spec).encode()).returncode == 127
    status = jobs.read_exit(directory, "b1x2y3z")
    assert status["exit_code"] == 127 and "cannot run no-such-command-here" in status["detail"]
    assert "cannot run no-such-command-here" in jobs.read_log(directory / "b1x2y3z.log").decode()


def test_each_bus_has_its_runner_lock(directory):
    """One runner per bus: a user's session daemon and the machine's system daemon each
    have theirs, and a shared bus's (an address) its own."""
    shared = "unix:path=/srv/lab/resourced/bus"
    names = {jobs.runner_lock(directory, b).name for b in ("session", "system", shared)}
    assert len(names) == 3 and "runner-session.lock" in names
    assert not jobs.runner_is_running(directory, "session")
    fd = os.open(jobs.runner_lock(directory, "session"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert jobs.runner_is_running(directory, "session")
        assert not jobs.runner_is_running(directory, "system")  # its runner may start
        assert not jobs.runner_is_running(directory, shared)
    finally:
        os.close(fd)
    assert not jobs.runner_is_running(directory, "session")
