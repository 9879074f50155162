"""The environment a claimed command runs with: what it was granted, in the usual variables.

``CUDA_VISIBLE_DEVICES`` lists the GPU UUIDs (robust: independent of numbering), or with
``use_index`` the PCI-ordered indices, in which case ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` is
what makes them right.  The order is set either way, and the UUIDs are always exported
separately in ``RESOURCED_GPU_UUIDS``.  A claim without GPUs hides them all
(``CUDA_VISIBLE_DEVICES=``), so a CPU job cannot wander onto someone's GPU.

A VRAM share adds ``RESOURCED_VRAM_BYTES`` (the share, in bytes) and the hints frameworks
read: ``XLA_PYTHON_CLIENT_MEM_FRACTION`` (JAX preallocates that fraction of the GPU) and
``TF_FORCE_GPU_ALLOW_GROWTH=true`` (TensorFlow allocates as it goes instead of taking
the whole GPU).  PyTorch has no such variable: call
``torch.cuda.set_per_process_memory_fraction`` with the same fraction.  Pool amounts are in
``RESOURCED_POOLS`` (``cpu=8,ram=34359738368``); a cpu amount also sets
``OMP_NUM_THREADS`` and ``MKL_NUM_THREADS``.
"""

import math


def claim_env(allocation: dict, use_index: bool = False) -> dict[str, str]:
    uuids = allocation["gpu_uuids"]
    visible = [str(i) for i in allocation["pci_indices"]] if use_index else uuids
    env = {
        "CUDA_VISIBLE_DEVICES": ",".join(visible),
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "RESOURCED_ALLOCATION": allocation["ref"],
        "RESOURCED_GPU_UUIDS": ",".join(uuids),
    }
    vram = allocation.get("vram_bytes", 0)
    if vram and allocation.get("gpu_memory_bytes"):
        env["RESOURCED_VRAM_BYTES"] = str(vram)
        env["XLA_PYTHON_CLIENT_MEM_FRACTION"] = share_fraction(vram,
                                                               allocation["gpu_memory_bytes"][0])
        env["TF_FORCE_GPU_ALLOW_GROWTH"] = "true"
    pools = allocation.get("pools", {})
    if pools:
        env["RESOURCED_POOLS"] = ",".join(f"{name}={amount}" for name, amount in sorted(pools.items()))
    if "cpu" in pools:
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(pools["cpu"])
    return env


def share_fraction(share: int, total: int) -> str:
    """``share / total`` to four significant digits, rounded down (never above the share):
    1.5G of an 80G GPU is ``0.01875``."""
    from fractions import Fraction

    exact = min(Fraction(share, total), Fraction(1))
    if exact == 1:
        return "1.0"
    places = 4
    while exact * 10**places < 1000:  # four significant digits
        places += 1
    digits = math.floor(exact * 10**places)
    return ("0." + str(digits).rjust(places, "0")).rstrip("0")


def container_options(engine: str, allocation: dict, env: dict[str, str]) -> list[str]:
    """``docker run`` or ``podman run`` options for a claim: its GPUs and no others, and its
    variables but CUDA_VISIBLE_DEVICES (the container sees only its GPUs).  Docker names
    the GPUs by UUID (``--gpus "device=..."``: the quotes are docker's, for the commas, and
    ``$(...)`` leaves them in place); Podman by the CDI names ``nvidia-ctk cdi generate``
    gives by default, the NVML index."""
    if not allocation["gpu_uuids"]:
        gpus = []
    elif engine == "docker":
        gpus = ["--gpus", '"device=' + ",".join(allocation["gpu_uuids"]) + '"']
    else:
        gpus = [word for index in allocation["gpu_indices"]
                for word in ("--device", f"nvidia.com/gpu={index}")]
    variables = [word for name, value in env.items() if name != "CUDA_VISIBLE_DEVICES"
                 for word in ("-e", f"{name}={value}")]
    return gpus + variables
