"""``org.resourced.GPU``: one object per managed GPU at /org/resourced/gpu/<index>."""

from dbus_fast import PropertyAccess
from dbus_fast.service import dbus_property

from resourced.core.inventory import Gpu
from resourced.protocol.names import GPU_IFACE

from .interface import Interface

R = PropertyAccess.READ


class GpuInterface(Interface):
    CONST_PROPERTIES = frozenset({"Index", "UUID", "Name", "Alias", "MemoryBytes", "PCIBusID"})

    def __init__(self, gpu: Gpu, engine):
        super().__init__(GPU_IFACE)
        self.gpu = gpu
        self.engine = engine

    @dbus_property(access=R)
    def Index(self) -> "u":
        return self.gpu.index

    @dbus_property(access=R)
    def UUID(self) -> "s":
        return self.gpu.uuid

    @dbus_property(access=R)
    def Name(self) -> "s":
        return self.gpu.name

    @dbus_property(access=R)
    def Alias(self) -> "s":
        return self.gpu.label

    @dbus_property(access=R)
    def MemoryBytes(self) -> "t":
        return self.gpu.memory_bytes

    @dbus_property(access=R)
    def PCIBusID(self) -> "s":
        return self.gpu.pci_bus_id

    @dbus_property(access=R)
    def State(self) -> "s":
        return self.engine.tracker.gpu_state(self.gpu)

    @dbus_property(access=R)
    def VRAMUsedBytes(self) -> "t":
        """VRAM granted to the claims sharing this GPU (0 unless State is shared)."""
        return self.engine.ledger.vram_used(self.gpu.uuid)

    @dbus_property(access=R)
    def ClaimID(self) -> "s":
        holder = self.engine.ledger.holder(self.gpu.uuid)
        return holder.id if holder else ""
