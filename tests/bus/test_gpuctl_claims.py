"""Development claims through gpuctl: claim, env, run --allocation, release, owners that die."""

import json
import os
import re
import shlex
import subprocess
import sys

import pytest

from resourced.client.sync import Client

from ..conftest import eventually, gpuctl

REF = re.compile(r"^c[a-z0-9]+$")
GPUCTL = f"{shlex.quote(sys.executable)} -m resourced.cli"
SHOW_ENV = 'printf "%s\\n" "$CUDA_VISIBLE_DEVICES" "$CUDA_DEVICE_ORDER" "$RESOURCED_ALLOCATION" "$RESOURCED_GPU_UUIDS"'


def describe() -> dict:
    with Client() as c:
        return c.status()


def claim_record(ref: str) -> dict:
    [record] = [c for c in describe()["claims"] if c["id"] == ref]
    return record


def gpuctl_claim(owner_pid: int, *options: str) -> str:
    r = gpuctl("claim", "--owner-pid", str(owner_pid), *options)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def assert_one_gpuctl_line(stderr: str) -> None:
    lines = stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpuctl: "), stderr
    assert "Traceback" not in stderr


def stat_start_time(pid: int) -> int:
    """Field 22 of /proc/<pid>/stat: the start time in clock ticks after boot."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        data = f.read()
    return int(data[data.rindex(b")") + 2 :].split()[19])


def test_claim_prints_a_reference_and_records_the_claim(daemon, owner):
    r = gpuctl("claim", "--gpus", "2", "--owner-pid", str(owner.pid),
               "--label", "jax-dev", "--task-name", "tune kernels")

    assert (r.returncode, r.stderr) == (0, "")
    assert r.stdout.endswith("\n") and REF.match(r.stdout.strip())
    ref = r.stdout.strip()
    record = claim_record(ref)
    assert {k: record[k] for k in ("mode", "owner_pid", "owner_alive", "label", "task_name")} == {
        "mode": "dev", "owner_pid": owner.pid, "owner_alive": True,
        "label": "jax-dev", "task_name": "tune kernels",
    }
    assert len(record["gpu_uuids"]) == 2
    with Client() as c:
        assert c.free() == 2


def test_env_lines_eval_in_sh_to_the_claims_variables(daemon, owner):
    ref = gpuctl_claim(owner.pid, "--gpus", "2")
    record = claim_record(ref)

    r = subprocess.run(["sh", "-c", f'eval "$({GPUCTL} env --allocation {ref})"; {SHOW_ENV}'],
                       capture_output=True, text=True, timeout=30)

    uuids = ",".join(record["gpu_uuids"])
    assert (r.returncode, r.stderr) == (0, "")
    assert r.stdout.splitlines() == [uuids, "PCI_BUS_ID", ref, uuids]


def test_env_index_gives_pci_indices(daemon, owner):
    ref = gpuctl_claim(owner.pid, "--gpus", "2")
    record = claim_record(ref)

    r = gpuctl("env", "--allocation", ref, "--index", "--json")

    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {
        "CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in record["pci_indices"]),
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "RESOURCED_ALLOCATION": ref,
        "RESOURCED_GPU_UUIDS": ",".join(record["gpu_uuids"]),
    }


def test_run_on_an_allocation_uses_its_gpus_and_keeps_the_claim(daemon, owner):
    ref = gpuctl_claim(owner.pid, "--gpus", "2")
    before = describe()
    uuids = ",".join(claim_record(ref)["gpu_uuids"])

    r = gpuctl("run", "--allocation", ref, "--", "sh", "-c", f"{SHOW_ENV}; exit 5")

    assert r.returncode == 5, r.stderr
    assert r.stdout.splitlines() == [uuids, "PCI_BUS_ID", ref, uuids]
    assert describe() == before


def test_release_frees_the_claim_and_a_second_release_exits_6(daemon, owner):
    ref = gpuctl_claim(owner.pid, "--gpus", "3")

    first = gpuctl("release", "--allocation", ref)
    second = gpuctl("release", "--allocation", ref)

    assert (first.returncode, first.stdout, first.stderr) == (0, "", "")
    assert describe()["claims"] == []
    with Client() as c:
        assert c.free() == 4
    assert second.returncode == 6
    assert_one_gpuctl_line(second.stderr)


@pytest.mark.parametrize("command", ["release", "env"])
def test_unknown_reference_exits_6(daemon, command):
    r = gpuctl(command, "--allocation", "cnosuch")
    assert (r.returncode, r.stdout) == (6, "")
    assert_one_gpuctl_line(r.stderr)


def test_run_on_an_unknown_allocation_exits_6_without_running(daemon, tmp_path):
    marker = tmp_path / "ran"
    r = gpuctl("run", "--allocation", "cnosuch", "--", "touch", str(marker))
    assert r.returncode == 6
    assert_one_gpuctl_line(r.stderr)
    assert not marker.exists()


def test_owner_pid_of_a_nonexistent_process_exits_2_and_changes_nothing(daemon):
    with open("/proc/sys/kernel/pid_max") as f:
        never_a_pid = int(f.read())  # pids are below pid_max
    before = describe()

    r = gpuctl("claim", "--gpus", "1", "--owner-pid", str(never_a_pid))

    assert (r.returncode, r.stdout) == (2, "")
    assert_one_gpuctl_line(r.stderr)
    assert describe() == before


def test_owner_pid_is_required(daemon):
    r = gpuctl("claim", "--gpus", "1")
    assert (r.returncode, r.stdout) == (2, "")
    assert_one_gpuctl_line(r.stderr)
    assert "--owner-pid" in r.stderr
    assert describe()["claims"] == []


@pytest.mark.parametrize("args", [
    ["claim", "--gpus", "1", "--owner-pid", "-5"],
    ["claim", "--gpus", "1", "--owner-pid", "4294967296"],
    ["claim", "--gpus", "4294967296", "--owner-pid", "1"],
    ["run", "--gpus", "4294967296", "--", "true"],
], ids=["negative-pid", "huge-pid", "huge-gpus-claim", "huge-gpus-run"])
def test_out_of_range_numbers_are_usage_errors(daemon, args):
    r = gpuctl(*args)
    assert r.returncode == 2
    assert_one_gpuctl_line(r.stderr)
    assert describe()["claims"] == []


def test_dead_owner_shows_in_status_and_the_claim_stays(daemon, owner):
    ref = gpuctl_claim(owner.pid, "--gpus", "1", "--task-name", "orphaned")

    owner.kill()
    owner.wait(timeout=10)

    eventually(lambda: claim_record(ref)["owner_alive"] is False)
    status = gpuctl("status", "--json")
    human = gpuctl("status")
    assert [(c["id"], c["owner_alive"]) for c in json.loads(status.stdout)["claims"]] == [(ref, False)]
    [row] = [line for line in human.stdout.splitlines() if ref in line]
    assert f"{owner.pid} (DEAD)" in row
    with Client() as c:
        assert c.free() == 3


def test_claim_pins_the_owner_by_start_time(daemon, owner):
    ref = gpuctl_claim(owner.pid, "--gpus", "1")

    out = subprocess.run(
        ["busctl", f"--address={daemon.bus.address}", "--json=short", "get-property",
         "org.resourced", f"/org/resourced/claim/{ref}", "org.resourced.Claim",
         "OwnerPID", "OwnerStartTime"],
        check=True, capture_output=True, text=True, timeout=10,
    ).stdout

    pid, start = (json.loads(line) for line in out.splitlines())
    assert claim_record(ref)["owner_pid"] == owner.pid
    assert pid == {"type": "u", "data": owner.pid}
    assert start == {"type": "t", "data": stat_start_time(owner.pid)}


def test_release_and_init_speak_json_too(daemon, tmp_path):
    ref = gpuctl("claim", "--owner-pid", str(os.getpid())).stdout.strip()
    r = gpuctl("release", "--allocation", ref, "--dry-run", "--json")
    assert (r.returncode, json.loads(r.stdout)) == (
        0, {"schema": 2, "ref": ref, "released": False, "dry_run": True, "warnings": []})
    r = gpuctl("release", "--allocation", ref, "--json")
    assert (r.returncode, json.loads(r.stdout)) == (
        0, {"schema": 2, "ref": ref, "released": True, "dry_run": False, "warnings": []})
    ref = gpuctl("claim", "--owner-pid", str(os.getpid())).stdout.strip()
    r = gpuctl("release", "--gpu", "0", "--force", "--reason", "test", "--json")
    assert (r.returncode, json.loads(r.stdout)) == (
        0, {"schema": 2, "ref": ref, "released": True, "dry_run": False, "warnings": []})

    path = tmp_path / "config.toml"
    r = gpuctl("init", "-o", str(path), "--json", env={"RESOURCED_SIMULATED_GPUS": "2"})
    data = json.loads(r.stdout)
    assert r.returncode == 0 and data["path"] == str(path) and data["backend"] == "simulated"
    assert data["schema"] == 2
    assert [g["index"] for g in data["gpus"]] == [0, 1] and path.exists()


def test_init_to_stdout_prints_the_toml_and_refuses_json():
    env = {"RESOURCED_SIMULATED_GPUS": "2"}
    r = gpuctl("init", "-o", "-", env=env)
    assert r.returncode == 0 and r.stdout.count("\n[[gpu]]\n") == 2, r.stderr
    r = gpuctl("init", "-o", "-", "--json", env=env)
    assert r.returncode == 2 and json.loads(r.stdout)["error"]["code"] == "InvalidArgs"
    assert_one_gpuctl_line(r.stderr)
    assert "-o - prints the TOML itself" in r.stderr


def test_a_gpu_named_by_a_number_says_what_was_granted_and_the_count_option(daemon, owner):
    """claim --gpu 2 is GPU 2, whole: someone who meant --gpus 2 is told, and --gpu 9
    names the GPUs there are."""
    r = gpuctl("claim", "--gpu", "2", "--owner-pid", str(owner.pid))
    assert r.returncode == 0 and r.stdout.strip().startswith("c")
    assert r.stderr == ("gpuctl: granted gpu2 (--gpu names a GPU by alias, index or UUID; "
                        "for a number of GPUs: --gpus 2)\n")
    named = gpuctl("claim", "--gpu", "gpu1", "--owner-pid", str(owner.pid))
    assert named.returncode == 0 and named.stderr == ""  # an alias needs no word
    r = gpuctl("claim", "--gpu", "9", "--owner-pid", str(owner.pid))
    assert r.returncode == 2
    assert "no GPU called '9': the GPUs here are gpu0, gpu1, gpu2, gpu3" in r.stderr
