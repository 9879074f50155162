"""Bookings on the bus: requests and filters from ``a{sv}``, records as ``a{sv}``, and the
per-user object whose signals tell a user about their bookings.

Bookings are records behind Manager methods, not an object each: 10,000 bookings must not
cost 10,000 exports, nor make ``busctl tree`` unusable.  Signals about a user's bookings
go out from ``/org/resourced/user/<uid>`` (``org.resourced.User``), so a client that
listens for its own user's is not woken for everyone else's.
"""

from dbus_fast import Variant
from dbus_fast.service import dbus_signal

from ..core.calendar import Blackout, Booking, BookingRequest, Notice
from ..core.claims import Demand
from ..errors import InvalidRequest
from .interface import Interface
from .names import USER_IFACE
from .options import parse_options

BOOK_OPTIONS = {
    "GPUs": "u", "GPUNames": "as", "Exclude": "as", "VRAMBytes": "t", "Pools": "a{st}",
    "DurationUSec": "t", "StartUSec": "t", "Earliest": "b", "Exclusive": "b",
    "OpID": "s", "Label": "s", "TaskName": "s",
}
"""``Book``, ``EditBooking`` and ``FindSlots`` options.  No ``StartUSec`` (or
``Earliest``): the earliest start that fits."""
CHANGE_OPTIONS = {"OpID": "s"}
"""``CancelBooking`` options: OpID makes it retry-safe too."""
END_OPTIONS = {"OpID": "s", "ByUSec": "t"}
"""``SetBookingEnd`` options: ByUSec extends by that much past the end it has."""
LIST_OPTIONS = {"All": "b", "SinceUSec": "t", "UntilUSec": "t", "Offset": "u", "Limit": "u"}
MAX_PAGE = 10_000
MAX_SLOTS = 20


def booking_request(options: dict, gpu_uuid, base: Booking | None = None) -> tuple[BookingRequest, str]:
    """The request the options describe (over ``base``'s, for an edit) and the op id;
    ``gpu_uuid`` resolves a GPU's name (alias, index, UUID) to its UUID."""
    opts = parse_options(options, BOOK_OPTIONS)
    old = base.request if base is not None else None
    named = tuple(gpu_uuid(n) for n in opts["GPUNames"]) if "GPUNames" in opts else (
        old.named if old else ())
    excluded = tuple(gpu_uuid(n) for n in opts["Exclude"]) if "Exclude" in opts else (
        old.excluded if old else ())
    if "GPUNames" in opts and len(set(named)) != len(named):
        raise InvalidRequest("a GPU is named twice")
    gpus = opts.get("GPUs", len(named) if "GPUNames" in opts else old.demand.gpus if old else 0)
    vram = opts.get("VRAMBytes", old.demand.vram if old else 0)
    if "GPUs" in opts or "GPUNames" in opts:
        vram = opts.get("VRAMBytes", 0)
    elif "VRAMBytes" in opts:
        gpus = 0
    pools = opts["Pools"] if "Pools" in opts else dict(old.demand.pools if old else ())
    if "DurationUSec" not in opts and old is None:
        raise InvalidRequest("a booking needs a duration (DurationUSec)")
    start = opts.get("StartUSec", base.start_usec if base is not None else None)
    if opts.get("Earliest"):
        start = None
    request = BookingRequest(
        demand=Demand.of(gpus, vram, pools),
        duration_usec=opts.get("DurationUSec", old.duration_usec if old else 0),
        start_usec=start, named=named, excluded=excluded,
        exclusive=opts.get("Exclusive", old.exclusive if old else False),
        label=opts.get("Label", old.label if old else ""),
        task_name=opts.get("TaskName", old.task_name if old else ""))
    return request, opts.get("OpID", "")


def list_filter(options: dict) -> dict:
    opts = parse_options(options, LIST_OPTIONS)
    if opts.get("Limit", 1) == 0 or opts.get("Limit", 0) > MAX_PAGE:
        raise InvalidRequest(f"Limit must be from 1 to {MAX_PAGE}")
    return opts


def booking_record(b: Booking, gpus: dict, claim=None) -> dict:
    """A booking as a{sv}; ``gpus`` maps UUIDs to the ledger's GPUs; ``claim`` is its
    claim while it is active."""
    d = b.request.demand
    return {
        "Id": Variant("s", b.id),
        "UID": Variant("u", b.uid),
        "User": Variant("s", b.user),
        "State": Variant("s", b.state),
        "StartUSec": Variant("t", b.start_usec),
        "EndUSec": Variant("t", b.end_usec),
        "CreatedUSec": Variant("t", b.created_usec),
        "GPUUUIDs": Variant("as", list(b.gpus)),
        "GPUIndices": Variant("au", [gpus[u].index for u in b.gpus if u in gpus]),
        "GPUs": Variant("u", d.gpus),
        "VRAMBytes": Variant("t", d.vram),
        "Shared": Variant("b", b.share),
        "Exclusive": Variant("b", b.request.exclusive),
        "Pools": Variant("a{st}", dict(d.pools)),
        "Label": Variant("s", b.request.label),
        "TaskName": Variant("s", b.request.task_name),
        "OpID": Variant("s", b.op_id),
        "Ended": Variant("s", b.ended),
        "EndedBy": Variant("i", b.ended_by),
        "EndedUSec": Variant("t", b.ended_usec),
        "Reason": Variant("s", b.reason),
        "ClaimState": Variant("s", claim.state if claim is not None else ""),
    }


def blackout_record(b: Blackout) -> dict:
    return {"Id": Variant("s", b.id), "StartUSec": Variant("t", b.start_usec),
            "EndUSec": Variant("t", b.end_usec), "Reason": Variant("s", b.reason)}


def notice_record(n: Notice) -> dict:
    return {"Id": Variant("s", n.id), "Text": Variant("s", n.text),
            "CreatedUSec": Variant("t", n.created_usec), "UntilUSec": Variant("t", n.until_usec),
            "By": Variant("u", n.by)}


class UserInterface(Interface):
    """``org.resourced.User`` at /org/resourced/user/<uid>: signals about that user's
    bookings."""

    OUT_NAMES = {"BookingChanged": ("booking_id", "what", "booking")}

    def __init__(self):
        super().__init__(USER_IFACE)

    @dbus_signal()
    def BookingChanged(self, booking_id: str, what: str, booking: dict) -> "ssa{sv}":
        """what: created | changed | started | ending | ended | blackout (a blackout now
        covers part of it)."""
        return [booking_id, what, booking]
