"""``org.resourced.Pool``: one object per quantity pool at /org/resourced/pool/<name>."""

from dbus_fast import PropertyAccess
from dbus_fast.service import dbus_property

from resourced.core.pools import Pool
from resourced.protocol.names import POOL_IFACE

from .interface import Interface

R = PropertyAccess.READ


class PoolInterface(Interface):
    CONST_PROPERTIES = frozenset({"Name", "Unit", "Capacity"})

    def __init__(self, pool: Pool, ledger):
        super().__init__(POOL_IFACE)
        self.pool = pool
        self.ledger = ledger

    @dbus_property(access=R)
    def Name(self) -> "s":
        return self.pool.name

    @dbus_property(access=R)
    def Unit(self) -> "s":
        return self.pool.unit

    @dbus_property(access=R)
    def Capacity(self) -> "t":
        return self.pool.capacity

    @dbus_property(access=R)
    def Free(self) -> "t":
        return self.ledger.pool_free(self.pool.name)
