"""Claims from inside a container's pid namespace, and container processes counted as
their owners': namespaces made by ``unshare --pid --fork --mount-proc``, as a container
runtime makes them (and with ``--user --map-root-user``, as a rootless one does)."""

import json
import os
import shutil
import signal
import subprocess
import sys

import pytest

from ..conftest import eventually, gpuctl
from .test_evidence import sim  # noqa: F401 - the simulated driver, a fixture

GPUCTL = f"{sys.executable} -m resourced.cli"
CONTAINER = ["unshare", "--pid", "--fork", "--mount-proc"]
ROOTLESS = ["unshare", "--user", "--map-root-user", "--pid", "--fork", "--mount-proc"]

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None,
    reason="new pid namespaces need root and util-linux's unshare")


@pytest.fixture
def containers():
    """Start ``unshare ... sh -c SCRIPT``; every one is killed at the end."""
    started: list[subprocess.Popen] = []

    def start(script: str, runtime=CONTAINER, env=None) -> subprocess.Popen:
        p = subprocess.Popen([*runtime, "sh", "-c", script], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True,
                             env={**os.environ, **(env or {})})
        started.append(p)
        return p

    yield start
    for p in started:
        if p.poll() is None:
            p.kill()  # unshare: its child, the namespace's init, goes with a SIGKILL below
        p.wait(10)


def init_of(unshare: subprocess.Popen) -> int:
    """The host pid of the namespace's init (unshare's only child)."""
    def child():
        with open(f"/proc/{unshare.pid}/task/{unshare.pid}/children") as f:
            found = f.read().split()
        return int(found[0]) if found else 0
    return eventually(child, 5, what="the container's init")


def claims() -> list[dict]:
    return json.loads(gpuctl("status", "--json").stdout)["claims"]


def nspid(pid: int) -> list[int]:
    with open(f"/proc/{pid}/status") as f:
        return [int(p) for line in f if line.startswith("NSpid:") for p in line.split()[1:]]


@pytest.mark.parametrize("runtime", [CONTAINER, ROOTLESS], ids=["rootful", "rootless"])
def test_a_claim_with_its_own_pid_inside_is_bound_to_that_process(daemon, containers, runtime):
    box = containers(f"{GPUCTL} claim --owner-pid $$ && echo inner=$$ && sleep 30",
                     runtime=runtime)
    ref = box.stdout.readline().strip()
    assert box.stdout.readline().strip() == "inner=1"  # the shell is pid 1 in there
    host = init_of(box)
    [found] = [c for c in claims() if c["id"] == ref]
    assert found["owner_pid"] == host and found["owner_alive"]
    assert nspid(host)[-1] == 1


def test_a_number_that_names_nothing_in_the_container_is_refused(daemon, containers):
    box = containers(f"{GPUCTL} claim --owner-pid 4242; echo rc=$?")
    out, err = box.communicate(timeout=30)
    assert "rc=2" in out and "owner process 4242 does not exist" in err
    assert claims() == []


def test_gpuctl_run_inside_runs_on_a_claim_that_ends_with_the_container(daemon, containers):
    box = containers(f"exec {GPUCTL} run --gpus 1 -- sh -c "
                     "'echo $CUDA_VISIBLE_DEVICES; echo $RESOURCED_ALLOCATION; sleep 30'")
    uuid, ref = box.stdout.readline().strip(), box.stdout.readline().strip()
    assert uuid.startswith("GPU-")
    [found] = claims()
    assert found["id"] == ref and found["mode"] == "run" and found["gpu_uuids"] == [uuid]
    init = init_of(box)
    assert found["owner_pid"] != init and nspid(found["owner_pid"])[-1] > 1  # the command
    os.kill(init, signal.SIGKILL)  # the container goes, and every process in it
    eventually(lambda: claims() == [], 10, what="the claim to end with the container")


def test_a_process_in_the_container_below_the_claims_owner_is_the_claims(start_daemon, sim,
                                                                           containers):
    start_daemon(gpus=str(sim.path))
    box = containers(f"{GPUCTL} claim --gpus 1 --owner-pid $$ && sleep 30 & wait")
    ref = box.stdout.readline().strip()
    init = init_of(box)
    sleeper = eventually(lambda: _sleep_below(init), 5, what="the sleep inside")
    [claim] = claims()
    assert claim["id"] == ref
    sim.put(claim["gpu_indices"][0], sleeper)
    done = gpuctl("verify", "--json")
    [report] = [r for r in json.loads(done.stdout)["gpus"] if r["claim"] == ref]
    assert report["status"] == "OK", report
    [process] = report["processes"]
    assert process["claim"] == ref and process["ambiguous"] == ""
    assert process["container"] == "a pid namespace of its own"
    text = gpuctl("verify").stdout
    assert f"[claim {ref}]  (in a pid namespace of its own)" in text


def test_a_container_started_for_a_claim_counts_as_its_own(start_daemon, sim, containers,
                                                           owner):
    """Not below the claim's processes (a container engine's daemon starts it), but its
    environment names the claim, as `gpuctl env --docker` hands it on."""
    start_daemon(gpus=str(sim.path))
    ref = gpuctl("claim", "--gpus", "1", "--owner-pid", str(owner.pid)).stdout.strip()
    [claim] = claims()
    for named, status in ((ref, "OK"), ("cnosuch", "FOREIGN PROCESS")):
        box = containers("exec sleep 30", env={"RESOURCED_ALLOCATION": named})
        inside = init_of(box)
        sim.put(claim["gpu_indices"][0], inside)
        [report] = [r for r in json.loads(gpuctl("verify", "--json").stdout)["gpus"]
                    if r["claim"] == ref]
        assert report["status"] == status, report
        process = report["processes"][0]
        if status == "OK":
            assert process["claim"] == ref
        else:
            assert process["claim"] == "" and "namespace" in process["ambiguous"]
        box.kill()
        box.wait(10)


def test_env_prints_the_container_options_of_a_claim(daemon, owner):
    ref = gpuctl("claim", "--gpus", "2", "--owner-pid", str(owner.pid)).stdout.strip()
    [claim] = claims()
    docker = gpuctl("env", "--allocation", ref, "--docker")
    assert docker.returncode == 0
    words = docker.stdout.split()
    assert words[:2] == ["--gpus", '"device=' + ",".join(claim["gpu_uuids"]) + '"']
    assert f"RESOURCED_ALLOCATION={ref}" in words
    assert not any(w.startswith("CUDA_VISIBLE_DEVICES=") for w in words)
    podman = json.loads(gpuctl("env", "--allocation", ref, "--podman", "--json").stdout)
    assert podman[:4] == ["--device", f"nvidia.com/gpu={claim['gpu_indices'][0]}",
                          "--device", f"nvidia.com/gpu={claim['gpu_indices'][1]}"]
    refused = gpuctl("env", "--allocation", ref, "--docker", "--index")
    assert refused.returncode == 2 and "--index does not apply" in refused.stderr


def _sleep_below(init: int) -> int:
    """The host pid of the first ``sleep`` below ``init``."""
    stack = [init]
    while stack:
        pid = stack.pop()
        try:
            with open(f"/proc/{pid}/comm") as f:
                if f.read().strip() == "sleep":
                    return pid
            with open(f"/proc/{pid}/task/{pid}/children") as f:
                stack.extend(int(p) for p in f.read().split())
        except OSError:
            continue
    return 0
