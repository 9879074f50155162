"""The environment a claimed command runs with: what it was granted, in the usual variables.

``CUDA_VISIBLE_DEVICES`` lists the GPU UUIDs (robust: independent of numbering), or with
``use_index`` the PCI-ordered indices, in which case ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` is
what makes them right.  The order is set either way, and the UUIDs are always exported
separately in ``RESOURCED_GPU_UUIDS``.
"""


def claim_env(allocation: dict, use_index: bool = False) -> dict[str, str]:
    uuids = allocation["gpu_uuids"]
    visible = [str(i) for i in allocation["pci_indices"]] if use_index else uuids
    return {
        "CUDA_VISIBLE_DEVICES": ",".join(visible),
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "RESOURCED_ALLOCATION": allocation["ref"],
        "RESOURCED_GPU_UUIDS": ",".join(uuids),
    }
