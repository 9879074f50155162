"""`gpuctl run` end to end: a real daemon on the private bus, gpuctl and its command as processes."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from resourced.client.sync import Client

from ..conftest import eventually, gpuctl

# Prints what the command sees: its pid, its CUDA_/RESOURCED_ variables, and the daemon's
# record of the claim named by RESOURCED_ALLOCATION (asked over the bus from inside).
PROBE = """
import json, os
from resourced.client.sync import Client
with Client() as c:
    claims = {x["id"]: x for x in c.status()["claims"]}
print(json.dumps({
    "pid": os.getpid(),
    "env": {k: v for k, v in os.environ.items() if k.startswith(("CUDA_", "RESOURCED_"))},
    "claim": claims.get(os.environ.get("RESOURCED_ALLOCATION")),
}))
"""

# Writes its pid to DIR/pid once it runs, then lives until DIR/stop appears (20 s at most).
HOLD = """
import os, pathlib, sys, time
d = pathlib.Path(sys.argv[1])
(d / "pid.tmp").write_text(str(os.getpid()))
os.replace(d / "pid.tmp", d / "pid")
deadline = time.monotonic() + 20
while not (d / "stop").exists() and time.monotonic() < deadline:
    time.sleep(0.01)
"""

# Exits 40+n on signal n once its handler is in place (DIR/pid says so); 1 if none came.
TRAP = """
import os, pathlib, signal, sys, time
d = pathlib.Path(sys.argv[1])
signum = int(sys.argv[2])
signal.signal(signum, lambda *_: sys.exit(40 + signum))
(d / "pid.tmp").write_text(str(os.getpid()))
os.replace(d / "pid.tmp", d / "pid")
deadline = time.monotonic() + 20
while time.monotonic() < deadline:
    time.sleep(0.01)
sys.exit(1)
"""


def signal_name(signum) -> str:
    return signal.Signals(signum).name


def describe() -> dict:
    with Client() as c:
        return c.status()


def run_probe(*options: str) -> tuple[subprocess.CompletedProcess, dict]:
    r = gpuctl("run", *options, "--", sys.executable, "-c", PROBE)
    assert r.returncode == 0, r.stderr
    return r, json.loads(r.stdout)


def spawn_gpuctl(*args: str, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "resourced.cli", *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, **kwargs)


def read_pid(directory) -> int:
    path = directory / "pid"
    return int(eventually(lambda: path.exists() and path.read_text(), timeout=10))


def process_gone(pid: int) -> bool:
    """Exited: no /proc entry, or a zombie nobody has reaped yet."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state in (b"Z", b"X")


def no_claims() -> bool:
    return describe()["claims"] == []


def assert_one_gpuctl_line(stderr: str) -> None:
    lines = stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpuctl: "), stderr
    assert "Traceback" not in stderr


def test_command_sees_its_claim_in_the_environment(daemon):
    all_uuids = {g["uuid"] for g in describe()["gpus"]}

    _, seen = run_probe("--gpus", "2")

    env, claim = seen["env"], seen["claim"]
    uuids = env["CUDA_VISIBLE_DEVICES"].split(",")
    assert len(set(uuids)) == 2 and set(uuids) <= all_uuids
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert env["RESOURCED_GPU_UUIDS"] == env["CUDA_VISIBLE_DEVICES"]
    assert claim["id"] == env["RESOURCED_ALLOCATION"]
    assert (claim["mode"], claim["gpu_uuids"], claim["owner_pid"]) == ("run", uuids, seen["pid"])
    eventually(no_claims)


def test_index_gives_pci_ordered_indices(start_daemon, tmp_path):
    # NVML index order 0..3, PCI bus order 2, 1, 0, 3: the two numberings disagree.
    buses = ["00000000:81:00.0", "00000000:41:00.0", "00000000:01:00.0", "00000000:C1:00.0"]
    gpus = [{"index": i, "uuid": f"GPU-0000000{i}-aaaa-4bbb-8ccc-dddddddddddd", "pci_bus_id": b}
            for i, b in enumerate(buses)]
    sim = tmp_path / "gpus.json"
    sim.write_text(json.dumps({"gpus": gpus}))
    start_daemon(gpus=str(sim))
    pci_rank = {g["uuid"]: rank for rank, g in enumerate(sorted(gpus, key=lambda g: g["pci_bus_id"].lower()))}
    nvml_index = {g["uuid"]: g["index"] for g in gpus}

    _, seen = run_probe("--gpus", "4", "--index")

    env = seen["env"]
    uuids = env["RESOURCED_GPU_UUIDS"].split(",")
    visible = [int(i) for i in env["CUDA_VISIBLE_DEVICES"].split(",")]
    assert sorted(uuids) == sorted(nvml_index)
    assert visible == [pci_rank[u] for u in uuids]
    assert visible != [nvml_index[u] for u in uuids]
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert env["RESOURCED_ALLOCATION"] == seen["claim"]["id"]


@pytest.mark.parametrize("code", [0, 7, 255])
def test_returns_the_commands_exit_code(daemon, code):
    r = gpuctl("run", "--", "sh", "-c", f"exit {code}")
    assert (r.returncode, r.stderr) == (code, "")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL, signal.SIGUSR1], ids=signal_name)
def test_command_killed_by_a_signal_gives_128_plus_n(daemon, signum):
    r = gpuctl("run", "--", sys.executable, "-c", f"import os; os.kill(os.getpid(), {int(signum)})")
    assert r.returncode == 128 + signum, r.stderr


def test_gpus_are_free_again_after_the_command(daemon):
    r = gpuctl("run", "--gpus", "3", "--", "true")
    assert r.returncode == 0, r.stderr
    eventually(no_claims)
    with Client() as c:
        assert c.free() == 4
    assert {g["state"] for g in describe()["gpus"]} == {"free"}


def test_not_enough_gpus_exits_3_at_once_and_grants_nothing(daemon, tmp_path):
    with Client() as c:
        c.claim(mode="dev", gpus=2, owner_pid=os.getpid(), task_name="held")
    before = describe()
    marker = tmp_path / "ran"

    started = time.monotonic()
    r = gpuctl("run", "--gpus", "3", "--", "touch", str(marker))
    elapsed = time.monotonic() - started

    assert r.returncode == 3
    assert_one_gpuctl_line(r.stderr)
    assert "3 GPU(s) requested, 2 free" in r.stderr
    assert elapsed < 10  # refused, never queued
    assert not marker.exists()
    assert describe() == before


@pytest.mark.parametrize("args", [["--gpus", "0"], ["--gpus", "-1"], ["--gpus", "two"], ["--bogus"]],
                         ids=["zero", "negative", "not-a-number", "unknown-option"])
def test_bad_usage_exits_2_with_one_line(daemon, tmp_path, args):
    marker = tmp_path / "ran"

    r = gpuctl("run", *args, "--", "touch", str(marker))

    assert (r.returncode, r.stdout) == (2, "")
    assert_one_gpuctl_line(r.stderr)
    assert not marker.exists()
    assert no_claims()


def test_both_gpus_and_allocation_is_bad_usage(daemon):
    with Client() as c:
        ref = c.claim(mode="dev", gpus=1, owner_pid=os.getpid())["allocation"]["ref"]
    before = describe()

    r = gpuctl("run", "--gpus", "1", "--allocation", ref, "--", "true")

    assert r.returncode == 2
    assert_one_gpuctl_line(r.stderr)
    assert describe() == before


@pytest.mark.parametrize("where", ["path", "PATH"])
def test_nonexistent_command_gives_127_and_frees_the_gpus(daemon, tmp_path, where):
    command = str(tmp_path / "no-such-command") if where == "path" else "no-such-command-x9q"

    r = gpuctl("run", "--gpus", "2", "--", command)

    assert r.returncode == 127
    assert_one_gpuctl_line(r.stderr)
    assert "cannot run" in r.stderr
    eventually(no_claims)


def test_a_command_that_cannot_be_executed_gives_126(daemon, tmp_path):
    script = tmp_path / "not-executable"
    script.write_text("#!/bin/sh\nexit 0\n")

    r = gpuctl("run", "--", str(script))

    assert r.returncode == 126
    assert_one_gpuctl_line(r.stderr)
    eventually(no_claims)


def test_sigkill_of_gpuctl_leaves_the_claim_with_the_command(daemon, tmp_path):
    wrapper = spawn_gpuctl("run", "--gpus", "1", "--", sys.executable, "-c", HOLD, str(tmp_path))
    try:
        pid = read_pid(tmp_path)
        [claim] = describe()["claims"]
        assert (claim["mode"], claim["owner_pid"]) == ("run", pid)

        wrapper.kill()
        wrapper.wait(timeout=10)

        assert not process_gone(pid)
        assert describe()["claims"] == [claim]
    finally:
        (tmp_path / "stop").touch()
    eventually(lambda: process_gone(pid))
    eventually(no_claims)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT], ids=signal_name)
def test_signals_to_gpuctl_reach_the_command(daemon, tmp_path, signum):
    wrapper = spawn_gpuctl("run", "--", sys.executable, "-c", TRAP, str(tmp_path), str(int(signum)))
    try:
        read_pid(tmp_path)
        wrapper.send_signal(signum)
        assert wrapper.wait(timeout=10) == 40 + signum
    finally:
        if wrapper.poll() is None:
            wrapper.kill()
            wrapper.wait(timeout=10)
    eventually(no_claims)


def test_concurrent_runs_get_distinct_gpus_or_exit_3(daemon, tmp_path):
    # Each command records its GPU, then holds it until told to stop, so the winners
    # overlap for certain and exactly four can win.
    hold = ('echo "$CUDA_VISIBLE_DEVICES" > "$1"; i=0; '
            'while [ ! -e "$2" ] && [ $i -lt 400 ]; do sleep 0.05; i=$((i+1)); done')
    stop = tmp_path / "stop"
    records = [tmp_path / f"gpu{i}" for i in range(6)]
    runs = [spawn_gpuctl("run", "--gpus", "1", "--", "sh", "-c", hold, "sh", str(rec), str(stop))
            for rec in records]
    try:
        eventually(lambda: all(p.poll() is not None or rec.exists() for p, rec in zip(runs, records)),
                   timeout=20)
    finally:
        stop.touch()
    codes = [p.wait(timeout=20) for p in runs]

    winners = [rec.read_text().strip() for rec, code in zip(records, codes) if code == 0]
    assert sorted(codes) == [0, 0, 0, 0, 3, 3]
    assert sorted(winners) == sorted(g["uuid"] for g in describe()["gpus"])
    for p, rec, code in zip(runs, records, codes):
        if code == 3:
            assert not rec.exists()
            assert_one_gpuctl_line(p.stderr.read())
        p.stderr.close()
    eventually(no_claims)


def test_one_off_runs_never_use_a_development_claims_gpus(daemon):
    with Client() as c:
        dev = c.claim(mode="dev", gpus=2, owner_pid=os.getpid(), task_name="dev")["allocation"]

    _, seen = run_probe("--gpus", "2")
    too_many = gpuctl("run", "--gpus", "3", "--", "true")

    assert not set(seen["env"]["CUDA_VISIBLE_DEVICES"].split(",")) & set(dev["gpu_uuids"])
    assert too_many.returncode == 3
    eventually(lambda: [c["id"] for c in describe()["claims"]] == [dev["ref"]])
