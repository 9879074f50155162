"""``org.resourced.Check``: one object per configured RAM/disk check, with live figures.

The Manager carries the machine's ``HealthLevel``, the ``Levels`` map and the
``LevelChanged`` signal; these objects carry each check's limits and latest measurement,
and emit PropertiesChanged after every sample in which they moved.
"""

from dbus_fast import PropertyAccess
from dbus_fast.service import dbus_property

from resourced.protocol.names import CHECK_IFACE

from .interface import Interface

R = PropertyAccess.READ
FIGURES = ("Level", "Reason", "FreeBytes", "TotalBytes", "FreePct", "UsedPct")


class CheckInterface(Interface):
    CONST_PROPERTIES = frozenset({"Name", "Type", "Path", "Limits"})

    def __init__(self, state: dict):
        super().__init__(CHECK_IFACE)
        self.state = state  # one of HealthMonitor.states()

    def update(self, state: dict) -> None:
        """Take a new sample; emit PropertiesChanged for the figures that moved."""
        before = {name: getattr(self, name) for name in FIGURES}
        self.state = state
        changed = {name: getattr(self, name) for name in FIGURES}
        changed = {k: v for k, v in changed.items() if before[k] != v}
        if changed:
            self.emit_properties_changed(changed)

    @dbus_property(access=R)
    def Name(self) -> "s":
        return self.state["name"]

    @dbus_property(access=R)
    def Type(self) -> "s":
        return self.state["type"]

    @dbus_property(access=R)
    def Path(self) -> "s":
        return self.state["path"] or ""

    @dbus_property(access=R)
    def Limits(self) -> "a{sd}":
        return {k: float(v) for k, v in self.state["limits"].items()}

    @dbus_property(access=R)
    def Level(self) -> "s":
        return self.state["level"]

    @dbus_property(access=R)
    def Reason(self) -> "s":
        return self.state["reason"] or ""

    @dbus_property(access=R)
    def FreeBytes(self) -> "t":
        return self.state["free_bytes"] or 0

    @dbus_property(access=R)
    def TotalBytes(self) -> "t":
        return self.state["total_bytes"] or 0

    @dbus_property(access=R)
    def FreePct(self) -> "d":
        value = self.state["free_pct"]
        return -1.0 if value is None else float(value)

    @dbus_property(access=R)
    def UsedPct(self) -> "d":
        value = self.state["used_pct"]
        return -1.0 if value is None else float(value)
