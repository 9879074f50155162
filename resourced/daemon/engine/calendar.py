"""The engine's calendar: booking operations, and what bookings do to claims.

A mixin of ``Engine`` (kept apart from the claim operations and process tracking it
shares state with): each operation brings the clock up to date (``run_due``), makes the
change in the pure ``Calendar``, records it in the state directory before anything is
acknowledged (``_calendar_changed``: undone if it cannot be written; the bus awaits
``calendar_synced`` before any reply, so none tells of a change not yet on disk), then acts on the
claims through the ledger and ``_commit``, the one seam: a booking that starts becomes a
claim, one that ends releases it, and claims granted until a booking are looked at
again.
"""

from __future__ import annotations

import logging
import pwd

from resourced.config import DaemonConfig
from resourced.core.calendar import (
    Blackout,
    Booking,
    BookingEvent,
    BookingRequest,
    Calendar,
    Limits,
    Notice,
)
from resourced.core.caller import Caller
from resourced.core.claims import BOOKING
from resourced.core.clock import utc_text, whole_second
from resourced.core.lifecycle import ACTIVE, BOOKING_ENDED, ENDED, EXPIRED
from resourced.errors import Internal, InvalidRequest, NoSuchClaim, quoted
from resourced.linux.sd import audit

log = logging.getLogger("resourced")


class CalendarOperations:
    """Booking, blackout and notice operations of the ``Engine`` (see the module).

    ``dry_run`` on a change decides it by the calendar's real admission, answers what it
    would be, and undoes it: nothing is recorded, published or remembered (op ids
    included)."""

    async def book(self, caller: Caller, request: BookingRequest, op_id: str = "",
                   dry_run: bool = False, session: str | None = None) -> tuple[Booking, str]:
        """Admit a booking (or answer the first result of a replayed ``op_id``): created |
        exists, or dry-run.  It belongs to ``session`` (default: the caller's Unix
        session)."""
        if request.isolate:
            self._isolated(True, BOOKING)  # refused here if it cannot be
        user = await self._user_name(caller.uid)
        session = self._session_of(caller.pid, session)
        self.run_due()
        booking, status, events = self.calendar.book(
            request, self._new_id("b"), caller.uid, user, self._booking_now(),
            "" if dry_run else op_id, session)
        if self._settle(events, [(booking.id, None)], dry_run):
            return booking, "dry-run"
        return self.calendar.bookings[booking.id], status

    def edit_booking(self, caller: Caller, booking_id: str, request: BookingRequest,
                     admin: bool = False, op_id: str = "", dry_run: bool = False) -> Booking:
        self.run_due()
        old = self.calendar.bookings.get(booking_id)
        if request.isolate and not (old and old.request.isolate):
            self._isolated(True, BOOKING)  # refused here if it cannot be
        booking, events = self.calendar.edit(booking_id, request, caller.uid,
                                             self._booking_now(), admin, "" if dry_run else op_id)
        self._settle(events, [(booking_id, old)], dry_run)
        return booking

    def set_booking_end(self, caller: Caller, booking_id: str, end_usec: int,
                        admin: bool = False, op_id: str = "", by_usec: int = 0,
                        dry_run: bool = False) -> Booking:
        self.run_due()
        old = self.calendar.bookings.get(booking_id)
        booking, events = self.calendar.set_end(booking_id, end_usec, caller.uid,
                                                self._booking_now(), admin,
                                                "" if dry_run else op_id, by_usec)
        self._settle(events, [(booking_id, old)], dry_run)
        return booking

    def cancel_booking(self, caller: Caller, booking_id: str, reason: str = "",
                       admin: bool = False, op_id: str = "", dry_run: bool = False) -> Booking:
        self.run_due()
        old = self.calendar.bookings.get(booking_id)
        booking, events = self.calendar.cancel(booking_id, caller.uid, self.clock(), admin,
                                               reason, "" if dry_run else op_id)
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
        old = self.calendar.bookings.get(booking_id)
        booking, events = self.calendar.set_job(booking_id, caller.uid, state, exit_code, detail)
        self._calendar_changed(events, [(booking_id, old)])
        return booking

    def _settle(self, events: list[BookingEvent], undo, dry_run: bool) -> bool:
        """Make a calendar change take effect, or (``dry_run``) undo it; True if undone."""
        if dry_run:
            if events:
                for booking_id, old in undo:
                    self.calendar.put_back(booking_id, old)
            return True
        self._calendar_changed(events, undo)
        return False

    def add_blackout(self, caller: Caller, start_usec: int, end_usec: int, reason: str) -> tuple[Blackout, list[Booking]]:
        """Block a window for new bookings; returns it and the bookings already in it."""
        self.run_due()
        blackout = Blackout(self._new_id("x"), start_usec, end_usec, reason)
        inside = self.calendar.add_blackout(blackout)  # checks it first
        if end_usec <= self.clock():
            self.calendar.remove_blackout(blackout.id)
            raise InvalidRequest("the blackout is over already: its end is in the past")
        self._record_or_undo(lambda: self.calendar.remove_blackout(blackout.id), blackout=blackout)
        audit(f"blackout {blackout.id} {utc_text(start_usec)}-{utc_text(end_usec)} by uid {caller.uid}: "
              f"{reason}", priority=5, event="blackout", reason=reason)
        self._publish_calendar([BookingEvent(b, "blackout") for b in inside])
        return blackout, inside

    def remove_blackout(self, caller: Caller, blackout_id: str) -> Blackout:
        blackout = self.calendar.remove_blackout(blackout_id)
        self._record_or_undo(lambda: self.calendar.blackouts.__setitem__(blackout_id, blackout),
                             unblackout=blackout_id)
        return blackout

    def add_notice(self, caller: Caller, text: str, until_usec: int) -> Notice:
        notice = Notice(self._new_id("n"), text, self.clock(), until_usec, caller.uid)
        self.calendar.add_notice(notice)
        self._record_or_undo(lambda: self.calendar.notices.pop(notice.id), notice=notice)
        self._publish_calendar([notice])
        return notice

    def remove_notice(self, caller: Caller, notice_id: str) -> Notice:
        notice = self.calendar.remove_notice(notice_id)
        self._record_or_undo(lambda: self.calendar.notices.__setitem__(notice_id, notice),
                             unnotice=notice_id)
        return notice

    def notices(self) -> list[Notice]:
        now = self.clock()
        return sorted((n for n in self.calendar.notices.values()
                       if not n.until_usec or n.until_usec > now), key=lambda n: n.created_usec)

    def bookings(self, uid: int | None, since_usec: int | None = None,
                 until_usec: int | None = None) -> list[Booking]:
        """Bookings by start: of one user (None: everyone's), live ones and those ended
        since ``since_usec`` (default: the last 24 hours); starting before ``until_usec``."""
        self.run_due()
        since = self.clock() - 86400 * 1_000_000 if since_usec is None else since_usec
        return sorted((b for b in self.calendar.bookings.values()
                       if (uid is None or b.uid == uid)
                       and (b.state != ENDED or b.ended_usec >= since)
                       and (until_usec is None or b.start_usec < until_usec)),
                      key=lambda b: (b.start_usec, b.id))

    def booking(self, booking_id: str) -> Booking:
        booking = self.calendar.bookings.get(booking_id)
        if booking is None:
            raise NoSuchClaim(f"no booking {quoted(booking_id)} (unknown, or ended long ago)")
        return booking

    def slots(self, request: BookingRequest, count: int) -> list[tuple[int, tuple[str, ...]]]:
        self.run_due()
        return self.calendar.slots(request, self._booking_now(), count)

    def _booking_now(self) -> int:
        """Now, rounded up to the second, for placing bookings: the starts and ends they
        get are then whole seconds, which every time a person types can name (a slot or a
        nearest start shown to the second is one that can be booked)."""
        return whole_second(self.clock())

    def _calendar_changed(self, events: list[BookingEvent], undo=()) -> None:
        """Record booking events (undoing them if that fails: nothing is acknowledged that a
        restart would forget), then act on the claims: a booking that starts becomes a
        claim, one that ends releases it, one whose end moved moves its claim's, and claims
        granted until a booking that moved or went away may hold longer."""
        if not events:
            return
        try:
            self._record_calendar(events)
        except Internal:
            for booking_id, old in undo:
                self.calendar.put_back(booking_id, old)
            raise
        for event in events:
            b = event.booking
            if event.what == "started":
                self._start_booking(b)
            elif event.what == "ended" and b.id in self.ledger.claims:
                self._end(b.id, EXPIRED if b.ended == EXPIRED else BOOKING_ENDED + b.ended,
                          None, b.reason)
            elif event.what == "changed" and b.state == ACTIVE and b.id in self.ledger.claims:
                self._commit(self.ledger.set_end(b.id, b.end_usec))
        self._commit(self.ledger.refresh_until())
        self._publish_calendar(events)
        self.run_due()  # a booking made for now starts now; and the alarm is set again

    def _start_booking(self, booking: Booking) -> None:
        request = booking.request
        demand = Calendar._demand(request)
        self._commit(self.ledger.start_booking(
            booking.id, demand, booking.gpus, booking.uid, booking.user, request.label,
            request.task_name, self.clock(), booking.end_usec, busy=None, session=booking.session,
            isolated=request.isolate or self._isolated(None, BOOKING)))
        self._serve_queue()  # its GPUs are granted on fresh evidence, like any waiter's

    def _record_calendar(self, events: list[BookingEvent], **changes) -> None:
        if self.calendar_store is None:
            return
        try:
            self.calendar_store.record(events, **changes)
            self.calendar_store.compact_if_grown(self.calendar)
        except OSError as exc:
            log.error("cannot record the calendar in %s: %s", self.calendar_store.path, exc)
            raise Internal("the daemon cannot record the calendar; see its log") from exc

    async def calendar_synced(self) -> None:
        """Return once every change to the calendar made so far is on disk."""
        if self.calendar_store is None:
            return
        try:
            await self.calendar_store.log.synced()
        except OSError as exc:
            raise Internal("the daemon cannot sync the calendar to disk; see its log") from exc

    def _record_or_undo(self, undo, **changes) -> None:
        try:
            self._record_calendar([], **changes)
        except Internal:
            undo()
            raise

    def _publish_calendar(self, items: list) -> None:
        for listener in self._listeners:
            listener(items)


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


