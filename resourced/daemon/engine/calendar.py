"""The engine's calendar: booking operations, and what bookings do to claims.

Each operation brings the clock up to date (``run_due``), makes the change in the pure
``Calendar``, records it in the state directory before anything is acknowledged
(``changed``: undone if it cannot be written; the bus awaits ``synced`` before any reply,
so none tells of a change not yet on disk), then acts on the claims through the ledger
and the engine's ``commit``, the one seam: a booking that starts becomes a claim, one
that ends releases it, and claims granted until a booking are looked at again.
"""

from __future__ import annotations

import logging
import pwd
from dataclasses import replace
from operator import attrgetter

from resourced.config import DaemonConfig
from resourced.core.calendar import (
    Blackout,
    Booking,
    BookingEvent,
    BookingRequest,
    Limits,
    Notice,
)
from resourced.core.caller import Caller
from resourced.core.claims import BOOKING
from resourced.core.lifecycle import ACTIVE, BOOKING_ENDED, ENDED, EXPIRED
from resourced.errors import Internal, InvalidArgs, NoSuchClaim, quoted
from resourced.linux.sd import audit
from resourced.protocol.time import DAY, iso_utc, whole_second

log = logging.getLogger("resourced")


def booking_limits(settings: DaemonConfig) -> Limits:
    return Limits(longest=settings.longest_booking, horizon=settings.booking_horizon,
                  per_user=settings.max_bookings_per_user, retention=settings.booking_retention,
                  gpu_hours_per_user=settings.max_booked_gpu_hours_per_user,
                  gpu_hours_per_session=settings.max_booked_gpu_hours_per_session,
                  exempt=exempt_uids(settings.exempt_users))


def exempt_uids(names: tuple[str, ...]) -> frozenset[int]:
    """The uids of the users ``exempt_users`` names (one unknown here is left out, logged)."""
    found = set()
    for name in names:
        try:
            found.add(pwd.getpwnam(name).pw_uid)
        except KeyError:
            log.warning("exempt_users names %s, who has no account here", name)
    return frozenset(found)


class Bookings:
    """The engine's booking, blackout and notice operations (see the module).

    ``dry_run`` on a change decides it by the calendar's real admission, answers what it
    would be, and undoes it: nothing is recorded, published or remembered (op ids
    included)."""

    def __init__(self, engine):
        self.engine = engine

    async def book(self, caller: Caller, request: BookingRequest, op_id: str = "",
                   dry_run: bool = False, session: str | None = None) -> tuple[Booking, str]:
        """Admit a booking (or answer the first result of a replayed ``op_id``): created |
        exists, or dry-run.  It belongs to ``session`` (default: the caller's Unix
        session)."""
        if request.isolate:
            self.engine.isolated(True, BOOKING, caller.uid)  # refused here if it cannot be
        user = await self.engine.user_name(caller.uid)
        session = self.engine.session_of(caller.pid, session)
        self.engine.alarms.run_due()
        booking, status, events = self.engine.calendar.book(
            request, self.engine.new_id("b"), caller.uid, user, self._booking_now(),
            "" if dry_run else op_id, session)
        if self._settle(events, [(booking.id, None)], dry_run):
            return replace(booking, id=""), "dry-run"  # no reference: nothing was booked
        return self.engine.calendar.bookings[booking.id], status

    def edit(self, caller: Caller, booking_id: str, request: BookingRequest,
             admin: bool = False, op_id: str = "", dry_run: bool = False) -> Booking:
        self.engine.alarms.run_due()
        old = self.engine.calendar.bookings.get(booking_id)
        if request.isolate and not (old and old.request.isolate):
            # refused here if it cannot be
            self.engine.isolated(True, BOOKING, old.uid if old else caller.uid)
        booking, events = self.engine.calendar.edit(booking_id, request, caller.uid,
                                             self._booking_now(), admin, "" if dry_run else op_id)
        self._settle(events, [(booking_id, old)], dry_run)
        return booking

    def set_end(self, caller: Caller, booking_id: str, end_usec: int,
                admin: bool = False, op_id: str = "", by_usec: int = 0,
                dry_run: bool = False) -> Booking:
        self.engine.alarms.run_due()
        old = self.engine.calendar.bookings.get(booking_id)
        booking, events = self.engine.calendar.set_end(booking_id, end_usec, caller.uid,
                                                       self._booking_now(), admin,
                                                       "" if dry_run else op_id, by_usec)
        self._settle(events, [(booking_id, old)], dry_run)
        return booking

    def cancel(self, caller: Caller, booking_id: str, reason: str = "",
               admin: bool = False, op_id: str = "", dry_run: bool = False) -> Booking:
        self.engine.alarms.run_due()
        old = self.engine.calendar.bookings.get(booking_id)
        booking, events = self.engine.calendar.cancel(booking_id, caller.uid, self.engine.clock(),
                                                      admin, reason, "" if dry_run else op_id)
        if self._settle(events, [(booking_id, old)], dry_run):
            return booking
        if events and reason and caller.uid != booking.uid:
            audit(f"booking {booking_id} of {booking.user or booking.uid} {booking.ended} by uid "
                  f"{caller.uid}: {reason}", priority=4, uid=booking.uid, event="booking-cancelled",
                  reason=reason)
        return booking

    def report_job(self, caller: Caller, booking_id: str, state: str, exit_code: int = -1,
                   detail: str = "") -> Booking:
        """The owner's runner says how the booking's command stands."""
        old = self.engine.calendar.bookings.get(booking_id)
        booking, events = self.engine.calendar.set_job(booking_id, caller.uid, state, exit_code,
                                                       detail)
        self.changed(events, [(booking_id, old)])
        return booking

    def _settle(self, events: list[BookingEvent], undo, dry_run: bool) -> bool:
        """Make a calendar change take effect, or (``dry_run``) undo it; True if undone."""
        if dry_run:
            if events:
                for booking_id, old in undo:
                    self.engine.calendar.put_back(booking_id, old)
            return True
        self.changed(events, undo)
        return False

    def add_blackout(self, caller: Caller, start_usec: int, end_usec: int, reason: str) -> tuple[Blackout, list[Booking]]:
        """Block a window for new bookings; returns it and the bookings already in it."""
        self.engine.alarms.run_due()
        blackout = Blackout(self.engine.new_id("x"), start_usec, end_usec, reason)
        inside = self.engine.calendar.add_blackout(blackout)  # checks it first
        if end_usec <= self.engine.clock():
            self.engine.calendar.remove_blackout(blackout.id)
            raise InvalidArgs("the blackout is over already: its end is in the past")
        self._record_or_undo(lambda: self.engine.calendar.remove_blackout(blackout.id),
                             blackout=blackout)
        audit(f"blackout {blackout.id} {iso_utc(start_usec)}-{iso_utc(end_usec)} by uid {caller.uid}: "
              f"{reason}", priority=5, event="blackout", reason=reason)
        self.engine.publish([BookingEvent(b, "blackout") for b in inside])
        return blackout, inside

    def remove_blackout(self, caller: Caller, blackout_id: str) -> Blackout:
        blackout = self.engine.calendar.remove_blackout(blackout_id)
        blackouts = self.engine.calendar.blackouts
        self._record_or_undo(lambda: blackouts.__setitem__(blackout_id, blackout),
                             unblackout=blackout_id)
        return blackout

    def add_notice(self, caller: Caller, text: str, until_usec: int) -> Notice:
        notice = Notice(self.engine.new_id("n"), text, self.engine.clock(), until_usec, caller.uid)
        self.engine.calendar.add_notice(notice)
        self._record_or_undo(lambda: self.engine.calendar.notices.pop(notice.id), notice=notice)
        self.engine.publish([notice])
        return notice

    def remove_notice(self, caller: Caller, notice_id: str) -> Notice:
        notice = self.engine.calendar.remove_notice(notice_id)
        self._record_or_undo(lambda: self.engine.calendar.notices.__setitem__(notice_id, notice),
                             unnotice=notice_id)
        return notice

    def notices(self) -> list[Notice]:
        now = self.engine.clock()
        return sorted((n for n in self.engine.calendar.notices.values()
                       if not n.until_usec or n.until_usec > now), key=lambda n: n.created_usec)

    def list(self, uid: int | None, since_usec: int | None = None,
             until_usec: int | None = None) -> list[Booking]:
        """Bookings by start: of one user (None: everyone's), live ones and those ended
        since ``since_usec`` (default: the last 24 hours); starting before ``until_usec``."""
        self.engine.alarms.run_due()
        since = self.engine.clock() - DAY if since_usec is None else since_usec
        return sorted((b for b in self.engine.calendar.bookings.values()
                       if (uid is None or b.uid == uid)
                       and (b.state != ENDED or b.ended_usec >= since)
                       and (until_usec is None or b.start_usec < until_usec)),
                      key=attrgetter("start_usec", "id"))

    def get(self, booking_id: str) -> Booking:
        booking = self.engine.calendar.bookings.get(booking_id)
        if booking is None:
            raise NoSuchClaim(f"no booking {quoted(booking_id)} (unknown, or ended long ago)")
        return booking

    def slots(self, request: BookingRequest, count: int) -> list[tuple[int, tuple[str, ...]]]:
        self.engine.alarms.run_due()
        return self.engine.calendar.slots(request, self._booking_now(), count)

    def _booking_now(self) -> int:
        """Now, rounded up to the second, for placing bookings: the starts and ends they
        get are then whole seconds, which every time a person types can name (a slot or a
        nearest start shown to the second is one that can be booked)."""
        return whole_second(self.engine.clock())

    def changed(self, events: list[BookingEvent], undo=()) -> None:
        """Record booking events (undoing them if that fails: nothing is acknowledged that a
        restart would forget), then act on the claims: a booking that starts becomes a
        claim, one that ends releases it, one whose end moved moves its claim's, and claims
        granted until a booking that moved or went away may hold longer."""
        if not events:
            return
        try:
            self.record(events)
        except Internal:
            for booking_id, old in undo:
                self.engine.calendar.put_back(booking_id, old)
            raise
        claims = self.engine.ledger.claims
        for event in events:
            b = event.booking
            if event.what == "started":
                self.start_booking(b)
            elif event.what == "ended" and b.id in claims:
                self.engine.end(b.id, EXPIRED if b.ended == EXPIRED else BOOKING_ENDED + b.ended,
                                None, b.reason)
            elif event.what == "changed" and b.state == ACTIVE and b.id in claims:
                self.engine.commit(self.engine.ledger.set_end(b.id, b.end_usec))
        self.engine.commit(self.engine.ledger.refresh_until())
        self.engine.publish(events)
        self.engine.alarms.run_due()  # a booking made for now starts now; the alarm is set again

    def start_booking(self, booking: Booking) -> None:
        request = booking.request
        demand = request.takes
        self.engine.commit(self.engine.ledger.start_booking(
            booking.id, demand, booking.gpus, booking.uid, booking.user, request.label,
            request.task_name, self.engine.clock(), booking.end_usec, busy=None,
            session=booking.session,
            isolated=request.isolate or self.engine.isolated(None, BOOKING, booking.uid)))
        self.engine.serve_queue()  # its GPUs are granted on fresh evidence, like any waiter's

    def record(self, events: list[BookingEvent], **changes) -> None:
        if self.engine.calendar_store is None:
            return
        try:
            self.engine.calendar_store.record(events, **changes)
            self.engine.calendar_store.compact_if_grown(self.engine.calendar)
        except OSError as exc:
            log.error("cannot record the calendar in %s: %s", self.engine.calendar_store.path, exc)
            raise Internal("the daemon cannot record the calendar; see its log") from exc

    async def synced(self) -> None:
        """Return once every change to the calendar made so far is on disk."""
        if self.engine.calendar_store is None:
            return
        try:
            await self.engine.calendar_store.log.synced()
        except OSError as exc:
            raise Internal("the daemon cannot sync the calendar to disk; see its log") from exc

    def _record_or_undo(self, undo, **changes) -> None:
        try:
            self.record([], **changes)
        except Internal:
            undo()
            raise


