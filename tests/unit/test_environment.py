"""The environment of a claimed command."""

from resourced.client.environment import claim_env

ALLOCATION = {
    "ref": "c1a2b3c",
    "gpu_uuids": ["GPU-bbbb", "GPU-aaaa"],
    "pci_indices": [3, 1],
}


def test_uuids_by_default():
    assert claim_env(ALLOCATION) == {
        "CUDA_VISIBLE_DEVICES": "GPU-bbbb,GPU-aaaa",
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "RESOURCED_ALLOCATION": "c1a2b3c",
        "RESOURCED_GPU_UUIDS": "GPU-bbbb,GPU-aaaa",
    }


def test_pci_indices_with_use_index():
    assert claim_env(ALLOCATION, use_index=True) == {
        "CUDA_VISIBLE_DEVICES": "3,1",
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "RESOURCED_ALLOCATION": "c1a2b3c",
        "RESOURCED_GPU_UUIDS": "GPU-bbbb,GPU-aaaa",
    }


def test_one_gpu():
    env = claim_env({"ref": "c0", "gpu_uuids": ["GPU-x"], "pci_indices": [0]})
    assert (env["CUDA_VISIBLE_DEVICES"], env["RESOURCED_GPU_UUIDS"]) == ("GPU-x", "GPU-x")
    env = claim_env({"ref": "c0", "gpu_uuids": ["GPU-x"], "pci_indices": [0]}, use_index=True)
    assert env["CUDA_VISIBLE_DEVICES"] == "0"


def test_every_value_is_a_string_and_the_allocation_is_untouched():
    before = {k: list(v) if isinstance(v, list) else v for k, v in ALLOCATION.items()}
    for use_index in (False, True):
        assert all(isinstance(v, str) for v in claim_env(ALLOCATION, use_index).values())
    assert ALLOCATION == before


def test_the_jax_fraction_is_exact_to_four_digits_and_never_above_the_share():
    from resourced.client.environment import share_fraction

    g = 1 << 30
    assert share_fraction(int(1.5 * g), 80 * g) == "0.01875"  # not 0.01: half the share
    assert share_fraction(20 * g, 80 * g) == "0.25"
    assert share_fraction(g, 3 * g) == "0.3333"  # rounded down
    assert float(share_fraction(7 * g, 9 * g)) <= 7 / 9
    assert share_fraction(80 * g, 80 * g) == "1.0"
