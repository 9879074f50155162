"""`gpuctl status` and `gpuctl free`: the JSON fields, the human table, and a GPU-less daemon."""

import json
import os
import pwd
import re
import subprocess
import sys
import time

import pytest

from resourced.client.sync import Client

from ..conftest import documentation, gpuctl

GPU_FIELDS = {"index", "alias", "uuid", "name", "state", "claim"}
CLAIM_FIELDS = {"id", "mode", "user", "uid", "owner_pid", "owner_alive", "label", "task_name",
                "created_usec", "gpus"}

# Stands in for nvidia-ml-py on a machine that has it and a driver: NVML never initialises.
NO_NVML = '''
class NVMLError(Exception):
    pass


def nvmlInit():
    raise NVMLError("NVML Shared Library Not Found (test stub)")
'''


def status_json() -> dict:
    r = gpuctl("status", "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_status_json_lists_every_gpu_and_claim(daemon, owner):
    before_usec = time.time_ns() // 1000
    with Client() as c:
        ref = c.claim(mode="dev", gpus=2, owner_pid=owner.pid, label="jax-dev",
                      task_name="tune kernels")["allocation"]["ref"]
    after_usec = time.time_ns() // 1000

    data = status_json()

    assert (data["free"], data["backend"], data["backend_note"]) == (2, "simulated", "")
    gpus = data["gpus"]
    assert all(GPU_FIELDS <= set(g) for g in gpus)
    assert [(g["index"], g["alias"]) for g in gpus] == [(i, f"gpu{i}") for i in range(4)]
    assert len({g["uuid"] for g in gpus}) == 4 and all(g["uuid"].startswith("GPU-") for g in gpus)
    assert all(g["name"] for g in gpus)
    held = [g for g in gpus if g["claim"]]
    assert [(g["state"], g["claim"]) for g in held] == [("claimed", ref)] * 2
    assert {(g["state"], g["claim"]) for g in gpus if g not in held} == {("free", "")}

    [claim] = data["claims"]
    assert CLAIM_FIELDS <= set(claim)
    assert {k: claim[k] for k in CLAIM_FIELDS - {"created_usec"}} == {
        "id": ref, "mode": "dev", "user": pwd.getpwuid(os.getuid()).pw_name, "uid": os.getuid(),
        "owner_pid": owner.pid, "owner_alive": True, "label": "jax-dev",
        "task_name": "tune kernels", "gpus": [g["alias"] for g in held],
    }
    assert before_usec <= claim["created_usec"] <= after_usec


def test_free_json_and_text_agree_with_status(daemon, owner):
    with Client() as c:
        c.claim(mode="dev", gpus=3, owner_pid=owner.pid)

    as_json = gpuctl("free", "--json")
    as_text = gpuctl("free")

    assert json.loads(as_json.stdout) == {"schema": 2, "free": 1}
    assert status_json()["free"] == 1
    assert (as_text.returncode, as_text.stdout) == (0, "1\n")


def documented_status_keys() -> tuple[set[str], ...]:
    """The keys the documentation promises for status --json: its own, each GPU's, each
    pool's and each claim's."""
    text = " ".join(documentation().split())
    found = re.search(r"`status --json` has the keys (.*?); each GPU (.*?); each pool (.*?);"
                      r" and each claim (.*?) \(", text)
    assert found, "the documentation no longer gives status's keys"
    return tuple(set(re.findall(r"`(\w+)`", part)) for part in found.groups())


def test_status_json_has_exactly_the_documented_keys(daemon, owner):
    with Client() as c:
        c.claim(mode="dev", gpus=1, owner_pid=owner.pid, cpu=1)

    data = status_json()

    top, gpu, pool, claim = documented_status_keys()
    assert set(data) == top and data["schema"] == 2
    assert all(set(g) == gpu for g in data["gpus"]) and data["gpus"]
    assert all(set(p) == pool for p in data["pools"]) and data["pools"]
    assert [set(c) for c in data["claims"]] == [claim]


def test_resources_json_says_its_schema(daemon):
    r = gpuctl("resources", "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert (data["schema"], data["source"]) == (2, "daemon")


def test_human_status_shows_claim_task_label_user_and_age(daemon, owner):
    with Client() as c:
        ref = c.claim(mode="dev", gpus=1, owner_pid=owner.pid, label="jax-dev",
                      task_name="tune kernels")["allocation"]["ref"]
    user = pwd.getpwuid(os.getuid()).pw_name

    r = gpuctl("status")

    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split() == ["GPU", "NAME", "STATE", "CLAIM", "MODE", "USER", "AGE", "OWNER",
                                "TASK", "LABEL"]
    [row] = [line for line in lines if ref in line]
    assert re.search(
        rf"^gpu0 .* claimed +{ref} +dev +{re.escape(user)} +\d+[smhd] +{owner.pid} \(alive\) +"
        r"tune kernels +jax-dev$", row), row
    assert len([line for line in lines if re.match(r"^gpu\d .* free +-$", line)]) == 3
    assert "3 of 4 GPU(s) free (simulated backend)" in lines
    assert lines[-3].split()[:4] == ["POOL", "CAPACITY", "USED", "FREE"]  # then cpu, ram


def _assert_gpu_less(note_contains: str) -> None:
    data = status_json()
    assert (data["gpus"], data["claims"], data["free"], data["backend"]) == ([], [], 0, "none")
    assert note_contains in data["backend_note"]
    assert "RESOURCED_SIMULATED_GPUS" in data["backend_note"]
    human = gpuctl("status")
    assert human.returncode == 0, human.stderr
    lines = human.stdout.splitlines()
    at = lines.index("0 of 0 GPU(s) free (none backend)")
    assert lines[at + 1] == f"note: {data['backend_note']}"
    refused = gpuctl("claim", "--gpus", "1", "--owner-pid", str(os.getpid()))
    assert refused.returncode == 3, refused.stderr


def test_without_simulation_or_nvml_the_daemon_serves_no_gpus_and_says_why(start_daemon, tmp_path):
    (tmp_path / "stub").mkdir()
    (tmp_path / "stub" / "pynvml.py").write_text(NO_NVML)
    path = os.pathsep.join(filter(None, [str(tmp_path / "stub"), os.environ.get("PYTHONPATH")]))

    start_daemon(gpus="", env={"PYTHONPATH": path})

    _assert_gpu_less("test stub")


def test_on_this_machine_without_nvml_the_daemon_serves_no_gpus(start_daemon):
    probe = subprocess.run([sys.executable, "-c", "import pynvml; pynvml.nvmlInit()"],
                           capture_output=True, timeout=30)
    if probe.returncode == 0:
        pytest.skip("NVML initialises on this machine")

    start_daemon(gpus="")

    _assert_gpu_less("NVML")


def test_status_json_is_one_line_of_sorted_keys_as_every_json_of_gpuctl(daemon, owner):
    """gpuctl passes the daemon's Describe on as it is: it must read as emit_json writes."""
    with Client() as c:
        for gpus in (1, 2):
            c.claim(mode="dev", gpus=gpus, owner_pid=owner.pid, label=f"l{gpus}")
    r = gpuctl("status", "--json")
    assert r.returncode == 0, r.stderr
    assert r.stdout == json.dumps(json.loads(r.stdout), sort_keys=True) + "\n"
    assert len(json.loads(r.stdout)["claims"]) == 2
