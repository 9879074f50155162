"""Evidence end to end: a real daemon on the private bus, a simulated driver (a JSON file
this test rewrites as it goes) and real processes listed on the GPUs.

A ``sleep`` whose pid the file lists on a GPU is "a process on that GPU": the daemon sees
it through the backend exactly as it would see a CUDA process through NVML, and reads its
parent, user and command line from /proc.
"""

import json
import os
import pwd
import re
import signal
import subprocess
import sys
import threading
import time
import tomllib
from pathlib import Path

import pytest
from jeepney import DBusAddress, MatchRule, message_bus, new_method_call
from jeepney.io.blocking import Proxy, open_dbus_connection

from resourced.backends.simulated import simulated_uuid
from resourced.client.sync import Client

from ..conftest import documentation, eventually, gpuctl

USER = pwd.getpwuid(os.getuid()).pw_name
ORPHAN_SLEEP = "sleep 30 >/dev/null 2>&1 & echo $!"  # a background child; prints its pid


# -- the simulated driver ---------------------------------------------------------------


class Simulation:
    """The file behind RESOURCED_SIMULATED_GPUS; every change is one atomic rename, so the
    daemon never reads half a file."""

    def __init__(self, path: Path, gpus: int = 4):
        self.path = path
        self.gpus: dict[int, list[int]] = {i: [] for i in range(gpus)}
        self.hang = 0.0
        self.write()

    def data(self) -> dict:
        """What the file says."""
        data = {"gpus": [{"index": i, "uuid": simulated_uuid(i),
                          "processes": [{"pid": p, "used_memory_mib": 512} for p in pids]}
                         for i, pids in sorted(self.gpus.items())]}
        if self.hang:
            data["hang_seconds"] = self.hang
        return data

    def write(self) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(self.data()))
        os.replace(tmp, self.path)

    def put(self, index: int, *pids: int) -> None:
        """List exactly ``pids`` on GPU ``index``."""
        self.gpus[index] = list(pids)
        self.write()

    def drop(self, index: int) -> None:
        """The driver stops reporting GPU ``index``."""
        del self.gpus[index]
        self.write()

    def hang_for(self, seconds: float) -> None:
        self.hang = seconds
        self.write()


@pytest.fixture
def sim(tmp_path) -> Simulation:
    return Simulation(tmp_path / "gpus.json")


SPARE = 3
"""The GPU that tests on the simulated clock leave unclaimed, to see the sweeps look."""


def swept(sim: Simulation, clock) -> None:
    """Wait until a whole tracking sweep has run on the clock as it is now.

    Each move of the simulated clock starts a sweep (the daemon sees it at its next call);
    a process nobody claimed, listed on the spare GPU, shows it busy from the first sweep
    that saw it and free from the first that did not.  That second sweep began after the
    first had ended, so on the clock as it is now; the third began after it had ended.
    The clock moves a second each time, and the spare GPU is left free."""
    with Client() as c:
        for pids in ((os.getpid(),), (), (os.getpid(),), ()):
            sim.put(SPARE, *pids)
            clock.advance(1)
            c.bookings()  # brings the daemon's clock up to date
            state = "busy" if pids else "free"
            eventually(lambda s=state: [g["state"] for g in c.status()["gpus"]
                                        if g["index"] == SPARE] == [s],
                       what=f"the spare GPU {state}")


def settings(tmp_path: Path, **daemon) -> list[str]:
    """``--config FILE`` for a config file with these [daemon] settings."""
    path = tmp_path / f"config-{time.monotonic_ns()}.toml"
    path.write_text("[daemon]\n" + "".join(f"{k} = {v}\n" for k, v in daemon.items()))
    return ["--config", str(path)]


# -- processes the test starts ----------------------------------------------------------


class Processes:
    """Every process a test starts, directly or as a shell's background child; all are
    killed at the end, through pidfds taken while they surely were ours."""

    def __init__(self):
        self._popens: list[subprocess.Popen] = []
        self._pidfds: list[int] = []

    def sleep(self, seconds: int = 60) -> subprocess.Popen:
        return self._keep(subprocess.Popen(["sleep", str(seconds)]))

    def shell(self, script: str) -> tuple[subprocess.Popen, int]:
        """``sh -c script`` whose first output line is a pid (a background child it started)."""
        p = self._keep(subprocess.Popen(["sh", "-c", script], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, text=True))
        child = int(p.stdout.readline())
        self.track(child)
        return p, child

    def track(self, pid: int) -> None:
        self._pidfds.append(os.pidfd_open(pid))

    def _keep(self, p: subprocess.Popen) -> subprocess.Popen:
        self._popens.append(p)
        self.track(p.pid)
        return p

    def close(self) -> None:
        for fd in self._pidfds:
            try:
                signal.pidfd_send_signal(fd, signal.SIGKILL)
            except ProcessLookupError:
                pass
            os.close(fd)
        for p in self._popens:
            p.wait(10)


@pytest.fixture
def procs():
    p = Processes()
    yield p
    p.close()


def finish(shell: subprocess.Popen) -> None:
    """Give one line to a shell waiting in ``read``, so it goes on."""
    shell.stdin.write("\n")
    shell.stdin.flush()


def parent_of(pid: int) -> int:
    with open(f"/proc/{pid}/stat", "rb") as f:
        data = f.read()
    return int(data[data.rindex(b")") + 2 :].split()[1])


# -- asking the daemon ------------------------------------------------------------------


def status() -> dict:
    with Client() as c:
        return c.status()


def claims() -> dict[str, dict]:
    return {c["id"]: c for c in status()["claims"]}


def claim(owner_pid: int, gpus: int = 1) -> str:
    r = gpuctl("claim", "--owner-pid", str(owner_pid), "--gpus", str(gpus))
    assert (r.returncode, r.stderr) == (0, ""), r.stderr
    return r.stdout.strip()


def gpu_of(ref: str) -> int:
    return claims()[ref]["gpu_indices"][0]


def verify() -> tuple[int, dict]:
    r = gpuctl("verify", "--json")
    assert "Traceback" not in r.stderr, r.stderr
    return r.returncode, json.loads(r.stdout)


def report(data: dict, alias: str) -> dict:
    [r] = [g for g in data["gpus"] if g["alias"] == alias]
    return r


def member_pids(ref: str) -> list[int]:
    """The MemberPIDs property of the claim's object."""
    props = DBusAddress(f"/org/resourced/claim/{ref}", bus_name="org.resourced",
                        interface="org.freedesktop.DBus.Properties")
    with open_dbus_connection("SESSION") as conn:
        reply = conn.send_and_get_reply(
            new_method_call(props, "Get", "ss", ("org.resourced.Claim", "MemberPIDs")), timeout=5)
    return list(reply.body[0][1])


class ClaimRemovedListener:
    """Records the daemon's ClaimRemoved signals from the moment it is created."""

    def __init__(self):
        self.conn = open_dbus_connection("SESSION")
        rule = MatchRule(type="signal", interface="org.resourced.Manager", member="ClaimRemoved")
        Proxy(message_bus, self.conn).AddMatch(rule)
        self._filter = self.conn.filter(rule)
        self.queue = self._filter.__enter__()

    def reason(self, claim_id: str, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while True:
            left = max(deadline - time.monotonic(), 0.01)
            msg = self.conn.recv_until_filtered(self.queue, timeout=left)
            if msg.body[0] == claim_id:
                return msg.body[2]

    def close(self) -> None:
        self._filter.__exit__(None, None, None)
        self.conn.close()


@pytest.fixture
def removed(private_bus, monkeypatch):
    for k, v in private_bus.env().items():
        monkeypatch.setenv(k, v)
    listener = ClaimRemovedListener()
    yield listener
    listener.close()


def kill_now(d) -> None:
    """SIGKILL a daemon whose probe thread is stuck in a 'hung driver' (a SIGTERM would wait
    for it: see test_a_daemon_stops_promptly_while_a_driver_call_hangs)."""
    d.proc.kill()
    d.proc.wait(5)


# == verify ============================================================================


def test_idle_gpus_and_an_idle_claim_are_no_problem(start_daemon, sim, procs):
    start_daemon(gpus=sim.path)
    owner = procs.sleep()
    ref = claim(owner.pid)

    code, data = verify()

    assert code == 0 and data["problems"] is False
    assert [(g["alias"], g["status"], g["claim"], g["processes"]) for g in data["gpus"]] == [
        ("gpu0", "IDLE CLAIM", ref, []), ("gpu1", "OK", "", []),
        ("gpu2", "OK", "", []), ("gpu3", "OK", "", [])]
    assert data["gpus"][0]["uuid"] == simulated_uuid(0)


def test_a_process_on_an_unclaimed_gpu_is_unclaimed_use(start_daemon, sim, procs):
    start_daemon(gpus=sim.path)
    stray = procs.sleep(61)
    sim.put(2, stray.pid)

    code, data = verify()

    assert code == 1 and data["problems"] is True
    gpu2 = report(data, "gpu2")
    assert (gpu2["status"], gpu2["claim"]) == ("UNCLAIMED USE", "")
    [p] = gpu2["processes"]
    assert {k: p[k] for k in ("pid", "user", "command", "claim", "ambiguous", "uid")} == {
        "pid": stray.pid, "user": USER, "command": "sleep 61", "claim": "", "ambiguous": "",
        "uid": os.getuid()}
    assert p["used_memory_bytes"] == 512 * 1024 * 1024
    assert [g["status"] for g in data["gpus"] if g["alias"] != "gpu2"] == ["OK"] * 3
    gpu_keys, process_keys = documented_verify_keys()
    assert (set(data) == {"schema", "gpus", "problems"} and data["schema"] == 2)
    assert all(set(g) == gpu_keys for g in data["gpus"]) and set(p) == process_keys


def documented_verify_keys() -> tuple[set[str], set[str]]:
    """The keys the documentation promises for each GPU and each process of verify --json."""
    import re

    text = " ".join(documentation().split())
    found = re.search(r"each GPU has the keys (.*?), and each process (.*?) \(", text)
    assert found, "the documentation no longer gives verify's keys"
    return tuple(set(re.findall(r"`(\w+)`", part)) for part in found.groups())


def test_a_process_of_nobody_on_a_claimed_gpu_is_a_foreign_process(start_daemon, sim, procs):
    start_daemon(gpus=sim.path)
    ref = claim(procs.sleep().pid)
    intruder = procs.sleep(62)
    sim.put(gpu_of(ref), intruder.pid)

    code, data = verify()

    assert code == 1 and data["problems"] is True
    gpu = report(data, f"gpu{gpu_of(ref)}")
    assert (gpu["status"], gpu["claim"]) == ("FOREIGN PROCESS", ref)
    assert [(p["pid"], p["user"], p["command"], p["claim"], p["ambiguous"])
            for p in gpu["processes"]] == [(intruder.pid, USER, "sleep 62", "", "")]


def test_human_verify_lists_pid_user_and_command_of_each_process(start_daemon, sim, procs):
    start_daemon(gpus=sim.path)
    ref = claim(procs.sleep().pid)
    intruder, stray = procs.sleep(63), procs.sleep(64)
    sim.put(0, intruder.pid)
    sim.put(1, stray.pid)

    r = gpuctl("verify")

    assert r.returncode == 1 and r.stderr == ""
    lines = r.stdout.splitlines()
    assert lines[0] == f"gpu0  FOREIGN PROCESS (claim {ref})"
    assert re.fullmatch(rf"\s+pid {intruder.pid}\s+{USER}\s+sleep 63\s+\[no claim\]", lines[1])
    assert lines[2] == "gpu1  UNCLAIMED USE"
    assert re.fullmatch(rf"\s+pid {stray.pid}\s+{USER}\s+sleep 64\s+\[no claim\]", lines[3])
    assert lines[4:] == ["gpu2  OK", "gpu3  OK"]


def test_a_gpu_dropped_by_the_driver_after_start_is_missing(start_daemon, sim, procs):
    start_daemon(gpus=sim.path)
    sim.drop(3)

    code, data = verify()

    assert code == 1 and data["problems"] is True
    gpu3 = report(data, "gpu3")
    assert (gpu3["status"], gpu3["detail"]) == ("MISSING", "the driver does not report this GPU")
    assert [g["status"] for g in data["gpus"][:3]] == ["OK"] * 3
    # ... and a GPU the driver does not report is never granted.
    owner = procs.sleep()
    assert gpuctl("claim", "--owner-pid", str(owner.pid), "--gpus", "4").returncode == 4
    ref = claim(owner.pid, gpus=3)
    assert sorted(claims()[ref]["gpu_indices"]) == [0, 1, 2]


def test_a_driver_that_does_not_answer_makes_every_gpu_unknown(start_daemon, sim, tmp_path):
    d = start_daemon(gpus=sim.path, args=settings(tmp_path, probe_timeout=1))
    sim.hang_for(30)

    t0 = time.monotonic()
    code, data = verify()
    elapsed = time.monotonic() - t0

    assert code == 1 and data["problems"] is True
    assert [g["status"] for g in data["gpus"]] == ["UNKNOWN"] * 4
    assert all("did not answer within 1 s" in g["detail"] for g in data["gpus"])
    assert elapsed < 15  # after the 1 s deadline, not the 30 s hang
    kill_now(d)


# == attribution ========================================================================


def test_a_child_of_the_owner_on_the_claims_gpu_is_the_claims(start_daemon, sim, procs):
    start_daemon(gpus=sim.path)
    shell, child = procs.shell(f"{ORPHAN_SLEEP}; read line")
    ref = claim(shell.pid)
    sim.put(gpu_of(ref), child)

    code, data = verify()

    assert code == 0
    gpu = report(data, f"gpu{gpu_of(ref)}")
    assert gpu["status"] == "OK"
    assert [(p["pid"], p["claim"], p["ambiguous"], p["command"]) for p in gpu["processes"]] == [
        (child, ref, "", "sleep 30")]


def test_verify_and_release_agree_on_a_process_of_two_claims(start_daemon, sim, procs):
    """A process that owns claim A, below a shell that owns claim B: it is A's on A's GPU
    for verify (OK, not FOREIGN PROCESS) and for A's release (refused: still in use), and
    B's release is not held back by it."""
    start_daemon(gpus=sim.path)
    shell, child = procs.shell(f"{ORPHAN_SLEEP}; read line")
    inner = claim(child)
    outer = claim(shell.pid)  # after: the shell's claim adopts the child too
    eventually(lambda: child in member_pids(outer), timeout=4)
    sim.put(gpu_of(inner), child)

    code, data = verify()
    gpu = report(data, f"gpu{gpu_of(inner)}")
    assert (code, gpu["status"], gpu["processes"][0]["claim"]) == (0, "OK", inner)
    refused = gpuctl("release", "--allocation", inner)
    assert refused.returncode == 9 and f"pid {child}" in refused.stderr
    assert gpuctl("release", "--allocation", outer).returncode == 0


def test_a_member_reparented_to_init_stays_the_claims(start_daemon, sim, procs):
    """The owner shell runs a shell that starts a sleep; that middle shell exits, so the
    sleep is re-parented; later the owner exits too. The sleep stays the claim's."""
    start_daemon(gpus=sim.path)
    owner, child = procs.shell(f"sh -c '{ORPHAN_SLEEP}; read a'; read b")
    middle = parent_of(child)
    assert middle != owner.pid and parent_of(middle) == owner.pid
    ref = claim(owner.pid)
    sim.put(gpu_of(ref), child)
    eventually(lambda: child in member_pids(ref), timeout=4)

    finish(owner)  # the middle shell reads the line and exits
    eventually(lambda: parent_of(child) != middle, timeout=4)
    assert owner.poll() is None

    code, data = verify()
    gpu = report(data, f"gpu{gpu_of(ref)}")
    assert (code, gpu["status"], gpu["processes"][0]["claim"]) == (0, "OK", ref)

    finish(owner)  # now the owner itself exits
    owner.wait(5)
    eventually(lambda: claims()[ref]["owner_alive"] is False)
    code, data = verify()
    gpu = report(data, f"gpu{gpu_of(ref)}")
    assert (code, gpu["status"], gpu["processes"][0]["claim"]) == (0, "OK", ref)
    assert child in member_pids(ref)


def test_a_listed_pid_that_does_not_exist_here_is_ambiguous(start_daemon, sim, procs):
    start_daemon(gpus=sim.path)
    ref = claim(procs.sleep().pid)
    with open("/proc/sys/kernel/pid_max") as f:
        ghost = int(f.read()) + 1
    sim.put(gpu_of(ref), ghost)
    sim.put(3, ghost)

    code, data = verify()

    assert code == 1
    on_claim = report(data, f"gpu{gpu_of(ref)}")
    unclaimed = report(data, "gpu3")
    assert (on_claim["status"], unclaimed["status"]) == ("FOREIGN PROCESS", "UNCLAIMED USE")
    for gpu in (on_claim, unclaimed):
        [p] = gpu["processes"]
        assert (p["pid"], p["claim"], p["user"], p["command"]) == (ghost, "", "", "")
        assert "not visible" in p["ambiguous"]
    human = gpuctl("verify").stdout
    assert f"pid {ghost}  ?  ?  [cannot be attributed: not visible" in human


# == the check at claim =================================================================


def test_a_free_gpu_running_a_process_is_skipped(start_daemon, sim, procs):
    d = start_daemon(gpus=sim.path)
    stray = procs.sleep()
    sim.put(0, stray.pid)

    ref = claim(procs.sleep().pid)

    assert claims()[ref]["gpu_indices"] == [1]
    assert re.search(rf"gpu0 is unclaimed but busy \(pids {stray.pid}\)", d.log())


def test_when_every_free_gpu_is_busy_claim_and_run_exit_4(start_daemon, sim, procs, tmp_path):
    start_daemon(gpus=sim.path)
    owner = procs.sleep()
    held = claim(owner.pid, gpus=2)
    free = sorted(set(range(4)) - set(claims()[held]["gpu_indices"]))
    for index in free:
        sim.put(index, procs.sleep().pid)
    marker = tmp_path / "ran"

    c = gpuctl("claim", "--owner-pid", str(owner.pid))
    r = gpuctl("run", "--", "touch", str(marker))
    one = gpuctl("run", "--gpus", "1", "--", "touch", str(marker))

    for result in (c, r, one):
        assert result.returncode == 4, result.stderr
        assert result.stderr.startswith("gpuctl: ") and len(result.stderr.splitlines()) == 1
    assert not marker.exists()
    assert list(claims()) == [held]
    # Once the driver lists nothing there, the same claim succeeds.
    sim.put(free[0])
    ref = claim(owner.pid)
    assert claims()[ref]["gpu_indices"] == [free[0]]


def test_a_free_gpu_running_processes_nobody_claimed_is_busy_not_free(start_daemon, sim, procs):
    start_daemon(gpus=sim.path)
    sim.put(2, procs.sleep().pid)
    gpuctl("verify")  # a look now (the daemon looks every few seconds too: below)

    data = status()
    assert [g["state"] for g in data["gpus"]] == ["free", "free", "busy", "free"]
    assert data["free"] == 3
    assert gpuctl("free").stdout == "3\n"
    assert "busy: gpu2: processes nobody claimed run there" in gpuctl("status").stdout
    sim.put(2)
    eventually(lambda: gpuctl("free").stdout == "4\n", timeout=10)
    assert [g["state"] for g in status()["gpus"]] == ["free"] * 4


@pytest.mark.parametrize("gpus, first, stranger_on, share, code, said", [
    (2, ("--gpus", "1"), 1, "4G", 4, "it fits only on gpu1, where processes nobody claimed run"),
    (1, ("--vram", "79G"), 0, "768M", 3, "at most 512M free on one GPU"),
], ids=["its-only-room-is-on-a-busy-gpu", "a-stranger-holds-vram-on-a-shared-gpu"])
def test_processes_nobody_claimed_keep_a_share_out_until_they_go(
        start_daemon, tmp_path, procs, gpus, first, stranger_on, share, code, said):
    driver = Simulation(tmp_path / "gpus.json", gpus=gpus)  # 80G each; a listed process holds 512M
    start_daemon(gpus=driver.path)
    owner = procs.sleep()
    held = gpuctl("claim", "--owner-pid", str(owner.pid), *first)
    assert held.returncode == 0, held.stderr
    driver.put(stranger_on, procs.sleep().pid)
    asked = ("claim", "--owner-pid", str(owner.pid), "--vram", share)

    refused = gpuctl(*asked)

    assert refused.returncode == code, refused.stderr
    assert said in refused.stderr
    driver.put(stranger_on)
    assert gpuctl(*asked).returncode == 0


def test_a_hung_driver_lets_claims_through_with_a_warning(start_daemon, sim, procs, tmp_path):
    d = start_daemon(gpus=sim.path, args=settings(tmp_path, probe_timeout=1))
    sim.put(0, procs.sleep().pid)  # would be skipped, were the driver answering
    sim.hang_for(5)
    owner = procs.sleep()

    t0 = time.monotonic()
    r = gpuctl("claim", "--owner-pid", str(owner.pid))
    first = time.monotonic() - t0
    t0 = time.monotonic()
    again = gpuctl("claim", "--owner-pid", str(owner.pid))
    second = time.monotonic() - t0
    run = gpuctl("run", "--", "true")

    for result in (r, again, run):
        assert result.returncode == 0, result.stderr
        assert result.stderr.startswith("gpuctl: warning: granted without checking the GPUs: ")
    assert "did not answer" in r.stderr and "has not answered" in again.stderr
    assert first < 2.0      # about probe_timeout
    assert second < 1.0     # the hung call is not waited for again
    assert len(claims()) == 2
    # A release cannot check either: it goes through, and says so.
    rel = gpuctl("release", "--allocation", r.stdout.strip())
    assert rel.returncode == 0
    assert rel.stderr.startswith("gpuctl: warning: released without checking the GPUs: ")
    assert len(claims()) == 1
    kill_now(d)


# == a hung driver never delays the bus ==================================================


@pytest.mark.parametrize("slow", ["verify", "claim"])
def test_a_hung_driver_never_delays_other_calls(start_daemon, sim, procs, tmp_path, slow):
    """While a verify or a claim waits (up to probe_timeout) for a hung driver, status
    and free answer at once, through the client and through gpuctl."""
    d = start_daemon(gpus=sim.path, args=settings(tmp_path, probe_timeout=1))
    owner = procs.sleep()
    sim.hang_for(5)
    waited: list[tuple[float, float]] = []

    def slow_call():
        with Client() as c:
            t0 = time.monotonic()
            if slow == "verify":
                c.verify()
            else:
                c.claim(mode="dev", gpus=1, owner_pid=owner.pid)
            waited.append((t0, time.monotonic()))

    quick: dict[str, tuple[float, float]] = {}

    def timed(name, fn):
        t0 = time.monotonic()
        result = fn()
        quick[name] = (t0, time.monotonic())
        return result

    worker = threading.Thread(target=slow_call)
    worker.start()
    assert timed("gpuctl status", lambda: gpuctl("status")).returncode == 0
    assert timed("gpuctl free", lambda: gpuctl("free")).returncode == 0
    with Client() as c:
        for i in range(5):
            timed(f"status {i}", c.status)
            timed(f"free {i}", c.free)
    worker.join(10)

    [(slow_start, slow_end)] = waited
    print(f"{slow} waited {slow_end - slow_start:.3f} s; meanwhile: " + ", ".join(
        f"{name} {(t1 - t0) * 1e3:.1f} ms" for name, (t0, t1) in quick.items()))
    assert 0.8 < slow_end - slow_start < 2.5, f"{slow} took {slow_end - slow_start:.2f} s"
    for name, (t0, t1) in quick.items():
        assert t1 < slow_end, f"{name} ended after the {slow} it was to overlap"
        limit = 0.9 if name.startswith("gpuctl") else 0.25
        assert t1 - t0 < limit, f"{name} took {t1 - t0:.3f} s while {slow} waited"
    kill_now(d)


def test_a_driver_that_hangs_at_start_up_is_reported_with_the_reason(start_daemon, sim,
                                                                     tmp_path):
    sim.hang_for(2)
    d = start_daemon(gpus=sim.path, args=settings(tmp_path, probe_timeout=0.5))
    data = status()
    kill_now(d)
    assert (data["gpus"], data["backend"]) == ([], "none")
    assert re.search(r"did not answer within", data["backend_note"], re.I), \
        data["backend_note"]


def test_a_daemon_stops_promptly_while_a_driver_call_hangs(start_daemon, sim, tmp_path):
    d = start_daemon(gpus=sim.path, args=settings(tmp_path, probe_timeout=1))
    sim.hang_for(60)
    assert verify()[0] == 1  # a probe thread is now stuck in the driver

    t0 = time.monotonic()
    d.proc.terminate()
    try:
        d.proc.wait(20)
    except subprocess.TimeoutExpired:
        pass
    elapsed = time.monotonic() - t0
    code = d.proc.poll()
    if code is None:
        kill_now(d)
    assert code == 0 and elapsed < 20, f"SIGTERM took {elapsed:.1f} s (exit {code})"


# == the check at release ===============================================================


def test_release_is_refused_while_the_claims_process_runs_on_its_gpu(start_daemon, sim, procs):
    start_daemon(gpus=sim.path)
    shell, child = procs.shell(f"{ORPHAN_SLEEP}; read line")
    ref = claim(shell.pid)
    sim.put(gpu_of(ref), child)

    r = gpuctl("release", "--allocation", ref)

    assert r.returncode == 9
    assert f"pid {child} (sleep 30)" in r.stderr and "--force" in r.stderr
    assert r.stderr.startswith("gpuctl: ") and len(r.stderr.splitlines()) == 1
    assert ref in claims()                         # refused: nothing changed

    sim.put(gpu_of(ref))                           # the process left the GPU
    r = gpuctl("release", "--allocation", ref)
    assert (r.returncode, r.stderr) == (0, "")
    assert ref not in claims()


def test_release_force_overrides_the_check(start_daemon, sim, procs):
    d = start_daemon(gpus=sim.path)
    shell, child = procs.shell(f"{ORPHAN_SLEEP}; read line")
    ref = claim(shell.pid)
    sim.put(gpu_of(ref), child)

    r = gpuctl("release", "--allocation", ref, "--force")

    assert (r.returncode, r.stderr) == (0, "")
    assert claims() == {}
    assert f"forced release of {ref}" in d.log()


def test_a_foreign_process_does_not_hold_a_release(start_daemon, sim, procs):
    start_daemon(gpus=sim.path)
    ref = claim(procs.sleep().pid)
    sim.put(gpu_of(ref), procs.sleep().pid)

    r = gpuctl("release", "--allocation", ref)

    assert (r.returncode, r.stderr) == (0, "")
    assert claims() == {}


def test_run_waits_for_a_background_child_then_releases_with_a_warning(start_daemon, sim, procs):
    start_daemon(gpus=sim.path)
    t0 = time.monotonic()
    run = subprocess.Popen(
        [sys.executable, "-m", "resourced.cli", "run", "--", "sh", "-c",
         f"{ORPHAN_SLEEP}; read line; exit 3"],
        env={**os.environ, "RESOURCED_RELEASE_WAIT": "1"},
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    child = int(run.stdout.readline())
    procs.track(child)
    [ref] = eventually(lambda: list(claims()))
    sim.put(gpu_of(ref), child)
    eventually(lambda: child in member_pids(ref), timeout=4)

    out, err = run.communicate("\n", timeout=10)

    assert run.returncode == 3
    assert err.startswith("gpuctl: warning: ") and f"pid {child}" in err
    assert "after 1 s; released anyway" in err
    assert claims() == {} and status()["free"] == 4
    assert time.monotonic() - t0 < 20  # the orphan's 30 s were not waited for


def test_run_warns_about_a_background_child_of_a_command_that_exits_at_once(start_daemon, sim,
                                                                            procs, tmp_path):
    start_daemon(gpus=sim.path)
    leave_child = """
import json, os, subprocess, sys
child = subprocess.Popen(["sleep", "30"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
data = json.load(open(sys.argv[1]))
for g in data["gpus"]:
    if g["uuid"] == os.environ["RESOURCED_GPU_UUIDS"]:
        g["processes"] = [{"pid": child.pid}]
open(sys.argv[1] + ".new", "w").write(json.dumps(data))
os.replace(sys.argv[1] + ".new", sys.argv[1])
print(child.pid)
sys.exit(3)
"""
    r = gpuctl("run", "--", sys.executable, "-c", leave_child, str(sim.path),
               env={"RESOURCED_RELEASE_WAIT": "1"})
    procs.track(int(r.stdout))

    assert r.returncode == 3
    assert status()["free"] == 4
    assert f"pid {int(r.stdout)}" in r.stderr  # the warning names the child left behind


# == recovery ===========================================================================


def test_release_force_by_gpu_frees_its_claim_and_logs_the_reason(start_daemon, sim, procs):
    d = start_daemon(gpus=sim.path)
    owner = procs.sleep()
    first, second = claim(owner.pid), claim(owner.pid)
    assert (gpu_of(first), gpu_of(second)) == (0, 1)

    r = gpuctl("release", "--force", "--gpu", "gpu1", "--reason", "agent crashed")

    assert r.returncode == 0 and f"released {second}" in r.stderr
    assert list(claims()) == [first]
    assert re.search(rf"forced release of {second} by uid {os.getuid()}: agent crashed", d.log())


def test_release_by_gpu_needs_force_and_a_claimed_known_gpu(start_daemon, sim, procs):
    start_daemon(gpus=sim.path)
    ref = claim(procs.sleep().pid)

    no_force = gpuctl("release", "--gpu", "gpu0")
    unclaimed = gpuctl("release", "--force", "--gpu", "gpu2")
    unknown = gpuctl("release", "--force", "--gpu", "gpu9")

    assert no_force.returncode == 2 and "--force" in no_force.stderr
    assert unclaimed.returncode == 6 and "gpu2 is not claimed" in unclaimed.stderr
    assert unknown.returncode == 2 and "gpu9" in unknown.stderr
    for r in (no_force, unclaimed, unknown):
        assert r.stderr.startswith("gpuctl: ") and "Traceback" not in r.stderr
    assert list(claims()) == [ref]


# == dead owners ========================================================================


def test_a_dead_owners_claim_is_released_after_the_grace(start_daemon, sim, procs, tmp_path,
                                                         removed):
    start_daemon(gpus=sim.path, args=settings(tmp_path, dead_owner_grace=1))
    owner = procs.sleep()
    ref = claim(owner.pid)

    owner.kill()
    t0 = time.monotonic()
    assert removed.reason(ref, timeout=30) == "dead-owner"

    assert time.monotonic() - t0 < 30  # after the 1 s grace, not the default 10 minutes
    assert claims() == {} and status()["free"] == 4


def test_a_dead_owners_claim_stays_while_its_process_runs_on_its_gpu(start_daemon, sim, clock,
                                                                    procs, tmp_path, removed):
    d = start_daemon(gpus=sim.path, env={"RESOURCED_SIMULATED_CLOCK": str(clock.path)},
                     args=settings(tmp_path, dead_owner_grace=1))
    owner, child = procs.shell(f"{ORPHAN_SLEEP}; read line")
    ref = claim(owner.pid)
    sim.put(gpu_of(ref), child)
    eventually(lambda: child in member_pids(ref), timeout=4)

    owner.kill()
    owner.wait(5)
    eventually(lambda: claims()[ref]["owner_alive"] is False)
    clock.advance(2)  # past the grace
    swept(sim, clock)
    assert ref in claims(), "released while its process still ran on its GPU"

    sim.put(gpu_of(ref))  # the process left the GPU
    assert removed.reason(ref, timeout=4) == "dead-owner"
    assert claims() == {}
    assert f"released {ref} (dead-owner)" in d.log()


def test_with_no_grace_a_dead_owners_claim_stays_shown_dead(start_daemon, sim, clock, procs,
                                                            tmp_path):
    start_daemon(gpus=sim.path, env={"RESOURCED_SIMULATED_CLOCK": str(clock.path)},
                 args=settings(tmp_path, dead_owner_grace=0))
    owner = procs.sleep()
    ref = claim(owner.pid)

    owner.kill()
    eventually(lambda: claims()[ref]["owner_alive"] is False)
    clock.advance(3600)  # far past any grace
    swept(sim, clock)
    assert ref in claims()

    [row] = [line for line in gpuctl("status").stdout.splitlines() if ref in line]
    assert f"{owner.pid} (DEAD)" in row


# == pid reuse ==========================================================================


def test_a_restored_owner_whose_pid_now_names_another_process_is_dead(start_daemon, sim, procs):
    """The claims log says the owner started at another time than the live process with
    its pid: that process is not the owner (a reused pid), so the owner is dead and the
    process, listed on the claim's GPU, is not the claim's."""
    first = start_daemon(gpus=sim.path)
    owner = procs.sleep()
    dev = claim(owner.pid)
    with Client() as c:
        run = c.claim(mode="run", gpus=1, owner_pid=owner.pid)["allocation"]["ref"]
    assert claims()[dev]["owner_alive"] is True
    first.stop()

    log = first.runtime_dir / "claims.log"
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    for record in lines[1:]:
        if record.get("op") == "grant":
            record["claim"]["owner"]["start_time"] -= 1  # "an earlier process with this pid"
    log.write_text("".join(json.dumps(r) + "\n" for r in lines))
    sim.put(0, owner.pid)

    start_daemon(gpus=sim.path, runtime_dir=first.runtime_dir)

    restored = claims()
    assert owner.poll() is None                   # the pid is alive...
    assert restored[dev]["owner_alive"] is False  # ...but it is not the owner
    assert run not in restored                    # a run claim ends with its owner
    code, data = verify()
    gpu0 = report(data, "gpu0")
    assert (code, gpu0["status"], gpu0["claim"]) == (1, "FOREIGN PROCESS", dev)
    assert gpu0["processes"][0]["claim"] == ""
    r = gpuctl("release", "--allocation", dev)    # not the claim's process: no refusal
    assert (r.returncode, r.stderr) == (0, "")


# == gpuctl init and the configured GPUs =================================================


def without_gpu(text: str, uuid: str) -> str:
    """The config text with the [[gpu]] entry of ``uuid`` (and its comment line) removed."""
    pattern = rf'\n# [^\n]*\n\[\[gpu\]\]\nuuid = "{re.escape(uuid)}"\n(?:[a-z]+ = [^\n]*\n)*'
    new, n = re.subn(pattern, "\n", text)
    assert n == 1, text
    return new


def with_daemon_settings(text: str, **daemon) -> str:
    return text.replace("[daemon]\n", "[daemon]\n" + "".join(
        f"{k} = {v}\n" for k, v in daemon.items()), 1)


def test_init_writes_a_config_that_checks_and_restricts_the_managed_gpus(start_daemon, sim,
                                                                         procs, tmp_path):
    path = tmp_path / "config.toml"
    r = gpuctl("init", "-o", str(path), env={"RESOURCED_SIMULATED_GPUS": str(sim.path)})
    assert r.returncode == 0, r.stderr
    assert "4 GPU(s), simulated backend" in r.stderr

    text = path.read_text()
    assert tomllib.loads(text)["gpu"] == [
        {"uuid": simulated_uuid(i), "alias": f"gpu{i}", "index": i} for i in range(4)]
    check = gpuctl("config", "check", str(path))
    assert (check.returncode, check.stdout.strip()) == (0, f"{path}: ok")

    path.write_text(with_daemon_settings(without_gpu(text, simulated_uuid(2)), probe_timeout=2))
    assert gpuctl("config", "check", str(path)).returncode == 0
    start_daemon(gpus=sim.path, args=["--config", str(path)])
    sim.put(2, procs.sleep().pid)  # on the GPU resourced keeps away from: none of its business

    assert [g["alias"] for g in status()["gpus"]] == ["gpu0", "gpu1", "gpu3"]
    owner = procs.sleep()
    assert gpuctl("claim", "--owner-pid", str(owner.pid), "--gpus", "4").returncode == 3
    ref = claim(owner.pid, gpus=3)
    assert sorted(claims()[ref]["gpu_uuids"]) == [simulated_uuid(i) for i in (0, 1, 3)]
    code, data = verify()
    assert code == 0
    assert [(g["alias"], g["status"]) for g in data["gpus"]] == [
        ("gpu0", "IDLE CLAIM"), ("gpu1", "IDLE CLAIM"), ("gpu3", "IDLE CLAIM")]


def test_a_configured_gpu_the_driver_lacks_is_missing(start_daemon, sim, tmp_path):
    path = tmp_path / "config.toml"
    assert gpuctl("init", "-o", str(path),
                  env={"RESOURCED_SIMULATED_GPUS": str(sim.path)}).returncode == 0
    ghost = "GPU-00000000-dead-4000-8000-000000000099"
    path.write_text(path.read_text() + f'\n[[gpu]]\nuuid = "{ghost}"\nalias = "ghost"\nindex = 9\n')
    assert gpuctl("config", "check", str(path)).returncode == 0
    d = start_daemon(gpus=sim.path, args=["--config", str(path)])

    code, data = verify()

    assert code == 1 and data["problems"] is True
    ghost_report = report(data, "ghost")
    assert {k: ghost_report[k] for k in ("uuid", "index", "status", "claim")} == {
        "uuid": ghost, "index": 9, "status": "MISSING", "claim": ""}
    assert [g["status"] for g in data["gpus"] if g["alias"] != "ghost"] == ["OK"] * 4
    assert f"configured GPU {ghost} is not present" in d.log()
