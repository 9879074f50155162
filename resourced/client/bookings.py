"""The booking calls of ``Client`` and ``AsyncClient``, defined once (``steps``): friendly
arguments to bus messages, and replies to plain dicts (the keys of
``resourced.protocol.records``, times in microseconds since the epoch, UTC).

Times: ``start``, ``until``, ``since`` accept a string as gpuctl reads it (``+30m``,
``20:00``, ``tomorrow 09:00``, ISO 8601; relative to now in local time), an aware
``datetime``, seconds since the epoch, or microseconds marked ``Usec``
(``resourced.protocol.time``).  Durations accept seconds, a string (``2h30m``) or a
``Usec``.  With the simulated backend, *now* is the simulated clock's.
"""

from jeepney import DBusAddress, new_method_call

from resourced.errors import InvalidArgs
from resourced.protocol import records as tables
from resourced.protocol.names import BUS_NAME, MANAGER_IFACE, MANAGER_PATH
from resourced.protocol.time import USEC, Usec, local_now, usec_of_seconds, whole_second

from .arguments import (
    INT32,
    UINT32_MAX,
    bus_string,
    bus_whole,
    memory_and_counts,
    named_gpus,
    session_option,
    span,
)
from .steps import Defined, call

_MANAGER = DBusAddress(MANAGER_PATH, bus_name=BUS_NAME, interface=MANAGER_IFACE)
USEC_MAX = 2**64 - 1


def cancelled_already(booking: dict, asked_usec: int) -> bool:
    """Whether the booking ``cancel`` answered with was cancelled before ``asked_usec``
    (the moment the cancel was asked): a repeated cancel, which changed nothing."""
    return booking["ended"] == "cancelled" and 0 < booking["ended_usec"] < asked_usec


def instant(name: str, value, now: int | None = None) -> int:
    """A moment as microseconds since the epoch; one typed as text (``+1h``) is taken to
    the next whole second, as the daemon places bookings (so back to back stays so)."""
    from datetime import datetime

    from resourced.protocol.when import parse_when, usec

    if isinstance(value, str):
        try:
            exact = usec(parse_when(value, local_now(now)))
        except ValueError as exc:
            raise InvalidArgs(f"{name}: {exc}") from None
        return whole_second(exact)
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise InvalidArgs(f"{name} must be an aware datetime (with a zone)")
        return usec(value)
    if isinstance(value, Usec) and 0 <= value < 2**63:
        return int(value)
    if isinstance(value, (int, float)) and not isinstance(value, (bool, Usec)) and \
            0 <= value < 2**63 / USEC:
        return usec_of_seconds(value)
    raise InvalidArgs(f"{name} must be a time (text, datetime or epoch seconds), not {value!r}")


def request_options(gpus=None, duration=None, start=None, gpu_names=None, exclude=None,
                    vram=None, ram=None, cpu=None, pools=None, exclusive=None, op_id=None,
                    label=None, task_name=None, earliest=False, dry_run=False, vram_mb=None,
                    ram_mb=None, isolate=None) -> dict:
    """``Book``/``EditBooking``/``FindSlots`` options; None leaves a key out (an edit then
    keeps the booking's value)."""

    vram, amounts = memory_and_counts(vram, ram, cpu, pools, vram_mb, ram_mb)
    return tables.options(
        tables.BOOK_OPTIONS,
        gpus=None if gpus is None else bus_whole("gpus", gpus, 0, UINT32_MAX),
        gpu_names=named_gpus(gpu_names), exclude=named_gpus(exclude),
        vram_bytes=vram, pools=amounts if amounts or pools is not None else None,
        duration_usec=None if duration is None else span("duration", duration),
        start_usec=None if start is None else instant("start", start),
        earliest=earliest or None, dry_run=dry_run or None,
        exclusive=None if exclusive is None else bool(exclusive),
        isolate=None if isolate is None else bool(isolate),
        **{key: None if value is None else bus_string(name, value) for key, name, value in (
            ("op_id", "op id", op_id), ("label", "label", label),
            ("task_name", "task name", task_name))})


def call_message(method: str, signature: str | None = None, body: tuple = ()):
    return new_method_call(_MANAGER, method, signature, body)


def book_message(session=None, **request):

    return call_message("Book", "a{sv}",
                        ({**request_options(**request), **session_option(session)},))


def list_message(all_users=False, since=None, until=None, offset=0, limit=None):

    options = tables.options(
        tables.LIST_OPTIONS, all=bool(all_users),
        since_usec=None if since is None else instant("since", since),
        until_usec=None if until is None else instant("until", until),
        offset=bus_whole("offset", offset, 0, UINT32_MAX) or None,
        limit=None if limit is None else bus_whole("limit", limit, 1, 10_000))
    return call_message("ListBookings", "a{sv}", (options,))


def ref_message(method: str, ref: str, *rest: tuple[str, object]):

    signature = "s" + "".join(sig for sig, _ in rest)
    return call_message(method, signature, (bus_string("reference", ref), *(v for _, v in rest)))


def slots_message(count: int, **request):

    return call_message("FindSlots", "a{sv}u", (request_options(**request),
                                         bus_whole("count", count, 1, 20)))


def blackout_message(start, end, reason: str):

    return call_message("AddBlackout", "tts", (instant("start", start), instant("end", end),
                                       bus_string("reason", reason)))


def notice_message(text: str, until=None):

    return call_message("AddNotice", "st", (bus_string("text", text),
                                    0 if until is None else instant("until", until)))


def change_options(op_id: str = "", dry_run: bool = False) -> tuple[str, dict]:
    """The a{sv} of CancelBooking."""

    return "a{sv}", tables.options(tables.CHANGE_OPTIONS,
                                   op_id=bus_string("op id", op_id) if op_id else None,
                                   dry_run=dry_run or None)


def end_message(ref: str, by=None, until=None, op_id: str = "", dry_run: bool = False):
    """SetBookingEnd: ``by`` a duration past the end it has, or ``until`` a time."""
    if (by is None) == (until is None):
        raise InvalidArgs("give exactly one of by (a duration) or until (a time)")
    options = tables.options(tables.END_OPTIONS,
                             op_id=bus_string("op id", op_id) if op_id else None,
                             by_usec=None if by is None else span("by", by),
                             dry_run=dry_run or None)
    return ref_message("SetBookingEnd", ref, ("t", 0 if until is None else instant("until", until)),
                       ("a{sv}", options))


def record(data: dict) -> dict:
    """A booking's ``a{sv}`` record (jeepney's (signature, value) pairs) as a plain dict."""
    return tables.read(tables.BOOKING, data)


def records(kind: str, body: tuple) -> list[dict]:
    """The records in the answer ``body``, of ``kind`` (the name of a table in
    ``resourced.protocol.records``)."""
    return [tables.read(getattr(tables, kind), r) for r in body[0]]


def booked(body: tuple) -> dict:
    """``Book``'s reply: ``{"status": created | exists, "booking": {...}}``."""
    return {"status": body[0], "booking": record(body[1])}


def usage_message(since=None, until=None, uid=None, by_gpu=False):
    options = tables.options(
        tables.USAGE_OPTIONS, since_usec=None if since is None else instant("since", since),
        until_usec=None if until is None else instant("until", until),
        uid=None if uid is None else bus_whole("uid", uid, 0, UINT32_MAX),
        by_gpu=by_gpu or None)
    return call_message("Usage", "a{sv}", (options,))


class BookingCalls(Defined):
    """The calls about bookings, blackouts, notices and usage (``calls.Calls`` has them)."""

    @call
    def book(self, duration, gpus=None, start=None, **request) -> dict:
        """Reserve a window: ``{"status": "created" | "exists", "booking": {...}}``.
        ``start`` None takes the earliest start that fits (see ``request_options`` for
        the rest)."""
        return booked((yield book_message(duration=duration, gpus=gpus, start=start,
                                          **request)))

    @call
    def bookings_json(self, all_users: bool = False, since=None, until=None, offset: int = 0,
                      limit: int | None = None) -> str:
        """``bookings()`` as the daemon sends it: JSON text."""
        return (yield list_message(all_users, since, until, offset, limit))[0]

    @call
    def bookings(self, all_users: bool = False, since=None, until=None, offset: int = 0,
                 limit: int | None = None) -> list[dict]:
        """Mine (or everyone's): scheduled, active, and ended since ``since`` (default a
        day ago), by start."""
        import json

        return json.loads((yield from BookingCalls.bookings_json.steps(
            self, all_users, since, until, offset, limit)))

    @call
    def booking(self, ref: str) -> dict:
        """One booking by reference."""
        return record((yield ref_message("GetBooking", ref))[0])

    @call
    def edit(self, ref: str, **changes) -> dict:
        """Change a booking that has not started (what is not given stays)."""
        return record((yield ref_message("EditBooking", ref,
                                         ("a{sv}", request_options(**changes))))[0])

    @call
    def extend(self, ref: str, by=None, until=None, op_id: str = "",
               dry_run: bool = False) -> dict:
        """Move a booking's end: ``by`` a duration past its end, or ``until`` a time
        (earlier shrinks it, not before now).  ``dry_run`` (here and on book, edit and
        cancel): what it would be, decided by the daemon, with nothing changed."""
        return record((yield end_message(ref, by, until, op_id, dry_run))[0])

    @call
    def cancel(self, ref: str, reason: str = "", op_id: str = "", dry_run: bool = False) -> dict:
        """End a booking now; someone else's needs the manage action and a reason."""
        return record((yield ref_message("CancelBooking", ref, ("s", bus_string("reason", reason)),
                                         change_options(op_id, dry_run)))[0])

    @call
    def slots(self, duration, count: int = 3, **request) -> list[dict]:
        """The earliest places a booking would fit (read-only)."""
        return records("SLOT", (yield slots_message(count, duration=duration, **request)))

    @call
    def usage(self, since=None, until=None, uid: int | None = None,
              by_gpu: bool = False) -> list[dict]:
        """GPU-hours held, used and idle per user (or per GPU, with mean load) from
        ``since`` (default 7 days ago) to ``until`` (default now): see ``gpuctl usage``."""
        import json

        return json.loads((yield usage_message(since, until, uid, by_gpu))[0])

    @call
    def report_job(self, ref: str, state: str, exit_code: int = -1, detail: str = "") -> dict:
        """As a booking's owner (its runner): how the booking's command stands (pending,
        running, succeeded, failed, timed-out, cancelled, missed); the booking's record."""
        return record((yield call_message("ReportJob", "ssis", (
            bus_string("reference", ref), bus_string("state", state),
            bus_whole("exit code", exit_code, *INT32), bus_string("detail", detail))))[0])

    @call
    def add_blackout(self, start, end, reason: str) -> dict:
        """Block a window for new bookings: ``{"id", "bookings_inside"}``."""
        blackout_id, inside = yield blackout_message(start, end, reason)
        return {"id": blackout_id, "bookings_inside": list(inside)}

    @call
    def blackouts(self) -> list[dict]:
        """The blackouts, each ``{"id", "start_usec", "end_usec", "reason"}``."""
        return records("BLACKOUT", (yield call_message("ListBlackouts")))

    @call
    def remove_blackout(self, blackout_id: str) -> None:
        yield ref_message("RemoveBlackout", blackout_id)

    @call
    def add_notice(self, text: str, until=None) -> str:
        """Post a notice to everyone (until ``until``, if given); its id."""
        return (yield notice_message(text, until))[0]

    @call
    def notices(self) -> list[dict]:
        return records("NOTICE", (yield call_message("ListNotices")))

    @call
    def remove_notice(self, notice_id: str) -> None:
        yield ref_message("RemoveNotice", notice_id)
