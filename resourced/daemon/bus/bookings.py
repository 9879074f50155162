"""Bookings on the bus: requests and filters from ``a{sv}``, records as ``a{sv}``, and the
per-user object whose signals tell a user about their bookings.

Bookings are records behind Manager methods, not an object each: 10,000 bookings must not
cost 10,000 exports, nor make ``busctl tree`` unusable.  Signals about a user's bookings
go out from ``/org/resourced/user/<uid>`` (``org.resourced.User``), so a client that
listens for its own user's is not woken for everyone else's.
"""

import json

from dbus_fast.service import dbus_signal

from resourced.core.calendar import Blackout, Booking, BookingRequest, Notice
from resourced.core.claims import Demand
from resourced.errors import InvalidArgs
from resourced.protocol.names import USER_IFACE
from resourced.protocol.records import (
    BLACKOUT,
    BOOKING,
    LIST_OPTIONS,
    NOTICE,
)
from resourced.protocol.time import iso_utc

from .interface import Interface
from .options import parse_options, wire_record

MAX_PAGE = 10_000
MAX_SLOTS = 20


def booking_request(opts: dict, gpu_uuid,
                    base: Booking | None = None) -> tuple[BookingRequest, str, bool]:
    """The request the options describe (read by BOOK_OPTIONS; over ``base``'s, for an
    edit), the op id, and whether it is a dry run;
    ``gpu_uuid`` resolves a GPU's name (alias, index, UUID) to its UUID."""
    old = base.request if base is not None else None
    named = tuple(gpu_uuid(n) for n in opts["gpu_names"]) if "gpu_names" in opts else (
        old.named if old else ())
    excluded = tuple(gpu_uuid(n) for n in opts["exclude"]) if "exclude" in opts else (
        old.excluded if old else ())
    share_on_named = "gpu_names" in opts and "vram_bytes" in opts  # a share on that GPU
    gpus = opts.get("gpus", 0 if share_on_named else len(named) if "gpu_names" in opts
                    else old.demand.gpus if old else 0)
    vram = opts.get("vram_bytes", old.demand.vram if old else 0)
    if "gpus" in opts or "gpu_names" in opts:
        vram = opts.get("vram_bytes", 0)
    elif "vram_bytes" in opts:
        gpus = 0
    pools = opts["pools"] if "pools" in opts else dict(old.demand.pools if old else ())
    if "duration_usec" not in opts and old is None:
        raise InvalidArgs("a booking needs a duration (DurationUSec)")
    start = opts.get("start_usec", base.start_usec if base is not None else None)
    if opts.get("earliest"):
        start = None
    request = BookingRequest(
        demand=Demand.of(gpus, vram, pools),
        duration_usec=opts.get("duration_usec", old.duration_usec if old else 0),
        start_usec=start, named=named, excluded=excluded,
        exclusive=opts.get("exclusive", old.exclusive if old else False),
        label=opts.get("label", old.label if old else ""),
        task_name=opts.get("task_name", old.task_name if old else ""),
        isolate=opts.get("isolate", old.isolate if old else False))
    return request, opts.get("op_id", ""), opts.get("dry_run", False)


def list_filter(options: dict) -> dict:
    opts = parse_options(options, LIST_OPTIONS)
    if opts.get("limit", 1) == 0 or opts.get("limit", 0) > MAX_PAGE:
        raise InvalidArgs(f"Limit must be from 1 to {MAX_PAGE}")
    return opts


def booking_fields(b: Booking, gpus: dict, claim_state: str = "",
                   waiting_for: list[str] = ()) -> dict:
    """A booking's record by JSON key; ``gpus`` maps UUIDs to the ledger's GPUs;
    ``claim_state`` is its claim's while it is active, ``waiting_for`` the claims that
    hold its GPUs while its claim waits (granted before it, not given back)."""
    d = b.request.demand
    return {
        "id": b.id, "uid": b.uid, "user": b.user, "state": b.state,
        "start_usec": b.start_usec, "end_usec": b.end_usec, "created_usec": b.created_usec,
        "gpu_uuids": list(b.gpus), "gpu_indices": [gpus[u].index for u in b.gpus if u in gpus],
        "gpus": [gpus[u].label for u in b.gpus if u in gpus], "gpus_requested": d.gpus,
        "vram_bytes": d.vram, "shared": b.share,
        "exclusive": b.request.exclusive, "pools": dict(d.pools), "label": b.request.label,
        "task_name": b.request.task_name, "op_id": b.op_id, "ended": b.ended,
        "ended_by": b.ended_by, "ended_usec": b.ended_usec, "reason": b.reason,
        "claim_state": claim_state, "waiting_for": list(waiting_for), "session": b.session,
        "job": b.job, "job_exit": b.job_exit, "job_detail": b.job_detail,
        "isolated": b.request.isolate,
        "start": iso_utc(b.start_usec), "end": iso_utc(b.end_usec),
    }


def booking_record(fields: dict) -> dict:
    """The a{sv} of a booking's fields."""
    return wire_record(BOOKING, fields)


_IDLE_HEAD, _IDLE_TAIL = '{"claim_state": "", ', ', "waiting_for": []}'


def _live(text: str, claim_state: str, waiting_for: list[str]) -> str:
    """A booking's kept text (without a claim) with its claim's state and what it waits
    for: the two keys sort first and last, so the middle stays in order."""
    middle = text[len(_IDLE_HEAD):-len(_IDLE_TAIL)]
    return f'{{"claim_state": "{claim_state}", {middle}, "waiting_for": {json.dumps(waiting_for)}}}'


class BookingTexts:
    """Each booking's JSON as ``gpuctl bookings --json`` prints it (keys sorted), kept
    until the booking changes (records are immutable: a changed booking is another
    object), so listing 5,000 bookings encodes none again and gpuctl prints it unread."""

    def __init__(self):
        self._texts: dict[str, tuple[Booking, str]] = {}

    def array(self, page: list[Booking], gpus: dict, claims: dict, claim_of) -> str:
        """The JSON array of ``page``; ``claim_of(b)`` (its claim's state, the claims it
        waits for) is asked only of a booking with a claim in ``claims``."""
        texts, parts = self._texts, []
        for b in page:
            cached = texts.get(b.id)
            if cached is None or cached[0] is not b:
                text = json.dumps(booking_fields(b, gpus), sort_keys=True)
                cached = texts[b.id] = (b, text)
            parts.append(cached[1] if b.id not in claims else _live(cached[1], *claim_of(b)))
        if not parts:
            return "[]"
        parts[0] = "[" + parts[0]  # brackets on the ends: the one join is the only copy
        parts[-1] += "]"
        return ", ".join(parts)

    def forget_missing(self, known: dict) -> None:
        """Drop the texts of bookings the calendar no longer has."""
        for booking_id in [i for i in self._texts if i not in known]:
            del self._texts[booking_id]


def blackout_record(b: Blackout) -> dict:
    return wire_record(BLACKOUT, {"id": b.id, "start_usec": b.start_usec,
                                  "end_usec": b.end_usec, "reason": b.reason})


def notice_record(n: Notice) -> dict:
    return wire_record(NOTICE, {"id": n.id, "text": n.text, "created_usec": n.created_usec,
                                "until_usec": n.until_usec, "by": n.by})


class UserInterface(Interface):
    """``org.resourced.User`` at /org/resourced/user/<uid>: signals about that user's
    bookings."""

    OUT_NAMES = {"BookingChanged": ("booking_id", "what", "booking")}

    def __init__(self):
        super().__init__(USER_IFACE)

    @dbus_signal()
    def BookingChanged(self, booking_id: str, what: str, booking: dict) -> "ssa{sv}":
        """what: created | changed | started | ending | ended | blackout (a blackout now
        covers part of it) | job (its command's state changed) | no-show (released: its
        GPUs were not used)."""
        return [booking_id, what, booking]
