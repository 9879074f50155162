"""The README's first command runs `gpuctl demo`: it must work, alone, and clean up."""

import glob
import os
import re
import subprocess
import sys
import tempfile


def test_the_demo_runs_its_steps_and_leaves_nothing_behind():
    demos_before = set(glob.glob(os.path.join(tempfile.gettempdir(), "resourced-demo-*")))
    r = subprocess.run([sys.executable, "-m", "resourced.cli", "demo"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Traceback" not in r.stdout + r.stderr
    out = r.stdout
    assert "exit 3: gpuctl: 3 GPU(s) requested, 1 free" in out       # all or nothing
    ran = re.findall(r"^job \d: exit 0, ran on (\w+) (\w+)$", out, re.M)
    shares = {gpu for gpu, what in ran if what == "32212254720"}
    whole = {gpu for gpu, what in ran if what == "whole"}
    assert len(ran) == 3 and len(shares) == 1 and len(whole) == 1   # two shares, one GPU
    assert not shares & whole
    assert "waiting job: exit 0, big job on 4 GPUs" in out            # the queue served it
    assert out.rstrip().endswith("the private daemon and bus are stopped")
    assert "Done" in out
    assert "4 of 4 GPU(s) free" in out.split("waiting job")[1]
    assert set(glob.glob(os.path.join(tempfile.gettempdir(), "resourced-demo-*"))) <= demos_before


def test_a_step_that_fails_unexpectedly_fails_the_demo_and_names_it(tmp_path):
    """A daemon whose methods raise (as every eager method did on Python 3.12.1 and 3.13.0)
    must not give a demo that exits 0: the demo stops at the first such step, names it
    and the command, exits 1, and still cleans up."""
    (tmp_path / "sitecustomize.py").write_text(
        "import resourced.daemon.bus.connection as connection\n"
        "def _start(coro):\n"
        "    coro.close()\n"
        "    raise AttributeError(\"'NoneType' object has no attribute 'is_running'\")\n"
        "connection._start = _start\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(tmp_path), *filter(None, [os.environ.get("PYTHONPATH")])])}
    demos_before = set(glob.glob(os.path.join(tempfile.gettempdir(), "resourced-demo-*")))
    r = subprocess.run([sys.executable, "-m", "resourced.cli", "demo"], capture_output=True,
                       text=True, timeout=120, env=env)
    assert r.returncode == 1, r.stdout + r.stderr
    assert 'gpuctl: demo step "A development claim: ' in r.stderr
    assert "`gpuctl claim --gpus 1 --owner-pid" in r.stderr and "exited 1, not 0" in r.stderr
    assert "AttributeError" in r.stderr           # what the daemon said is shown
    assert "Traceback" not in r.stdout + r.stderr
    assert "Done" not in r.stdout
    assert set(glob.glob(os.path.join(tempfile.gettempdir(), "resourced-demo-*"))) <= demos_before
