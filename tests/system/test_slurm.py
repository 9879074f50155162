"""resourced beside a real Slurm: munged, slurmctld and slurmd on localhost (slurm_cluster),
the daemon of this directory's rig with gpu2 and gpu3 given to Slurm, and
``gpuctl slurm prolog``/``epilog`` as slurm.conf's Prolog= and Epilog=.

Needs the Debian packages slurmctld, slurmd, slurm-client and munge
(scripts/system-deps.sh); required, like the rest of tests/system, when
RESOURCED_TESTS_REQUIRE_SYSTEM=1.
"""

import json
import os
import subprocess
import time

import pytest

from ..conftest import eventually
from . import conftest
from .conftest import REQUIRED, ok, refused
from .slurm_cluster import NODE, SlurmCluster, missing_tools

SLURM_GPUS = (2, 3)
SOON = 2.0  # seconds: a job's claim comes and goes within this
COUNT = conftest.NGPUS  # the rig's simulated GPUs


@pytest.fixture(scope="module")
def slurm(rig):
    """The rig's daemon restarted with [slurm] gpus = gpu2, gpu3 and the simulated GPUs
    read from a file (what "runs" on them), and a Slurm whose prolog and epilog are ours;
    all put back as it was afterwards, also after a failure."""
    missing = missing_tools()
    if missing:
        reason = f"missing {', '.join(missing)} (run scripts/system-deps.sh as root)"
        pytest.fail(reason) if REQUIRED else pytest.skip(reason)
    gpus_file = rig.dir / "gpus.json"
    _show_on_gpus(gpus_file, {})
    config = rig.dir / "config.toml"
    default_config = config.read_text()
    config.write_text('[slurm]\ngpus = ["gpu2", "gpu3"]\n')
    conftest.NGPUS = str(gpus_file)
    cluster = SlurmCluster(SLURM_GPUS, env={"DBUS_SYSTEM_BUS_ADDRESS": rig.address,
                                            "PATH": "/usr/bin:/bin"})
    try:
        _restart_daemon(rig)
        gpuctl = rig.venv / "bin/gpuctl"
        cluster.write_config(prolog=f"exec {gpuctl} slurm prolog",
                             epilog=f"exec {gpuctl} slurm epilog")
        cluster.start()
        cluster.gpus_file = gpus_file
        yield cluster
    finally:
        cluster.stop()
        config.write_text(default_config)
        conftest.NGPUS = COUNT
        _restart_daemon(rig)


def _restart_daemon(rig) -> None:
    rig._stop("resourced")
    for state in ("run", "state"):
        subprocess.run(["rm", "-rf", str(rig.dir / state)], check=True, timeout=30)
    rig._start_daemon()


def _show_on_gpus(path, processes: dict[int, list[int]]) -> None:
    """The simulated driver's view: GPU index -> pids using it."""
    path.write_text(json.dumps({"gpus": [
        {"index": i, "processes": [{"pid": p, "used_memory_mib": 100} for p in processes.get(i, [])]}
        for i in range(COUNT)]}))
    path.chmod(0o644)


def slurm_claims(rig) -> list[dict]:
    view = json.loads(ok(rig.gpuctl(None, "status", "--json", timeout=10)))
    return [c for c in view["claims"] if c["mode"] == "slurm"]


def start_job(slurm, *argv: str) -> subprocess.Popen:
    return slurm.popen("srun", "--gres=gpu:2", "-J", "train.sh", "--", *argv)


def job_ids(slurm) -> list[str]:
    return slurm.run("squeue", "-h", "-o", "%i", timeout=10).stdout.split()


def test_a_job_is_one_slurm_claim_on_its_two_gpus_while_it_runs(rig, slurm, clean_claims):
    marker, finish = slurm.dir / "started", slurm.dir / "finish"
    job = start_job(slurm, "sh", "-c", f"touch {marker}; i=0; while [ ! -e {finish} ] && "
                    "[ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done")
    try:
        eventually(marker.exists, 30, what="the job to start")
        started = time.monotonic()
        [claim] = eventually(lambda: slurm_claims(rig), SOON, what="the job's claim")
        assert time.monotonic() - started < SOON
        [job_id] = job_ids(slurm)
        assert claim["gpu_indices"] == list(SLURM_GPUS)
        # Named once slurmctld has told the prolog's child the job's name.
        eventually(lambda: [c["label"] for c in slurm_claims(rig)] == [f"slurm {job_id} root train.sh"],
                   SOON, what="the job's name on its claim")
        assert (claim["user"], claim["uid"], claim["state"]) == ("root", 0, "granted")
        finish.touch()  # the job ends
        assert job.wait(30) == 0, job.stderr.read()
        ended = time.monotonic()
        eventually(lambda: slurm_claims(rig) == [], SOON, what="the claim to end with the job")
        assert time.monotonic() - ended < SOON
    finally:
        _end(slurm, job)


def test_scancel_ends_the_claim(rig, slurm, clean_claims):
    job = start_job(slurm, "sleep", "60")
    try:
        [claim] = eventually(lambda: slurm_claims(rig), 30, what="the job's claim")
        job_id = claim["label"].split()[1]
        ok(slurm.run("scancel", job_id))
        cancelled = time.monotonic()
        eventually(lambda: slurm_claims(rig) == [], SOON, what="the claim to end at scancel")
        assert time.monotonic() - cancelled < SOON
    finally:
        _end(slurm, job)


def test_our_claims_never_take_slurms_gpus(rig, slurm, clean_claims):
    view = json.loads(ok(rig.gpuctl(None, "status", "--json")))
    assert [g["state"] for g in view["gpus"]] == ["free", "free", "slurm", "slurm"]
    assert "slurm" in ok(rig.gpuctl(None, "status"))
    sleeper = str(rig.sleepers["alice"])
    out = ok(rig.gpuctl("alice", "claim", "--gpus", "2", "--owner-pid", sleeper, "--json"))
    assert sorted(json.loads(out)["allocation"]["gpu_indices"]) == [0, 1]
    refused(rig.gpuctl("alice", "claim", "--gpus", "1", "--owner-pid", sleeper), 3)
    job = start_job(slurm, "sleep", "60")  # Slurm's GPUs are Slurm's still
    try:
        [claim] = eventually(lambda: slurm_claims(rig), 30, what="the job's claim")
        assert claim["gpu_indices"] == list(SLURM_GPUS)
    finally:
        _end(slurm, job)


def test_verify_shows_no_unclaimed_use_for_a_jobs_processes(rig, slurm, clean_claims):
    marker = slurm.dir / "task.pid"
    job = start_job(slurm, "sh", "-c", f"echo $$ > {marker}; exec sleep 60")
    try:
        eventually(lambda: marker.exists() and marker.read_text().strip(), 30, what="the job's task")
        task = int(marker.read_text())
        _show_on_gpus(slurm.gpus_file, {2: [task], 3: [task]})
        [claim] = eventually(lambda: slurm_claims(rig), SOON, what="the job's claim")
        reports = json.loads(ok(rig.gpuctl(None, "verify", "--json")))["gpus"]
        assert "UNCLAIMED USE" not in json.dumps(reports)
        for report in (r for r in reports if r["index"] in SLURM_GPUS):
            assert [p["claim"] for p in report["processes"]] == [claim["id"]], report
    finally:
        _show_on_gpus(slurm.gpus_file, {})
        _end(slurm, job)


def test_the_prolog_without_the_daemon_exits_0_at_once(rig, slurm, clean_claims):
    rig._stop("resourced")
    try:
        env = {**rig.user_env(), "SLURM_JOB_ID": "999", "SLURM_JOB_UID": "0",
               "SLURM_JOB_GPUS": "0,1", "SLURM_CONF": str(slurm.conf)}
        start = time.monotonic()
        cp = subprocess.run([str(rig.venv / "bin/gpuctl"), "slurm", "prolog"], check=False,
                            env=env, capture_output=True, text=True, timeout=10,
                            stdin=subprocess.DEVNULL)
        # sooner than the 5 s a call may wait: the daemon's absence is known at once
        assert cp.returncode == 0 and time.monotonic() - start < 5, cp
        assert "prolog of Slurm job 999" in cp.stderr
        job = slurm.run("srun", "--gres=gpu:2", "--", "true", timeout=30)  # jobs still run
        assert job.returncode == 0, job.stderr
        assert slurm.node_state().startswith("IDLE"), slurm.node_state()  # not drained
    finally:
        _restart_daemon(rig)


def test_gpuctl_slurm_config_is_accepted_by_slurmd(rig, clean_claims):
    lines = ok(rig.gpuctl(None, "slurm", "config")).splitlines()
    node = next(line for line in lines if line.startswith("NodeName="))
    cluster = SlurmCluster(range(4))
    try:
        gres = "\n".join(line.replace("File=/dev/", f"File={cluster.dir}/dev/")
                         for line in lines if line.startswith("Name="))
        assert node.startswith(f"NodeName={NODE} ")
        cluster.write_config(node_line=node, gres_lines=gres)
        check = subprocess.run(["slurmd", "-C", "-f", str(cluster.conf)], check=False,
                               capture_output=True, text=True, timeout=20,
                               env=cluster.client_env())
        assert check.returncode == 0 and check.stdout.startswith(f"NodeName={NODE}"), check
        cluster.start()  # returns once the node is IDLE
        shown = cluster.run("scontrol", "show", "node", NODE, "-o").stdout
        gpus = json.loads(ok(rig.gpuctl(None, "status", "--json")))["gpus"]
        slurms = sum(g["slurm"] for g in gpus) or len(gpus)  # [slurm] gpus, else all
        assert f"Gres=gpu:simulated:{slurms}" in shown, shown
    finally:
        cluster.stop()


def _end(slurm, proc: subprocess.Popen) -> None:
    """Cancel every job (a killed srun would leave its job running, holding the node's
    one CPU), then reap srun."""
    slurm.run("scancel", "--full", "--user=root")
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        proc.wait(10)
    for stream in (proc.stdout, proc.stderr):
        stream.close()
