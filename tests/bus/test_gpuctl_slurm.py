"""`gpuctl slurm config`: the Slurm lines for a daemon's simulated GPUs and its pools."""

import json
import socket

from resourced.client.sync import Client

from ..conftest import gpuctl

MIB = 1024 * 1024


def pools() -> dict:
    with Client() as c:
        return {p["name"]: p for p in c.status()["pools"]}


def test_text_has_gres_lines_and_the_node_line(daemon):
    r = gpuctl("slurm", "config")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert [line for line in lines if line.startswith("Name=")] == [
        f"Name=gpu Type=simulated File=/dev/nvidia{i}" for i in range(4)]
    p = pools()
    host = socket.gethostname().split(".")[0]
    assert lines[-1] == (f"NodeName={host} CPUs={p['cpu']['capacity']} "
                         f"RealMemory={p['ram']['capacity'] // MIB} "
                         "Gres=gpu:simulated:4 State=UNKNOWN")
    assert any(line.startswith("#") and "real device nodes" in line for line in lines)


def test_json(daemon):
    r = gpuctl("slurm", "config", "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert set(data) == {"schema", "gres", "node", "gpus", "cpus", "real_memory_mib"}
    with Client() as c:
        view = c.status()
    uuids = {g["index"]: g["uuid"] for g in view["gpus"]}
    assert data["schema"] == 1
    assert data["gpus"] == [{"index": i, "uuid": uuids[i], "type": "simulated",
                             "file": f"/dev/nvidia{i}"} for i in range(4)]
    assert data["gres"] == [f"Name=gpu Type=simulated File=/dev/nvidia{i}" for i in range(4)]
    p = {x["name"]: x for x in view["pools"]}
    assert (data["cpus"], data["real_memory_mib"]) == (p["cpu"]["capacity"],
                                                        p["ram"]["capacity"] // MIB)
    assert data["node"].endswith(" Gres=gpu:simulated:4 State=UNKNOWN")


def test_without_a_daemon_it_says_so(private_bus, monkeypatch):
    monkeypatch.setenv("DBUS_SESSION_BUS_ADDRESS", private_bus.address)
    monkeypatch.setenv("RESOURCED_BUS", "session")
    r = gpuctl("slurm", "config")
    assert r.returncode == 5 and r.stderr.startswith("gpuctl: ")
