"""A daemon crash or restart keeps every acknowledged claim, and grants nothing twice."""

import json
import os
import signal
import subprocess
import sys

from resourced.client.sync import Client
from resourced.linux.privatebus import PrivateBus

from ..conftest import eventually

CLAIMER = r"""
import sys
from resourced.client.sync import Client
from resourced.linux.privatebus import PrivateBus
from resourced.errors import ResourcedError
owner, n = int(sys.argv[1]), int(sys.argv[2])
with Client(bus="session", timeout=5) as c:
    for _ in range(n):
        try:
            ref = c.claim(mode="dev", gpus=1, owner_pid=owner)["allocation"]["ref"]
        except ResourcedError:
            break
        print(ref, flush=True)   # printed only once the daemon has replied
"""


def _held(status: dict) -> list[str]:
    return [u for c in status["claims"] for u in c["gpu_uuids"]]


def test_kill_9_during_a_burst_of_claims_loses_no_acknowledged_claim(start_daemon, tmp_path):
    first = start_daemon(gpus="64")
    owner = subprocess.Popen(["sleep", "120"])
    try:
        clients = [
            subprocess.Popen([sys.executable, "-c", CLAIMER, str(owner.pid), "16"],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            for _ in range(4)
        ]
        # Let the burst get going, then crash the daemon in the middle of it.
        eventually(lambda: NClaims() >= 8, timeout=10)
        os.kill(first.proc.pid, signal.SIGKILL)
        first.proc.wait(5)
        acknowledged = set()
        for c in clients:
            out, _ = c.communicate(timeout=30)
            acknowledged.update(out.split())
        assert acknowledged
        assert len(acknowledged) < 64, "the crash must land in the middle of the burst"

        start_daemon(gpus="64", runtime_dir=first.runtime_dir)
        with Client() as c:
            status = c.status()
        present = {cl["id"] for cl in status["claims"]}
        assert acknowledged <= present
        held = _held(status)
        assert len(held) == len(set(held))
        # A fresh claim after the restart takes a GPU nobody holds.
        with Client() as c:
            new = c.claim(mode="dev", gpus=1, owner_pid=owner.pid)["allocation"]
        assert new["gpu_uuids"][0] not in held
    finally:
        owner.kill()
        owner.wait()


def NClaims() -> int:
    try:
        with Client(timeout=2) as c:
            return c.status()["claims"].__len__()
    except Exception:  # noqa: BLE001 - the daemon may be busy starting
        return 0


def test_a_restart_keeps_claims_and_handles_owners_that_died_meanwhile(start_daemon):
    first = start_daemon()
    alive = subprocess.Popen(["sleep", "60"])
    doomed = subprocess.Popen(["sleep", "60"])
    try:
        with Client() as c:
            kept = c.claim(mode="dev", gpus=1, owner_pid=alive.pid)["allocation"]["ref"]
            dead_dev = c.claim(mode="dev", gpus=1, owner_pid=doomed.pid)["allocation"]["ref"]
            run = c.claim(mode="run", gpus=1, owner_pid=doomed.pid)["allocation"]["ref"]
        first.stop()
        doomed.kill()
        doomed.wait()
        start_daemon(runtime_dir=first.runtime_dir)
        with Client() as c:
            claims = {cl["id"]: cl for cl in c.status()["claims"]}
        assert claims[kept]["owner_alive"] is True
        assert claims[dead_dev]["owner_alive"] is False   # shown as dead, kept
        assert run not in claims                          # a run claim ends with its owner
    finally:
        alive.kill()
        doomed.kill()


def test_claims_from_another_boot_are_dropped(start_daemon):
    first = start_daemon()
    owner = subprocess.Popen(["sleep", "60"])
    try:
        with Client() as c:
            c.claim(mode="dev", gpus=1, owner_pid=owner.pid)
        first.stop()
        log = first.runtime_dir / "claims.log"
        lines = log.read_text().splitlines()
        header = json.loads(lines[0])
        header["boot_id"] = "00000000-0000-0000-0000-000000000000"
        log.write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n")
        second = start_daemon(runtime_dir=first.runtime_dir)
        with Client() as c:
            assert c.status()["claims"] == []
        assert "another boot" in second.log()
    finally:
        owner.kill()


def test_a_second_daemon_on_the_same_runtime_directory_refuses_to_start(start_daemon):
    """Even on another bus: two daemons must never share (and overwrite) one claims log."""
    first = start_daemon()
    with PrivateBus() as other:
        second = start_daemon(runtime_dir=first.runtime_dir, wait=False,
                              env={"DBUS_SESSION_BUS_ADDRESS": other.address})
        assert second.proc.wait(10) != 0
    assert "another resourced is using runtime directory" in second.log()
