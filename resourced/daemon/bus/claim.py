"""``org.resourced.Claim``: one object per claim, queued or granted, at /org/resourced/claim/<id>."""

from dbus_fast import PropertyAccess
from dbus_fast.service import dbus_method, dbus_property, dbus_signal

from resourced.core.claims import Claim
from resourced.protocol.names import CLAIM_IFACE

from .errors import bus_errors
from .interface import Interface

R = PropertyAccess.READ


class ClaimInterface(Interface):
    OUT_NAMES = {"Release": ("warnings",), "Granted": ("grant",), "Cancelled": ("reason",),
                 "ReclaimRequested": ("waiter_id", "waiter_priority"),
                 "Ending": ("until_usec", "booking_id"),
                 "StopRequested": ("by_uid", "reason")}
    CONST_PROPERTIES = frozenset({
        "Id", "Mode", "UID", "User", "OwnerPID", "OwnerStartTime", "TaskName",
        "CreatedUSec", "Priority", "Reclaimable", "VRAMBytes", "Pools", "Session", "Isolated",
    })

    def __init__(self, claim: Claim, manager):
        super().__init__(CLAIM_IFACE)
        self.claim = claim
        self.manager = manager

    async def settled(self) -> None:
        await self.manager.settled()

    @dbus_method()
    @bus_errors
    async def Release(self, flags: "t") -> "as":
        return await self.manager.release(self.claim.id, flags)

    # -- signals: a waiter's outcome, and reclaim requests, on the claim's own path ----
    @dbus_signal()
    def Granted(self, grant: dict) -> "a{sv}":
        return grant

    @dbus_signal()
    def Cancelled(self, reason: str) -> "s":
        return reason

    @dbus_signal(name="ReclaimRequested")  # the property of the same name is the flag
    def reclaim_requested(self, waiter_id: str, waiter_priority: int) -> "si":
        return [waiter_id, waiter_priority]

    @dbus_signal()
    def ReclaimWithdrawn(self) -> "":
        return None

    @dbus_signal()
    def Ending(self, until_usec: int, booking_id: str) -> "ts":
        """It must give back what it holds at ``until_usec`` (warn_before ahead): its own
        end, or the start of booking ``booking_id``."""
        return [until_usec, booking_id]

    @dbus_signal()
    def StopRequested(self, by_uid: int, reason: str) -> "us":
        """Its session is being stopped (``gpuctl stop``): it is released right after;
        ``gpuctl run`` forwards this as its reclaim signal, then stops its command."""
        return [by_uid, reason]

    # -- properties --------------------------------------------------------------------
    @dbus_property(access=R)
    def Id(self) -> "s":
        return self.claim.id

    @dbus_property(access=R)
    def Session(self) -> "s":
        return self.claim.session

    @dbus_property(access=R)
    def Mode(self) -> "s":
        return self.claim.mode

    @dbus_property(access=R)
    def State(self) -> "s":
        return self.claim.state

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
    def Priority(self) -> "i":
        return self.claim.priority

    @dbus_property(access=R)
    def Reclaimable(self) -> "b":
        return self.claim.reclaimable

    @dbus_property(access=R)
    def Isolated(self) -> "b":
        """Its processes started through resourced run in a scope that opens its GPUs and
        no others (Manager.Confine)."""
        return self.claim.isolated

    @dbus_property(access=R)
    def ReclaimRequested(self) -> "b":
        """True while the daemon asks this (reclaimable) claim back for a waiter."""
        return bool(self.claim.reclaim_for)

    @dbus_property(access=R)
    def GPUUUIDs(self) -> "as":
        return list(self.claim.gpus)

    @dbus_property(access=R)
    def VRAMBytes(self) -> "t":
        return self.claim.demand.vram

    @dbus_property(access=R)
    def Pools(self) -> "a{st}":
        return dict(self.claim.demand.pools)

    @dbus_property(access=R)
    def UntilUSec(self) -> "t":
        """When it must give back what it holds (0: no end): its end, or a booking's start."""
        return self.claim.until_usec

    @dbus_property(access=R)
    def UntilBooking(self) -> "s":
        """The booking that starts at ``UntilUSec`` ("" when it is the claim's own end)."""
        return self.claim.until_booking

    @dbus_property(access=R)
    def MemberPIDs(self) -> "au":
        """Descendants of the claim's processes, seen while they lived."""
        return sorted(m.pid for m in self.claim.members)

