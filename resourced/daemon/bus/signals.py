"""The signals the Manager emits: each batch of engine events as signals and
PropertiesChanged, once each, after the reply to the call that caused them; health levels
and figures; a waiter's outcome."""

from dbus_fast import Message

from resourced.core import health as health_levels
from resourced.core.calendar import Notice
from resourced.core.claims import BOOKING
from resourced.core.ledger import (
    ClaimEnding,
    ClaimGranted,
    ClaimQueued,
    ClaimReleased,
    Event,
    MembersChanged,
    OwnerDied,
    ReclaimAsked,
    ReclaimWithdrawn,
    Relabelled,
    StopAsked,
    UntilChanged,
)
from resourced.errors import (
    left_the_queue,
)
from resourced.protocol.names import (
    CLAIM_IFACE,
    MANAGER_PATH,
    claim_path,
)

from ..engine.tracking import GpuUseChanged
from .claim import ClaimInterface
from .connection import changed_values, property_values
from .errors import error_reply

PROPERTIES_IFACE = "org.freedesktop.DBus.Properties"


class Signals:
    """What the Manager says on the bus about changes (see the module)."""

    def __init__(self, manager):
        self.manager = manager

    def calendar(self, items: list) -> list[tuple]:
        """Signals for booking events (on their owner's path) and notices."""
        m = self.manager
        out = []
        for item in items:
            if isinstance(item, Notice):
                out.append((m.NoticeAdded, item.id, item.text))
            else:
                b = item.booking
                out.append((m._user_object(b.uid).BookingChanged, b.id, item.what,
                            m._record(b)))
        return out

    def levels(self, events: list[health_levels.LevelChanged]) -> None:
        m = self.manager
        for e in events:
            m.LevelChanged(e.check, e.old, e.new, e.reason)
        m.emit_properties_changed({"HealthLevel": m.health.health,
                                   "Levels": m.health.levels()})

    def figures(self, states: list[dict]) -> None:
        m = self.manager
        if {s["name"] for s in states} != set(m._checks):
            m._export_checks()
            return
        for state in states:
            m._checks[state["name"]].update(state)

    def claim_added(self, claim) -> None:
        """InterfacesAdded for a new claim, from its record: its object need not exist (an
        interface made without ``__init__`` has the getters and none of dbus-fast's cost).
        Only while an object-manager client is on the bus (``claim_removed``)."""
        m = self.manager
        if not m.managers_watching:
            return
        iface = m._claims.get(claim.id)
        if iface is None:
            iface = ClaimInterface.__new__(ClaimInterface)
            iface.claim, iface.manager = claim, self
        m.bus.interfaces_added(claim_path(claim.id), {CLAIM_IFACE: property_values(iface)})

    def claim_removed(self, claim) -> None:
        """InterfacesRemoved for an ended claim, while an object-manager client is on the
        bus.  Such a client learns the objects with GetManagedObjects first, so until one
        has called it (and while none that did is still connected) a claim's
        InterfacesAdded and InterfacesRemoved would reach nobody who needs them:
        ``ClaimNew`` and ``ClaimRemoved`` say the same to everyone else.  That is two of
        the eight messages of a claim and its release."""
        m = self.manager
        if m.managers_watching:
            m.bus.interfaces_removed(claim_path(claim.id), (CLAIM_IFACE,))

    def publish(self, events: list[Event]) -> None:
        """Signals and PropertiesChanged for a batch of engine events, each once.

        They go out (with the values of now) just after the reply to the call that caused
        them, so the caller is not kept waiting while the bus routes them; but a waiter's
        ``Granted`` or ``Cancelled`` goes at once, in the same write as that reply: a
        waiter served by a release is the next link of a chain of processes taking turns,
        and need not wait behind the other signals and the audit lines.  A claim whose
        signals are due gets its object first (``_claim_object``); the others get theirs
        when a call needs it (``_export_claims_for``)."""
        m = self.manager
        out: list[tuple] = []  # (function, args), in order
        touched_gpus: set[str] = set()
        touched_pools: set[str] = set()
        calendar, claims, counts = [], [], False  # counts: the Manager's totals may change
        for event in events:  # one pass: most batches are a claim's one or two events
            if type(event) in ON_EVENT:
                claims.append(event)
            elif isinstance(event, GpuUseChanged):
                touched_gpus.update(event.gpus)
                counts = True
            else:
                calendar.append(event)  # a BookingEvent or a Notice
        if calendar:
            out += self.calendar(calendar)
        live = m.engine.ledger.claims
        for event in claims:
            claim = event.claim
            m.view.changed(claim.id)  # whatever the event, the record changed
            handler, needs_live_claim = ON_EVENT[type(event)]
            if needs_live_claim and claim.id not in live:
                continue  # it ended in the same batch: no object speaks for it any more
            handler(self, event, out)
            if type(event) in COUNTED:
                counts = True
                if type(event) is not ClaimQueued:  # granted or released
                    touched_gpus.update(claim.gpus)
                    touched_pools.update(name for name, _ in claim.demand.pools)
        for uuid in touched_gpus:
            gpu = m._gpus[uuid]
            out.append((gpu.emit_properties_changed, {
                "State": gpu.State, "ClaimID": gpu.ClaimID, "VRAMUsedBytes": gpu.VRAMUsedBytes}))
        totals = [name for name in touched_pools if m._totals.due_now(name)]
        if counts and m._totals.due_now(MANAGER_PATH):
            totals.append(MANAGER_PATH)
        if totals:
            out.append((self.announce_totals, totals))
        m.engine.after_reply(self._run_all, out)

    # -- what each engine event says on the bus (ON_EVENT) -------------------------------
    def _queued(self, event, out: list) -> None:  # its object is made when a call needs it
        m, claim = self.manager, event.claim
        m._waiting.add(claim.id)
        out.append((self.claim_added, claim))
        out.append((m.ClaimNew, claim.id, claim_path(claim.id)))

    def _granted(self, event, out: list) -> None:
        m, claim = self.manager, event.claim
        if claim.id not in m._waiting:  # granted at once: new to everyone
            out.append((self.claim_added, claim))
            out.append((m.ClaimNew, claim.id, claim_path(claim.id)))
            return
        m._waiting.discard(claim.id)  # a waiter served: from its path, object or not
        self.tell_waiter(claim)  # (now: see publish)
        out.append((m.bus.emit, claim_path(claim.id), PROPERTIES_IFACE, "PropertiesChanged",
                    "sa{sv}as", [CLAIM_IFACE, changed_values(
                        ClaimInterface, {"State": claim.state,
                                         "GPUUUIDs": list(claim.gpus)}), []]))

    def _released(self, event, out: list) -> None:
        m, claim = self.manager, event.claim
        iface = m._claims.pop(claim.id, None)
        if claim.id in m._waiting:  # it left the queue ungranted
            m._waiting.discard(claim.id)
            self.tell_waiter(claim, event.reason)
        if iface is not None:
            out.append((m.bus.unexport, claim_path(claim.id), iface, False))
        out.append((self.claim_removed, claim))
        out.append((m.ClaimRemoved, claim.id, claim_path(claim.id), event.reason))

    def _changed(self, event, out: list) -> None:
        """An event that changes properties of the claim's object (CHANGED says which)."""
        out.append((self.manager._claim_object(event.claim.id).emit_properties_changed,
                    CHANGED[type(event)](event.claim)))

    def _reclaim_asked(self, event, out: list) -> None:
        iface = self.manager._claim_object(event.claim.id)
        out.append((iface.emit_properties_changed, {"ReclaimRequested": True}))
        out.append((iface.reclaim_requested, event.waiter.id, event.waiter.priority))

    def _reclaim_withdrawn(self, event, out: list) -> None:
        iface = self.manager._claim_object(event.claim.id)
        out.append((iface.emit_properties_changed, {"ReclaimRequested": False}))
        out.append((iface.ReclaimWithdrawn,))

    def _stop_asked(self, event, out: list) -> None:
        out.append((self.manager._claim_object(event.claim.id).StopRequested, event.by,
                    event.reason))

    def _ending(self, event, out: list) -> None:
        m, claim = self.manager, event.claim
        out.append((m._claim_object(claim.id).Ending, claim.until_usec, claim.until_booking))
        if claim.mode == BOOKING and claim.id in m.engine.calendar.bookings:
            booking = m.engine.calendar.bookings[claim.id]
            out.append((m._user_object(claim.uid).BookingChanged, claim.id, "ending",
                        m._record(booking)))

    def tell_waiter(self, claim, left: str = "") -> None:
        """A waiting claim's outcome, its grant (or why it ``left`` the queue ungranted):
        the reply to the call that made it with ReplyWhenGranted (with the warnings of
        its claiming, and of its grant until a booking), or else its Granted or Cancelled
        signal, to the connection that made it."""
        m = self.manager
        path = claim_path(claim.id)
        call, warnings = m.held.pop(claim.id)
        if call is None and left:
            m.bus.emit(path, CLAIM_IFACE, "Cancelled", "s", [left], claim.reply_to)
        elif call is None:
            m.bus.emit(path, CLAIM_IFACE, "Granted", "a{sv}", [m.view.grant(claim)],
                       claim.reply_to)
        elif left:
            m.bus.send(error_reply(call, left_the_queue(claim.id, left)))
        else:
            m.bus.send(Message.new_method_return(
                call, "soa{sv}", [claim.id, path, m.view.grant(
                    claim, [*warnings, *m.engine.until_warning(claim)])]))

    def announce_totals(self, keys: list[str]) -> None:
        """PropertiesChanged of the totals ``keys`` name (the Manager's path, pool names),
        with their values now; at most once per key and ``throttle.INTERVAL``."""
        m = self.manager
        with m.bus.batch():
            for key in keys:
                if key == MANAGER_PATH:
                    m.emit_properties_changed({
                        "FreeGPUs": m.engine.tracker.free_count(),
                        "NClaims": len(m.engine.ledger.claims),
                        "NQueued": len(m.engine.ledger.waiting)})
                elif key in m._pools:  # (gone after a reload that removed it)
                    m._pools[key].emit_properties_changed({"Free": m._pools[key].Free})

    @staticmethod
    def _run_all(calls: list[tuple]) -> None:
        """The calls ``_publish`` gathered, in order."""
        for fn, *args in calls:
            fn(*args)


COUNTED = (ClaimQueued, ClaimGranted, ClaimReleased)
"""The events that change the Manager's totals (FreeGPUs, NClaims, NQueued)."""

CHANGED = {
    OwnerDied: lambda claim: {"OwnerAlive": False},
    MembersChanged: lambda claim: {"MemberPIDs": sorted(m.pid for m in claim.members)},
    UntilChanged: lambda claim: {"UntilUSec": claim.until_usec,
                                 "UntilBooking": claim.until_booking},
    Relabelled: lambda claim: {"Label": claim.label},
}
"""The Claim properties each property-only event changes, with their values now."""

ON_EVENT = {  # event: (its handler, whether it speaks only while its claim lives)
    ClaimQueued: (Signals._queued, False),
    ClaimGranted: (Signals._granted, False),
    ClaimReleased: (Signals._released, False),
    OwnerDied: (Signals._changed, True),
    MembersChanged: (Signals._changed, True),
    UntilChanged: (Signals._changed, True),
    Relabelled: (Signals._changed, True),
    ReclaimAsked: (Signals._reclaim_asked, True),
    ReclaimWithdrawn: (Signals._reclaim_withdrawn, True),
    StopAsked: (Signals._stop_asked, True),
    ClaimEnding: (Signals._ending, True),
}
"""Which engine event sends which signals, in one place (* to object-manager clients
alone):

- ClaimQueued, and ClaimGranted at once: InterfacesAdded*, ClaimNew;
- ClaimGranted of a waiter: its kept call's reply or its Granted, then PropertiesChanged
  (State, GPUUUIDs) from its path;
- ClaimReleased: a waiter's error reply or Cancelled; InterfacesRemoved*, ClaimRemoved;
- OwnerDied, MembersChanged, UntilChanged, Relabelled: PropertiesChanged (``CHANGED``);
- ReclaimAsked, ReclaimWithdrawn: PropertiesChanged (ReclaimRequested) and the signal;
- StopAsked: StopRequested; ClaimEnding: Ending, and a booking's BookingChanged "ending".

Each GPU a grant or a release touched then says its State, ClaimID and VRAMUsedBytes,
and the Manager its totals (at most every 50 ms)."""
