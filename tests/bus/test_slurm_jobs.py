"""Slurm jobs as claims, on a private bus: the prolog's and epilog's calls, the binding to
the job's step daemons (a stand-in titled as slurmd titles them), and [slurm] gpus."""

import json
import os
import shutil
import subprocess
import time

import pytest

from resourced.client.sync import Client
from resourced.daemon.engine.slurm_jobs import STEPD
from resourced.errors import InvalidArgs, NotEnoughGPUs
from resourced.protocol.names import CLAIM_IFACE

from ..conftest import eventually, gpuctl, stop_process


@pytest.fixture
def slurm_daemon(start_daemon, tmp_path):
    """4 simulated GPUs, gpu2 and gpu3 Slurm's; the GPU file shows what runs on them."""
    gpus = tmp_path / "gpus.json"
    gpus.write_text(json.dumps({"gpus": [{"index": i} for i in range(4)]}))
    config = tmp_path / "config.toml"
    config.write_text('[slurm]\ngpus = ["gpu2", "gpu3"]\n')
    return start_daemon(gpus=str(gpus), args=["--config", str(config)])


@pytest.fixture
def stepd(tmp_path):
    """Start a stand-in step daemon of job N: named slurmstepd, titled as slurmd's."""
    binary = tmp_path / STEPD
    shutil.copy("/bin/sleep", binary)
    started = []

    def start(job: str, step: str = "0") -> subprocess.Popen:
        proc = subprocess.Popen([f"slurmstepd: [{job}.{step}]", "60"], executable=binary)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        stop_process(proc)


def claims(kind: str = "slurm") -> list[dict]:
    with Client() as c:
        return [x for x in c.status()["claims"] if x["mode"] == kind]


def members(claim_id: str) -> list[int]:
    """The claim object's MemberPIDs (the processes the daemon bound to it)."""
    with Client() as c:
        return c._send(c._get_property("MemberPIDs", f"/org/resourced/claim/{claim_id}",
                                       CLAIM_IFACE))[0][1]


def hook(which: str, job: str, **env) -> subprocess.CompletedProcess:
    return gpuctl("slurm", which, env={"SLURM_JOB_ID": job, "SLURM_JOB_UID": str(os.getuid()),
                                        "SLURM_JOB_NAME": "train.sh", **env})


@pytest.mark.parametrize("name", ["--version", "--address=unix:path=/tmp/x", "-H x", "-M x"])
def test_a_job_named_like_an_option_is_claimed_as_any_other(slurm_daemon, name):
    """The job's name is the user's to choose, and root's busctl must not read it as an
    option (--version made the prolog call nothing: the GPUs went unclaimed)."""
    r = hook("prolog", "47", SLURM_JOB_GPUS="0", SLURM_JOB_NAME=name)
    assert (r.returncode, r.stderr) == (0, "")
    [claim] = claims()
    assert claim["label"].startswith("slurm 47 ") and claim["label"].endswith(" " + name)
    assert hook("epilog", "47", SLURM_JOB_GPUS="0").returncode == 0
    assert claims() == []


def test_prolog_makes_the_claim_and_epilog_ends_it(slurm_daemon):
    r = hook("prolog", "41", SLURM_JOB_GPUS="0,1")  # Slurm's first two: gpu2, gpu3
    assert (r.returncode, r.stderr) == (0, "")
    [claim] = claims()
    with Client() as c:
        gpus = {g["uuid"]: g["index"] for g in c.status()["gpus"]}
    assert sorted(gpus[u] for u in claim["gpu_uuids"]) == [2, 3]
    assert claim["label"].startswith("slurm 41 ") and claim["label"].endswith(" train.sh")
    assert hook("prolog", "41", SLURM_JOB_GPUS="0,1").returncode == 0  # again: the same one
    assert [c["id"] for c in claims()] == [claim["id"]]
    r = hook("epilog", "41", SLURM_JOB_GPUS="0,1")
    assert (r.returncode, r.stderr) == (0, "")
    assert claims() == []


def test_without_the_jobs_name_the_prolog_does_not_wait_for_slurmctld(slurm_daemon, tmp_path):
    """Slurm 22.05 gives the prolog no SLURM_JOB_NAME: the claim is made at once, and named
    when scontrol answers (here a stand-in that answers once the test lets it)."""
    fake = tmp_path / "bin"
    fake.mkdir()
    scontrol, answer = fake / "scontrol", tmp_path / "answer"
    scontrol.write_text(f'#!/bin/sh\ni=0; while [ ! -e "{answer}" ] && [ $i -lt 400 ]; do '
                        "sleep 0.025; i=$((i+1)); done\n"
                        'echo "JobId=$4 JobName=late.sh UserId=root(0)"\n')
    scontrol.chmod(0o755)
    r = hook("prolog", "44", SLURM_JOB_GPUS="0", SLURM_JOB_NAME="",
             PATH=f"{fake}:{os.environ['PATH']}")
    assert (r.returncode, r.stderr) == (0, "")  # before scontrol answered: no wait for the name
    [claim] = claims()
    assert claim["label"] == f"slurm 44 {claim['user']}"
    answer.touch()
    eventually(lambda: claims()[0]["label"] == f"slurm 44 {claim['user']} late.sh", timeout=5)
    assert hook("epilog", "44").returncode == 0


def test_the_timeline_draws_a_jobs_claim_as_a_slurm_job(slurm_daemon):
    with Client() as c:
        ref = c.claim_job("46", ["0"], name="train.sh")
    shown = gpuctl("timeline", "--width", "80")
    assert shown.returncode == 0, shown.stderr
    [legend] = [line for line in shown.stdout.splitlines() if ref in line]
    assert "slurm job" in legend
    [row] = [line for line in shown.stdout.splitlines() if line.startswith("gpu2")]
    assert set(row.split()[1]) == {"A"}  # held from now to the right edge


def test_claim_ends_with_the_jobs_processes(slurm_daemon, stepd):
    with Client() as c:
        ref = c.claim_job("42", ["gpu2"])
    step = stepd("42")
    eventually(lambda: members(ref) == [step.pid], timeout=3)
    status = gpuctl("verify", "--json")
    assert status.returncode == 0, status.stdout + status.stderr
    step.kill()
    step.wait()
    eventually(lambda: claims() == [], timeout=2)


def test_verify_attributes_the_jobs_gpu_processes(slurm_daemon, stepd, tmp_path):
    with Client() as c:
        c.claim_job("43", ["1"])
    step = stepd("43")
    task = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        # The task is not a child of the step here: it becomes one by the GPU file naming
        # the step itself, which is what the driver would list for a task of its own.
        (tmp_path / "gpus.json").write_text(json.dumps({"gpus": [
            {"index": i, "processes": [{"pid": step.pid, "used_memory_mib": 10}] if i == 3 else []}
            for i in range(4)]}))
        with Client() as c:
            [report] = [r for r in c.verify() if r["index"] == 3]
        assert report["status"] != "UNCLAIMED USE", report
        assert report["processes"][0]["claim"] == claims()[0]["id"]
    finally:
        stop_process(task)


def test_our_claims_never_take_slurms_gpus(slurm_daemon):
    with Client() as c:
        view = c.status()
        assert sorted(g["state"] for g in view["gpus"]) == ["free", "free", "slurm", "slurm"]
        assert view["free"] == 2
        first = c.claim(mode="dev", gpus=2, owner_pid=os.getpid())["allocation"]
        assert sorted(first["gpu_indices"]) == [0, 1]
        with pytest.raises(NotEnoughGPUs):
            c.claim(mode="dev", gpus=1, owner_pid=os.getpid())
        with pytest.raises(NotEnoughGPUs, match="besides the 2 Slurm schedules"):
            c.claim(mode="dev", gpus=3, owner_pid=os.getpid())
        with pytest.raises(NotEnoughGPUs):  # as the claim of 3: more than may be used
            c.book(gpus=3, duration=3600, start="+1h")
        # A job on one of ours (the config does not give it to Slurm) is refused.
        with pytest.raises(NotEnoughGPUs, match=r"\[slurm\] gpus"):
            c.claim_job("44", ["gpu0"])
        with pytest.raises(InvalidArgs, match="gives Slurm 2 GPU"):
            c.claim_job("44", ["2"])
        r = hook("prolog", "44", SLURM_JOB_GPUS="GPU-5e1a7ed0-0000-4000-8000-000000000000")
        assert r.returncode == 0 and "hold some of them" in r.stderr  # logged, exit 0
    assert "gpu0" in gpuctl("status").stdout


def test_prolog_without_a_daemon_exits_0_quickly(tmp_path):
    start = time.monotonic()
    r = gpuctl("slurm", "prolog", env={"SLURM_JOB_ID": "45", "SLURM_JOB_GPUS": "0",
                                       "RESOURCED_BUS": "system",
                                       "DBUS_SYSTEM_BUS_ADDRESS": f"unix:path={tmp_path}/none"})
    # sooner than the 5 s a call may wait for an answer: there was no call to wait for
    assert r.returncode == 0 and time.monotonic() - start < 5
    assert "prolog of Slurm job 45" in r.stderr


def test_hooks_outside_slurm_are_usage_errors():
    for which in ("prolog", "epilog"):
        r = gpuctl("slurm", which, env={"SLURM_JOB_ID": ""})
        assert r.returncode == 2 and r.stderr.startswith("gpuctl: ") and "SLURM_JOB_ID" in r.stderr
