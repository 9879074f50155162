"""The README's first command runs `gpuctl demo`: it must work, alone, and clean up."""

import glob
import os
import re
import select
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

from resourced.evidence.processes import open_pidfd, parent_and_name


@pytest.fixture
def demo_tmp():
    """A temporary folder of the demo's own (TMPDIR), short enough for the bus's socket
    path, so that what it leaves behind is its own and not a demo's running beside it."""
    where = tempfile.mkdtemp(prefix="demo-")
    yield where
    shutil.rmtree(where, ignore_errors=True)


def left_in(where: str) -> list[str]:
    return glob.glob(os.path.join(where, "resourced-demo-*"))


def test_the_demo_runs_its_steps_and_leaves_nothing_behind(demo_tmp):
    r = subprocess.run([sys.executable, "-m", "resourced.cli", "demo"], capture_output=True,
                       text=True, timeout=120, env={**os.environ, "TMPDIR": demo_tmp})
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
    assert left_in(demo_tmp) == []


def test_a_step_that_fails_unexpectedly_fails_the_demo_and_names_it(tmp_path, demo_tmp):
    """A daemon whose methods raise (as every eager method did on Python 3.12.1 and 3.13.0)
    must not give a demo that exits 0: the demo stops at the first such step, names it
    and the command, exits 1, and still cleans up."""
    (tmp_path / "sitecustomize.py").write_text(
        "import resourced.daemon.bus.connection as connection\n"
        "def _start(coro):\n"
        "    coro.close()\n"
        "    raise AttributeError(\"'NoneType' object has no attribute 'is_running'\")\n"
        "connection._start = _start\n")
    env = {**os.environ, "TMPDIR": demo_tmp, "PYTHONPATH": os.pathsep.join(
        [str(tmp_path), *filter(None, [os.environ.get("PYTHONPATH")])])}
    r = subprocess.run([sys.executable, "-m", "resourced.cli", "demo"], capture_output=True,
                       text=True, timeout=120, env=env)
    assert r.returncode == 1, r.stdout + r.stderr
    assert 'gpuctl: demo step "A development claim: ' in r.stderr
    assert "`gpuctl claim --gpus 1 --owner-pid" in r.stderr and "exited 1, not 0" in r.stderr
    assert "AttributeError" in r.stderr           # what the daemon said is shown
    assert "Traceback" not in r.stdout + r.stderr
    assert "Done" not in r.stdout
    assert left_in(demo_tmp) == []


def _commands() -> dict[int, str]:
    found = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    found[int(entry)] = f.read().replace(b"\0", b" ").decode()
            except OSError:
                pass
    return found


def test_a_demo_killed_with_sigkill_leaves_no_bus_and_no_daemon_running():
    """The demo's bus ends with the demo, however it ends, and the daemon with its bus."""
    demo = subprocess.Popen([sys.executable, "-m", "resourced.cli", "demo", "--shell"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, bufsize=0,
                            env={**os.environ, "SHELL": "/bin/sh"})
    try:
        demo.stdin.write('echo "ready $DBUS_SESSION_BUS_ADDRESS,"\n')  # (the daemon is up)
        demo.stdin.flush()
        deadline = time.monotonic() + 60
        seen = ""
        while not re.search(r"ready unix:path=(\S+)/[^/]*?,", seen):
            left = deadline - time.monotonic()
            assert left > 0 and select.select([demo.stdout], [], [], left)[0], seen
            seen += os.read(demo.stdout.fileno(), 65536).decode()
        bus_dir = re.search(r"ready unix:path=(\S+)/[^/]*?,", seen)[1]
        running = _commands()
        bus = [p for p, cmd in running.items()
               if cmd.startswith("dbus-daemon") and f"{bus_dir}/bus.conf" in cmd]
        daemon = [p for p, cmd in running.items() if "resourced.daemon" in cmd
                  and (parent_and_name(p) or (0,))[0] == demo.pid]
        assert len(bus) == len(daemon) == 1, running
        # (pidfds, taken while both run: readable once each has ended, reaped or not)
        ending = [open_pidfd(bus[0]), open_pidfd(daemon[0])]
    finally:
        demo.kill()
        demo.wait(10)
    try:
        deadline = time.monotonic() + 20
        for fd, what in zip(ending, ("the bus", "the daemon")):
            left = max(0.0, deadline - time.monotonic())
            assert select.select([fd], [], [], left)[0], f"{what} outlived the demo by 20 s"
    finally:
        for fd in ending:
            os.close(fd)


def test_the_demo_shell_has_gpuctl_and_keeps_a_booked_command_to_itself(tmp_path, demo_tmp):
    """gpuctl was not on the shell's PATH (nor a python that imports resourced), though
    the README's examples are typed there; and a booked command's job file went into the
    account's real state directory, where the account's own runner, for another daemon,
    took it ("job of ... missed: its booking is gone")."""
    home_state = tmp_path / "state"
    script = ("gpuctl book --gpus 1 --for 1h --at +1h -- true >/dev/null; "
              'python -c "from resourced import Client; print(\'client ok\')"; '
              'echo "jobs: $(ls "$XDG_STATE_HOME/resourced/jobs" | grep -c json)"; exit\n')
    path = os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep)
                           if p != os.path.dirname(sys.executable))  # as a login shell has it
    r = subprocess.run([sys.executable, "-m", "resourced.cli", "demo", "--shell"],
                       input=script, capture_output=True, text=True, timeout=120,
                       env={**os.environ, "SHELL": "/bin/sh", "TMPDIR": demo_tmp,
                            "XDG_STATE_HOME": str(home_state), "PATH": path})
    assert r.returncode == 0, r.stdout + r.stderr
    assert "client ok" in r.stdout, r.stdout + r.stderr
    assert "jobs: 1" in r.stdout, r.stdout + r.stderr  # the demo's own state has it
    assert not (home_state / "resourced" / "jobs").exists()  # the account's has nothing
    assert left_in(demo_tmp) == []
