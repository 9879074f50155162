"""The calendar on disk, in the state directory: bookings and blackouts outlive restarts,
crashes and reboots (unlike claims, which a reboot voids).

``calendar.log`` (``/var/lib/resourced`` for the system service, ``$STATE_DIRECTORY``
when systemd sets it) is a durable ``JsonLog``: every change is synced to disk before the
daemon replies.  Records are whole: ``booking`` (the booking as it is now, after any
change), ``forget`` (an ended booking or a notice past its time), ``blackout`` and
``unblackout``, ``notice`` and ``unnotice``.  Operation ids live in their bookings, so replaying a request after a
restart still answers ``exists``.

The header carries the schema version.  A log from an older version is migrated record
by record (``MIGRATIONS``) and rewritten in the new one; a log from a newer version is
refused at start, never guessed at.
"""

from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from resourced.core.calendar import Blackout, Booking, BookingEvent, BookingRequest, Notice
from resourced.core.claims import Demand

from .jsonlog import JsonLog, StoreError

SCHEMA = 1
LOG_NAME = "calendar.log"
COMPACT_SLACK = 256
MIGRATIONS: dict[int, Callable[[dict], dict]] = {}
"""schema version -> a function taking a record of that version to the next; none yet."""


def booking_to_record(booking: Booking) -> dict:
    return asdict(booking)


def booking_from_record(data: dict) -> Booking:
    request = dict(data["request"])
    d = request.pop("demand")
    demand = Demand(d["gpus"], d["vram"], tuple((n, a) for n, a in d["pools"]))
    request = BookingRequest(demand=demand, **{
        **request, "named": tuple(request["named"]), "excluded": tuple(request["excluded"])})
    return Booking(**{**data, "request": request, "gpus": tuple(data["gpus"]),
                      "ops": tuple(tuple(op) for op in data.get("ops", ()))})


class CalendarStore:
    """The calendar log in one state directory, which it locks for its lifetime."""

    def __init__(self, state_dir: Path):
        self.log = JsonLog(state_dir, LOG_NAME, "state directory", durable=True)
        self.path = self.log.path

    def load(self) -> tuple[dict[str, Booking], dict[str, Blackout], dict[str, Notice]]:
        """The bookings, blackouts and notices the log holds.  A log read whole, in this
        schema, is kept as it is (``compact_if_grown`` compacts it as it grows, and a
        synced snapshot at every start cost as much as the log); any other is replaced
        by a snapshot, migrated, at once."""
        bookings: dict[str, Booking] = {}
        blackouts: dict[str, Blackout] = {}
        notices: dict[str, Notice] = {}
        version = SCHEMA

        def header(record: dict) -> bool:
            nonlocal version
            version = record.get("schema")
            if not isinstance(version, int) or version < 1:
                raise ValueError(f"unknown schema {version!r}")
            if version > SCHEMA:
                raise StoreError(f"{self.path} was written by a newer resourced (schema "
                                 f"{version}, this one knows {SCHEMA}); refusing to guess")
            return True

        def apply(record: dict) -> None:
            for old in range(version, SCHEMA):
                record = MIGRATIONS[old](record)
            op = record["op"]
            if op == "booking":
                booking = booking_from_record(record["booking"])
                bookings[booking.id] = booking
            elif op == "forget":
                bookings.pop(record["id"], None)
                notices.pop(record["id"], None)
            elif op == "blackout":
                blackout = Blackout(**record["blackout"])
                blackouts[blackout.id] = blackout
            elif op == "unblackout":
                blackouts.pop(record["id"], None)
            elif op == "notice":
                notice = Notice(**record["notice"])
                notices[notice.id] = notice
            elif op == "unnotice":
                notices.pop(record["id"], None)
            else:
                raise ValueError(f"unknown op {op!r}")

        if self.log.read(header, apply) and version == SCHEMA:
            self.log.keep()
        else:
            self.rewrite(bookings.values(), blackouts.values(), notices.values())
        return bookings, blackouts, notices

    def rewrite(self, bookings, blackouts, notices=()) -> None:
        """Replace the log with a snapshot (in the current schema)."""
        self.log.rewrite([
            {"schema": SCHEMA},
            *({"op": "booking", "booking": booking_to_record(b)} for b in bookings),
            *({"op": "blackout", "blackout": asdict(b)} for b in blackouts),
            *({"op": "notice", "notice": asdict(n)} for n in notices),
        ])

    def record(self, events: list[BookingEvent], forgotten: list[str] = (),
               blackout: Blackout | None = None, unblackout: str = "",
               notice: Notice | None = None, unnotice: str = "") -> None:
        """Append what changed, in one synced write."""
        lines = [{"op": "booking", "booking": booking_to_record(e.booking)} for e in events]
        lines += [{"op": "forget", "id": item_id} for item_id in forgotten]
        if blackout is not None:
            lines.append({"op": "blackout", "blackout": asdict(blackout)})
        if unblackout:
            lines.append({"op": "unblackout", "id": unblackout})
        if notice is not None:
            lines.append({"op": "notice", "notice": asdict(notice)})
        if unnotice:
            lines.append({"op": "unnotice", "id": unnotice})
        self.log.append(lines)

    def compact_if_grown(self, calendar) -> None:
        """Rewrite the log when it has grown well past what the calendar holds."""
        held = len(calendar.bookings) + len(calendar.blackouts) + len(calendar.notices)
        if self.log.records > 2 * held + COMPACT_SLACK:
            self.rewrite(calendar.bookings.values(), calendar.blackouts.values(),
                         calendar.notices.values())

    def close(self) -> None:
        self.log.close()
