"""The GPU acceptance script (scripts/gpu-acceptance.sh) on the simulated backend: every
check that can run without a GPU passes, the others say they need one, and without a
driver it checks and changes nothing (exit 77)."""

import json
import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu-acceptance.sh"


def run(tmp_path, *args: str, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([str(SCRIPT), "--report", str(tmp_path / "report.txt"), *args],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env={**os.environ, "PYTHON": sys.executable, **(env or {})})


def test_on_simulated_gpus_every_check_that_needs_no_gpu_passes(tmp_path):
    done = run(tmp_path, "--simulated", "2")
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    statuses = {c["check"]: c["status"] for c in report["checks"]}
    assert {check for check, status in statuses.items() if status == "SKIP"} == {
        "NVML sweep time", "isolation: an --isolate run sees its GPU alone"}
    assert all(c["detail"].startswith("needs a GPU") for c in report["checks"]
               if c["status"] == "SKIP")
    for needed in ("inventory matches nvidia-smi", "gpu0: a run's CUDA process is its claim's",
                   "gpu1: a run's CUDA process is its claim's",
                   "gpu1: a process outside resourced is UNCLAIMED USE",
                   "gpu1: a claim of a busy GPU is refused",
                   "doctor --probe: no check failed",
                   "metrics and status agree with nvidia-smi"):
        assert statuses[needed] == "PASS", (needed, done.stdout)
    assert done.stdout.splitlines()[-2] == "7 passed, 0 failed, 2 skipped (9 checks)"
    assert (tmp_path / "report.txt").read_text().splitlines()[-1] == \
        "7 passed, 0 failed, 2 skipped (9 checks)"


def test_without_a_driver_nothing_is_checked_and_it_exits_77(tmp_path):
    done = run(tmp_path, env={"PATH": "/usr/bin:/bin"})  # no nvidia-smi here
    assert done.returncode == 77, done.stdout + done.stderr
    assert "no NVIDIA driver here" in done.stdout and "nothing was checked" in done.stdout
    assert not (tmp_path / "report.txt").exists()
