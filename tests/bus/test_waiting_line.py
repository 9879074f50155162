"""gpuctl run --wait on a terminal says where it stands while queued; --quiet and a pipe
say nothing."""

import contextlib
import os
import select
import subprocess
import sys
import time

import pytest

from resourced.client.sync import Client
from resourced.errors import NoSuchClaim

from ..conftest import eventually


def on_a_terminal(*args: str) -> subprocess.Popen:
    """gpuctl under script(1), so its stderr is a terminal; output on stdout."""
    command = " ".join([sys.executable, "-m", "resourced.cli", *args])
    return subprocess.Popen(["script", "-qfec", command, "/dev/null"], stdout=subprocess.PIPE,
                            stdin=subprocess.DEVNULL)


def read_until(proc: subprocess.Popen, text: bytes, timeout: float = 10) -> bytes:
    seen = b""
    deadline = time.monotonic() + timeout
    while text not in seen and time.monotonic() < deadline:
        if select.select([proc.stdout], [], [], 0.1)[0]:
            chunk = os.read(proc.stdout.fileno(), 4096)
            if not chunk:
                break
            seen += chunk
    return seen


@pytest.fixture
def held(start_daemon):
    """One GPU, held by a claim of this process."""
    start_daemon(gpus=1)
    with Client() as c:
        ref = c.claim(owner_pid=os.getpid(), task_name="busy")["allocation"]["ref"]
    yield ref
    with Client() as c, contextlib.suppress(NoSuchClaim):  # the test may have released it
        c.release(ref, force=True)


def queued() -> bool:
    with Client() as c:
        return bool(c.status()["queue"])


def test_a_waiting_run_shows_its_place_and_who_holds_what_it_waits_for(held):
    proc = on_a_terminal("run", "--wait", "--", "true")
    try:
        seen = read_until(proc, b"held by")
        assert b"waits for 1 GPU(s): 1 of 1 in the queue; held by root (" + held.encode() in seen
        with Client() as c:
            c.release(held, force=True)
        assert proc.wait(10) == 0
    finally:
        proc.kill()


@pytest.mark.parametrize("quiet", [True, False])
def test_quiet_or_not_on_a_terminal_nothing_is_shown(held, quiet):
    if quiet:
        proc = on_a_terminal("run", "--wait", "--quiet", "--", "true")
    else:  # stderr a pipe, not a terminal
        proc = subprocess.Popen([sys.executable, "-m", "resourced.cli", "run", "--wait", "--",
                                 "true"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        eventually(queued)
        time.sleep(0.3)  # proves nothing is drawn while it waits (a terminal's line comes at once)
        with Client() as c:
            c.release(held, force=True)
        out, _ = proc.communicate(timeout=10)
        assert proc.returncode == 0 and b"waits for" not in out
    finally:
        proc.kill()
