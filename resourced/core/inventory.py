"""The GPUs the daemon manages, as plain facts."""

from dataclasses import dataclass


@dataclass(frozen=True)
class Gpu:
    """One managed GPU. The UUID is authoritative; index and alias are for people."""

    index: int
    uuid: str
    name: str = ""
    memory_bytes: int = 0
    pci_bus_id: str = ""
    alias: str = ""
    minor: int | None = None  # of its device node, /dev/nvidia<minor>; None: unknown

    @property
    def label(self) -> str:
        """What people call it: the alias, else ``gpu<index>``."""
        return self.alias or f"gpu{self.index}"


def pci_order(gpus: list[Gpu]) -> dict[str, int]:
    """UUID -> index in PCI bus order, as CUDA numbers devices with CUDA_DEVICE_ORDER=PCI_BUS_ID."""
    ordered = sorted(gpus, key=lambda g: (g.pci_bus_id.lower() or "~", g.index))
    return {g.uuid: i for i, g in enumerate(ordered)}
