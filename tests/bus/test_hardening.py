"""Defects found by attacking the daemon from outside, each pinned by the behaviour a user
sees: a named error and an exit code, a log without tracebacks, nothing granted wrongly."""

import os
import subprocess
import sys
import threading
import time

import pytest
from jeepney import DBusAddress, new_method_call
from jeepney.io.blocking import open_dbus_connection

from resourced.client.sync import Client
from resourced.errors import InvalidArgs, ResourcedError

from ..conftest import eventually, gpuctl
from .test_evidence import Simulation, claims, procs, sim  # noqa: F401 - fixtures


def one_line_error(r: subprocess.CompletedProcess) -> str:
    """The single ``gpuctl:`` line of a failed command (never a traceback)."""
    assert "Traceback" not in r.stderr, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpuctl: "), r.stderr
    return lines[0]


# -- bad input through the CLI, with a daemon running -----------------------------------

BAD_CLAIMS = [
    (["claim", "--gpus", "1", "--owner-pid", "2147483648"], 2, "out of range"),
    (["claim", "--gpus", "1", "--owner-pid", "4294967295"], 2, "out of range"),
    (["claim", "--gpus", "1", "--owner-pid", "4294967296"], 2, "4294967296"),
    (["claim", "--owner-pid", "{pid}", "--ram", "99999999P"], 2, "too large"),
    (["claim", "--owner-pid", "{pid}", "--ram", "18446744073709551616K"], 2, "too large"),
    (["claim", "--owner-pid", "{pid}", "--vram", "-4G"], 2, "negative"),
    (["claim", "--owner-pid", "{pid}", "--gpus", "0"], 2, "0"),
    (["claim", "--owner-pid", "{pid}", "--gpus", "99"], 3, "the machine has 4"),
    (["claim", "--owner-pid", "{pid}", "--pool", "licenses=1", "--pool", "licenses=1"], 2,
     "more than once"),
    (["claim", "--owner-pid", "{pid}", "--pool", "nosuch=1"], 2, "no pool"),
    (["claim", "--owner-pid", "{pid}", "--priority", "2147483648"], 2, "2147483648"),
    (["run", "--ram", "99999999P", "--", "true"], 2, "too large"),
    (["run", "--wait", "--timeout", "soon", "--", "true"], 2, "duration"),
    (["release", "--allocation", "nosuch"], 6, "nosuch"),
    (["env", "--allocation", "c000000"], 6, "c000000"),
]


@pytest.mark.parametrize("args, code, says", BAD_CLAIMS, ids=lambda v: " ".join(v) if isinstance(v, list) else None)
def test_bad_input_is_one_line_and_its_exit_code(daemon, args, code, says):
    r = gpuctl(*[a.format(pid=os.getpid()) for a in args])
    assert r.returncode == code, r.stderr
    assert says in one_line_error(r)
    assert "Traceback" not in daemon.log()
    assert claims() == {}


def test_a_huge_owner_pid_on_the_bus_is_invalid_args_not_internal(daemon):
    with Client() as c, pytest.raises(InvalidArgs, match="out of range"):
        c._send(c._call("Claim", "ua{sv}", (1, {"Mode": ("s", "dev"), "OwnerPID": ("u", 2**32 - 1)})))
    with Client() as c, pytest.raises(InvalidArgs, match="out of range"):
        c._send(c._call("Claim", "ua{sv}", (1, {"MemberPIDs": ("au", [2**32 - 1])})))
    assert "Traceback" not in daemon.log()


@pytest.mark.parametrize("field", ["label", "task_name"])
def test_a_nul_byte_is_refused_before_sending_and_the_connection_lives(daemon, field):
    with Client() as c:
        with pytest.raises(InvalidArgs, match="NUL"):
            c.claim(owner_pid=os.getpid(), **{field: "a\0b"})
        c.ping()  # the same connection still works: nothing reached the bus
        with pytest.raises(InvalidArgs, match="whole number"):
            c.claim(owner_pid=os.getpid(), priority=2**40)
        c.ping()


# -- the audit trail ----------------------------------------------------------------------


def test_a_lease_release_is_audited_as_a_release_not_a_forced_one(daemon):
    with Client() as c, c.acquire(vram="4G") as lease:
        ref = lease.ref
    eventually(lambda: f"released {ref} (released)" in daemon.log())
    assert "forced" not in daemon.log()


# -- queued claims ------------------------------------------------------------------------


def test_a_queue_timeout_survives_a_restart(start_daemon, procs):
    """A claim made with Wait alone outlives the connection that made it (one made with
    ReplyWhenGranted leaves the queue with its caller: a test of its own says so)."""
    first = start_daemon(gpus=1)
    owner = procs.sleep()
    with Client() as c:
        c.claim(owner_pid=owner.pid)
    with open_dbus_connection("SESSION") as conn:  # gone before the restart, as a client
        reply = conn.send_and_get_reply(new_method_call(  # killed while it waited would be
            DBusAddress("/org/resourced", "org.resourced", "org.resourced.Manager"), "Claim",
            "ua{sv}", (1, {"Mode": ("s", "dev"), "OwnerPID": ("u", owner.pid),
                           "Wait": ("b", True), "QueueTimeoutUSec": ("t", 4_000_000)})),
            timeout=10)
    ref = reply.body[0]
    assert claims()[ref]["state"] == "queued"
    first.proc.kill()
    first.proc.wait(5)
    second = start_daemon(gpus=1, runtime_dir=first.runtime_dir)
    assert claims()[ref]["state"] == "queued"
    # It came back with its deadline, so it leaves the queue on time.
    eventually(lambda: ref not in claims(), timeout=8)
    # (the audit line is written after the change is told: it may come a moment later)
    eventually(lambda: f"released {ref} (timeout)" in second.log(), timeout=5)


def test_a_waiter_is_not_granted_a_gpu_a_stranger_started_using(start_daemon, sim, procs):
    """The walk after a release looks at the GPUs afresh: the stranger who started on the
    freed GPU meanwhile keeps it from the waiter, until the stranger is gone."""
    sim = Simulation(sim.path, gpus=1)
    start_daemon(gpus=sim.path)
    holder = procs.sleep()
    with Client() as c:
        ref = c.claim(owner_pid=holder.pid)["allocation"]["ref"]
    waiter = subprocess.Popen(
        [sys.executable, "-m", "resourced.cli", "run", "--wait", "--timeout", "20s", "--",
         "true"], stderr=subprocess.PIPE, text=True)
    try:
        eventually(lambda: len(claims()) == 2)
        stranger = procs.sleep()
        sim.put(0, stranger.pid)
        with Client() as c:
            c.release(ref, force=True)
        with pytest.raises(subprocess.TimeoutExpired):
            waiter.wait(2.5)  # two tracking sweeps: still not granted
        assert [c["state"] for c in claims().values()] == ["queued"]
        sim.put(0)
        assert waiter.wait(10) == 0
    finally:
        waiter.kill()
        waiter.wait(5)


# -- what the daemon finds at start -----------------------------------------------------


def test_a_claims_log_that_is_a_directory_is_one_line_at_start(start_daemon, tmp_path):
    run = tmp_path / "run"
    (run / "claims.log").mkdir(parents=True, mode=0o700)
    run.chmod(0o700)
    d = start_daemon(runtime_dir=run, wait=False)
    assert d.proc.wait(10) == 1
    assert "claims.log is a directory" in d.log()
    assert "Traceback" not in d.log()


def test_loose_permissions_are_reset_and_said(start_daemon, tmp_path):
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    (run / "claims.log").write_text("")
    os.chmod(run, 0o777)
    os.chmod(run / "claims.log", 0o666)
    d = start_daemon(runtime_dir=run)
    assert os.stat(run).st_mode & 0o777 == 0o700
    assert os.stat(run / "claims.log").st_mode & 0o777 == 0o600
    assert "was mode 0777; reset to 0700" in d.log()
    assert "was mode 0666; reset to 0600" in d.log()


# -- the private test bus ------------------------------------------------------------------


def test_the_private_bus_activates_nothing_of_the_machines(private_bus):
    """A call to a name nobody owns fails at once instead of starting the machine's
    notification server (which dies without a display)."""
    r = subprocess.run(["busctl", f"--address={private_bus.address}", "call",
                        "org.freedesktop.Notifications", "/org/freedesktop/Notifications",
                        "org.freedesktop.Notifications", "GetCapabilities"],
                       capture_output=True, text=True, timeout=10)
    assert r.returncode != 0
    assert "not provided by any .service files" in r.stderr


# -- found by the fuzzer -------------------------------------------------------------------


def test_large_replies_racing_other_messages_never_drop_the_connection(daemon):
    """A full socket buffer once made the daemon drop its bus connection and exit: a 1 MB
    error reply while another client pings, 30 times over."""
    stop = threading.Event()
    failures: list[Exception] = []

    def ping():
        with Client() as c:
            while not stop.is_set():
                try:
                    c.ping()
                except Exception as exc:  # noqa: BLE001 - recorded, the test fails on it
                    failures.append(exc)
                    return
                time.sleep(0.002)

    pinger = threading.Thread(target=ping)
    pinger.start()
    huge = new_method_call(DBusAddress("/org/resourced", "org.resourced",
                                       "org.freedesktop.DBus.Properties"),
                           "Get", "ss", ("org.resourced.Manager", "x" * 2**20))
    try:
        with Client() as c:
            for _ in range(30):  # dbus-fast's error quotes the 1 MB property name back
                with pytest.raises(ResourcedError):
                    c._send(huge)
    finally:
        stop.set()
        pinger.join(10)
    assert failures == []
    assert daemon.proc.poll() is None


def test_member_pids_are_taken_once_each_and_at_most_64(daemon):
    with Client() as c:
        granted = c.claim(owner_pid=os.getpid(), member_pids=[os.getpid()] * 10_000)
        c.release(granted["allocation"]["ref"], force=True)
        with pytest.raises(InvalidArgs, match="at most 64"):
            c.claim(owner_pid=os.getpid(), member_pids=range(1, 66))


@pytest.mark.parametrize("field", ["label", "task_name"])
def test_a_label_is_one_short_line(daemon, field):
    with Client() as c:
        with pytest.raises(InvalidArgs, match="control characters"):
            c.claim(owner_pid=os.getpid(), **{field: "a\nb"})
        with pytest.raises(InvalidArgs, match="at most 256"):
            c.claim(owner_pid=os.getpid(), **{field: "x" * 257})
    assert claims() == {}


def test_what_a_caller_sends_cannot_forge_a_log_line(daemon):
    with Client() as c:
        c.claim(owner_pid=os.getpid())
        c.release_gpu("0", "oops\n<0>resourced: FORGED")
    eventually(lambda: "oops\\x0a<0>resourced: FORGED" in daemon.log())
    assert not any(line.startswith(("<0>", "resourced: FORGED"))
                   for line in daemon.log().splitlines())
