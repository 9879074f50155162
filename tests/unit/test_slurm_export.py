"""The Slurm lines from resourced's GPUs and pools (pure: no bus, no daemon)."""

import pytest

from resourced.slurm.export import export, gpu_type, render

GIB = 1024 ** 3
POOLS = [{"name": "cpu", "unit": "count", "capacity": 32, "free": 32},
         {"name": "ram", "unit": "bytes", "capacity": 64 * GIB, "free": 64 * GIB}]


def gpu(index, name):
    return {"index": index, "uuid": f"GPU-{index:04d}", "name": name, "alias": f"gpu{index}"}


@pytest.mark.parametrize("name, expected", [
    ("NVIDIA H100 80GB HBM3", "h100"),
    ("NVIDIA A100-SXM4-40GB", "a100"),
    ("Tesla V100-SXM2-16GB", "v100"),
    ("NVIDIA GeForce RTX 4090", "rtx4090"),
    ("Quadro RTX 8000", "rtx8000"),
    ("NVIDIA L40S", "l40s"),
    ("Tesla T4", "t4"),
    ("Simulated GPU", "simulated"),
    ("NVIDIA", "gpu"),
    ("", "gpu"),
])
def test_gpu_type_from_nvml_name(name, expected):
    assert gpu_type(name) == expected


def test_one_gres_line_per_gpu_in_index_order():
    data = export([gpu(1, "NVIDIA H100 80GB HBM3"), gpu(0, "NVIDIA H100 80GB HBM3")], POOLS, "n1")
    assert data["gres"] == ["Name=gpu Type=h100 File=/dev/nvidia0",
                            "Name=gpu Type=h100 File=/dev/nvidia1"]
    assert data["gpus"] == [
        {"index": 0, "uuid": "GPU-0000", "type": "h100", "file": "/dev/nvidia0"},
        {"index": 1, "uuid": "GPU-0001", "type": "h100", "file": "/dev/nvidia1"}]
    assert data["node"] == "NodeName=n1 CPUs=32 RealMemory=65536 Gres=gpu:h100:2 State=UNKNOWN"
    assert (data["schema"], data["cpus"], data["real_memory_mib"]) == (1, 32, 65536)


def test_mixed_types_are_grouped_in_gres():
    gpus = [gpu(0, "NVIDIA A100-SXM4-40GB"), gpu(1, "NVIDIA H100 80GB HBM3"),
            gpu(2, "NVIDIA A100-SXM4-40GB")]
    assert "Gres=gpu:a100:2,gpu:h100:1 " in export(gpus, POOLS, "n1")["node"]


def test_real_memory_rounds_down_to_mib():
    pools = {"cpu": {"unit": "count", "capacity": 8},
             "ram": {"unit": "bytes", "capacity": 2 * 1024 * 1024 - 1}}
    data = export([], pools, "n1")
    assert data["real_memory_mib"] == 1
    assert data["node"] == "NodeName=n1 CPUs=8 RealMemory=1 State=UNKNOWN"


def test_no_gpus_means_no_gres():
    data = export([], POOLS, "n1")
    assert data["gres"] == [] and data["gpus"] == []
    assert "Gres=" not in data["node"]
    text = render(data)
    assert "nothing for gres.conf" in text and "GresTypes" not in text


def test_no_pools_leaves_cpus_and_memory_out_with_a_comment():
    data = export([gpu(0, "Simulated GPU")], [], "n1")
    assert data["node"] == "NodeName=n1 Gres=gpu:simulated:1 State=UNKNOWN"
    assert (data["cpus"], data["real_memory_mib"]) == (None, None)
    comments = [line for line in render(data).splitlines() if "left out" in line]
    assert len(comments) == 1 and comments[0].startswith("#")
    assert "CPUs and RealMemory" in comments[0]


def test_render_lines_are_config_or_comments():
    text = render(export([gpu(0, "Simulated GPU")], POOLS, "n1"))
    lines = [line for line in text.splitlines() if line]
    assert all(line.startswith(("#", "Name=gpu ", "NodeName=")) for line in lines)
    assert "Name=gpu Type=simulated File=/dev/nvidia0" in lines
    assert any("real device nodes" in line for line in lines)
    assert lines[-1] == "NodeName=n1 CPUs=32 RealMemory=65536 Gres=gpu:simulated:1 State=UNKNOWN"


def test_with_slurm_gpus_configured_only_those_go_to_gres_conf():
    gpus = [gpu(i, "NVIDIA H100 80GB HBM3") | {"slurm": i >= 2} for i in range(4)]
    data = export(gpus, POOLS, "n1")
    assert data["gres"] == ["Name=gpu Type=h100 File=/dev/nvidia2",
                            "Name=gpu Type=h100 File=/dev/nvidia3"]
    assert "Gres=gpu:h100:2" in data["node"]
