"""``org.resourced.Claim``: one object per live claim at /org/resourced/claim/<id>."""

from dbus_fast import PropertyAccess
from dbus_fast.service import dbus_method, dbus_property

from ..core.claims import Claim
from .errors import bus_errors
from .interface import Interface
from .names import CLAIM_IFACE

R = PropertyAccess.READ


class ClaimInterface(Interface):
    OUT_NAMES = {"Release": ("warnings",)}
    CONST_PROPERTIES = frozenset({"Id", "Mode", "UID", "User", "OwnerPID", "OwnerStartTime", "Label", "TaskName", "CreatedUSec", "GPUUUIDs"})

    def __init__(self, claim: Claim, manager):
        super().__init__(CLAIM_IFACE)
        self.claim = claim
        self.manager = manager

    @dbus_method()
    @bus_errors
    async def Release(self, flags: "t") -> "as":
        return await self.manager.release(self.claim.id, flags)

    @dbus_property(access=R)
    def Id(self) -> "s":
        return self.claim.id

    @dbus_property(access=R)
    def Mode(self) -> "s":
        return self.claim.mode

    @dbus_property(access=R)
    def UID(self) -> "u":
        return self.claim.uid

    @dbus_property(access=R)
    def User(self) -> "s":
        return self.claim.user

    @dbus_property(access=R)
    def OwnerPID(self) -> "u":
        return self.claim.owner.pid

    @dbus_property(access=R)
    def OwnerStartTime(self) -> "t":
        return self.claim.owner.start_time

    @dbus_property(access=R)
    def OwnerAlive(self) -> "b":
        return self.claim.owner_alive

    @dbus_property(access=R)
    def Label(self) -> "s":
        return self.claim.label

    @dbus_property(access=R)
    def TaskName(self) -> "s":
        return self.claim.task_name

    @dbus_property(access=R)
    def CreatedUSec(self) -> "t":
        return self.claim.created_usec

    @dbus_property(access=R)
    def GPUUUIDs(self) -> "as":
        return list(self.claim.gpus)

    @dbus_property(access=R)
    def MemberPIDs(self) -> "au":
        """Descendants of the claim's processes, seen while they lived."""
        return sorted(m.pid for m in self.claim.members)
