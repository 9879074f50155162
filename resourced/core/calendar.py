"""The calendar: bookings over time, admitted all or nothing over their whole interval.

A booking is a claim with a start and an end: whole GPUs (a count, or named ones), or a
VRAM share on one GPU, and any pool amounts, over the half-open interval
``[start, end)``.  Admission is the timeline's: what the booking takes must be free
throughout its interval, so nothing is held twice at any instant.  ``exclusive`` makes
a VRAM booking take its GPU whole (nobody else on it, the booker's own bookings
included).

Pure: every operation is given ``now`` and returns the booking and the events it caused,
or raises a ``ResourcedError`` and changes nothing.  Which caller may do what (the owner,
or an administrator with a reason) is decided here too, from the uid and an ``admin``
flag that the bus adapter got from polkit.

Lifecycle: scheduled -> active (at its start) -> ended (expired at its end, released or
cancelled early, with who and why).  ``due`` moves bookings along the clock and says when
next to call it.  Ended bookings stay (``history``) until ``prune`` drops those older than
the retention.  Operation ids make writes retry-safe: per user, the same request with
the same id answers the first result (``exists``); another request with a used id is
refused.
"""

import hashlib
import json
from collections import Counter
from dataclasses import asdict, dataclass, replace

from resourced.errors import (
    InvalidArgs,
    LimitExceeded,
    NoSuchClaim,
    NoSuchPool,
    NotClaimOwner,
    NotEnoughCapacity,
    NotEnoughGPUs,
    quoted,
)
from resourced.protocol.time import HOUR, USEC, iso_utc, usec_of_seconds

from .claims import Demand, check_named, check_text
from .clock import LAST_INSTANT, Deadlines
from .lifecycle import (
    ACTIVE,
    BOOKING,
    CANCELLED,
    ENDED,
    EXPIRED,
    JOB,
    JOB_STATES,
    NO_SHOW,
    RELEASED,
    SCHEDULED,
)
from .pools import format_amount
from .timeline import Hold, Timeline


@dataclass(frozen=True)
class Limits:
    """What the configuration allows (seconds; 0 = no limit)."""

    longest: float = 7 * 86400        # the longest booking
    horizon: float = 30 * 86400       # how far ahead a booking may start
    per_user: int = 64                # live (scheduled or active) bookings of one user
    retention: float = 30 * 86400     # how long ended bookings stay queryable
    gpu_hours_per_user: float = 0     # GPU-hours of one user's live bookings
    gpu_hours_per_session: float = 0  # ... of one session's
    exempt: frozenset[int] = frozenset()  # uids the per-user limits spare (never a session's)


@dataclass(frozen=True)
class BookingRequest:
    """What a caller asks for: ``demand`` for ``duration_usec``, at ``start_usec`` exactly or
    (None) at the earliest fit; on the GPUs ``named`` (all of them) or not ``excluded``."""

    demand: Demand
    duration_usec: int
    start_usec: int | None = None
    named: tuple[str, ...] = ()
    excluded: tuple[str, ...] = ()
    exclusive: bool = False
    label: str = ""
    task_name: str = ""
    isolate: bool = False  # its claim's commands run confined to its GPUs

    def __post_init__(self):
        if self.duration_usec <= 0:
            raise InvalidArgs("a booking must last more than 0 seconds")
        check_instant("the end", (self.start_usec or 0) + self.duration_usec)
        check_named(self.demand, self.named, self.excluded, "booked")
        check_text("label", self.label)
        check_text("task name", self.task_name)

    @property
    def takes(self) -> Demand:
        """What it holds: an exclusive VRAM booking takes a whole GPU (one with enough
        memory)."""
        d = self.demand
        return Demand(1, 0, d.pools) if self.exclusive and d.vram else d

    def on(self, memory: dict[str, int]) -> frozenset[str] | None:
        """The GPUs (of those with ``memory``) it may be placed on; None: any."""
        gpus = set(self.named or memory) - set(self.excluded)
        if self.exclusive and self.demand.vram:
            gpus = {u for u in gpus if memory[u] >= self.demand.vram}
        return None if gpus == set(memory) else frozenset(gpus)

    def fingerprint(self) -> str:
        """The same for the same request, whatever the start resolved to."""
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()


@dataclass(frozen=True)
class Booking:
    id: str
    uid: int
    user: str
    request: BookingRequest
    start_usec: int
    end_usec: int
    gpus: tuple[str, ...]          # held whole, or the one GPU of a share
    share: bool
    created_usec: int
    op_id: str = ""
    op_fingerprint: str = ""       # of the request the op id first made
    ops: tuple[tuple[int, str, str], ...] = ()  # later changes' (uid, op id, fingerprint)
    state: str = SCHEDULED
    ended: str = ""                # expired | released | cancelled | no-show
    ended_by: int = -1
    reason: str = ""
    ended_usec: int = 0
    session: str = ""              # the agent session it belongs to
    job: str = ""                  # its command's state (JOB_STATES); "" = no command
    job_exit: int = -1             # the command's exit status once it ended (-1: none)
    job_detail: str = ""           # the runner's word on it (a signal, why it was missed)

    @property
    def gpu_usec(self) -> int:
        """What it weighs against the GPU-hour limits: GPUs (a share: its one GPU) times
        length."""
        return len(self.gpus) * (self.end_usec - self.start_usec)

    def hold(self) -> Hold:
        d = self.request.demand
        return Hold(self.id, self.start_usec, self.end_usec,
                    whole=() if self.share else self.gpus,
                    share=self.gpus[0] if self.share else "",
                    vram=d.vram if self.share else 0, pools=d.pools)


@dataclass(frozen=True)
class Blackout:
    id: str
    start_usec: int
    end_usec: int
    reason: str


@dataclass(frozen=True)
class Notice:
    """A message from an administrator, shown by ``status`` until ``until_usec`` (0: until
    removed)."""

    id: str
    text: str
    created_usec: int
    until_usec: int = 0
    by: int = 0


@dataclass(frozen=True)
class BookingEvent:
    booking: Booking
    what: str  # created | changed | started | ended


class Calendar:
    def __init__(self, timeline: Timeline, limits: Limits = Limits(),
                 labels: dict[str, str] | None = None):
        self.timeline = timeline
        self.limits = limits
        self.labels = labels or {}  # GPU UUID -> the name messages use (gpu0, an alias)
        self.bookings: dict[str, Booking] = {}
        self.blackouts: dict[str, Blackout] = {}
        self.notices: dict[str, Notice] = {}
        self._ops: dict[tuple[int, str], tuple[str, str]] = {}  # (uid, op id) -> (fingerprint, id)
        self._due = Deadlines()  # booking id -> its start (scheduled) or end (active)
        self._live_of: dict[int, int] = {}  # uid -> its scheduled and active bookings
        self._booked_of: Counter = Counter()  # uid, and (uid, session) -> live GPU-usec

    def load(self, bookings: dict[str, Booking], blackouts: dict[str, Blackout],
             notices: dict[str, Notice]) -> list[Booking]:
        """Take back what the store held; returns the live bookings that no longer fit the
        inventory (a GPU or pool gone), ended here as cancelled."""
        dropped = []
        self.blackouts.update(blackouts)
        self.notices.update(notices)
        for booking in sorted(bookings.values(), key=lambda b: b.created_usec):
            if booking.state != ENDED and not self._fits_inventory(booking):
                booking = replace(booking, state=BOOKING.move(booking.state, ENDED),
                                  ended=CANCELLED,
                                  reason="its GPU or pool is no longer managed",
                                  ended_usec=booking.created_usec)
                dropped.append(booking)
            self._put(booking)
            if booking.op_id:
                self._ops[(booking.uid, booking.op_id)] = (booking.op_fingerprint, booking.id)
            for uid, op_id, fingerprint in booking.ops:
                self._ops[(uid, op_id)] = (fingerprint, booking.id)
        return dropped

    def put_back(self, booking_id: str, old: "Booking | None") -> None:
        """Undo a change that could not be recorded: the booking as it was (None: it did not
        exist)."""
        current = self.bookings.get(booking_id)
        if current is not None:
            self._drop(current)
            del self.bookings[booking_id]
        if old is not None:
            self._put(old)
        else:
            self._ops = {k: v for k, v in self._ops.items() if v[1] != booking_id}

    def next_due(self) -> int | None:
        """When ``due`` next has something to do."""
        return self._due.next()

    # -- booking -----------------------------------------------------------------------
    def book(self, request: BookingRequest, booking_id: str, uid: int, user: str, now: int,
             op_id: str = "", session: str = "") -> tuple[Booking, str, list[BookingEvent]]:
        """Admit a booking; returns it with ``created`` (or ``exists``: an op id replayed)."""
        if op_id:
            seen = self._ops.get((uid, op_id))
            if seen is not None:
                if seen[0] != request.fingerprint():
                    raise InvalidArgs(f"operation id {quoted(op_id)} was used for another request")
                return self.bookings[seen[1]], "exists", []
        live = self._live_of.get(uid, 0)
        if uid not in self.limits.exempt and self.limits.per_user and live >= self.limits.per_user:
            raise LimitExceeded(f"uid {uid} already has {live} bookings, the most one user may "
                                "have (max_bookings_per_user)")
        start, gpus, share = self._admit(request, now)
        booking = Booking(booking_id, uid, user, request, start, start + request.duration_usec,
                          gpus, share, now, op_id, request.fingerprint() if op_id else "",
                          session=session)
        self._check_hours(booking)
        self._put(booking)
        if op_id:
            self._ops[(uid, op_id)] = (request.fingerprint(), booking_id)
        return booking, "created", [BookingEvent(booking, "created")]

    def edit(self, booking_id: str, request: BookingRequest, uid: int, now: int,
             admin: bool = False, op_id: str = "") -> tuple[Booking, list[BookingEvent]]:
        """Change anything of a booking that has not started, re-admitted against the
        calendar without itself."""
        return self._once(uid, op_id, ("edit", booking_id, request.fingerprint()),
                          lambda: self._edit(booking_id, request, uid, now, admin))

    def _edit(self, booking_id, request, uid, now, admin):
        old = self._own(booking_id, uid, admin)
        if old.state != SCHEDULED:
            raise InvalidArgs(f"booking {booking_id} has started: only its end can change "
                              "(extend, or shrink down to now)")
        start, gpus, share = self._admit(request, now, ignore=frozenset({booking_id}),
                                         kept=(old.start_usec, old.end_usec))
        new = replace(old, request=request, start_usec=start,
                      end_usec=start + request.duration_usec, gpus=gpus, share=share)
        self._check_hours(new, old)
        return self._replace(new, "changed")

    def set_end(self, booking_id: str, end_usec: int, uid: int, now: int,
                admin: bool = False, op_id: str = "", by_usec: int = 0,
                ) -> tuple[Booking, list[BookingEvent]]:
        """Extend (admitted on the added part only, on the same GPUs) or shrink (not before
        now: what is given back is free at once) to ``end_usec``, or ``by_usec`` past the
        end it has (so that a replayed op id extends once)."""
        return self._once(uid, op_id, ("end", booking_id, end_usec, by_usec),
                          lambda: self._set_end(booking_id, end_usec, uid, now, admin, by_usec))

    def _set_end(self, booking_id, end_usec, uid, now, admin, by_usec):
        old = self._own(booking_id, uid, admin)
        if by_usec:
            end_usec = old.end_usec + by_usec
        if old.state == ENDED:
            raise InvalidArgs(f"booking {booking_id} has ended")
        floor = max(now, old.start_usec)
        check_instant("the new end", end_usec)
        if end_usec <= floor:
            raise InvalidArgs("the new end must be after now and after the start")
        if end_usec - old.start_usec > self.limits.longest * USEC > 0:
            raise InvalidArgs(f"a booking may last at most {_span(self.limits.longest)}")
        if end_usec > old.end_usec:
            added = replace(old.request, duration_usec=end_usec - old.end_usec, start_usec=None)
            placed = self.timeline.fit(added.takes, old.end_usec, added.duration_usec,
                                       frozenset({booking_id}), frozenset(old.gpus),
                                       self._blocked())
            if placed is None or _gpus(*placed) != old.gpus:
                raise NotEnoughCapacity(f"booking {booking_id} cannot be extended to that end: "
                                        f"{self._in_the_way(old, end_usec)}")
        request = replace(old.request, duration_usec=end_usec - old.start_usec)
        new = replace(old, request=request, end_usec=end_usec)
        self._check_hours(new, old)
        return self._replace(new, "changed")

    def cancel(self, booking_id: str, uid: int, now: int, admin: bool = False,
               reason: str = "", op_id: str = "") -> tuple[Booking, list[BookingEvent]]:
        """End a booking now: a scheduled one is cancelled, an active one released.  Someone
        else's needs ``admin`` and a reason, which its owner then sees."""
        return self._once(uid, op_id, ("cancel", booking_id, reason),
                          lambda: self._cancel(booking_id, uid, now, admin, reason))

    def _cancel(self, booking_id, uid, now, admin, reason):
        old = self._own(booking_id, uid, admin)
        if old.state == ENDED:
            if old.ended == CANCELLED and uid == old.uid:  # its owner's retry: it happened
                return old, []
            raise InvalidArgs(f"booking {booking_id} ended already ({old.ended} at "
                              f"{iso_utc(old.ended_usec)})")
        if uid != old.uid and uid != 0 and not reason:
            raise InvalidArgs("cancelling someone else's booking needs a reason")
        check_text("reason", reason)
        how = CANCELLED if old.state == SCHEDULED else RELEASED
        return self._end(old, how, uid, reason, now)

    def no_show(self, booking_id: str, now: int, reason: str
                ) -> tuple[Booking, list[BookingEvent]]:
        """End an active booking whose GPUs its owner never used (ended ``NO_SHOW``)."""
        old = self.bookings[booking_id]
        if old.state != ACTIVE:
            raise InvalidArgs(f"booking {booking_id} is not active")
        return self._end(old, NO_SHOW, -1, reason, now)

    def set_job(self, booking_id: str, uid: int, state: str, exit_code: int = -1,
                detail: str = "") -> tuple[Booking, list[BookingEvent]]:
        """Record what the owner's runner says of the booking's command (owner only; an
        ended booking too: a command may be stopped just after its end): the first report
        in any state, then only the moves of ``JOB`` (or the same state again)."""
        old = self._own(booking_id, uid, admin=False)
        if state not in JOB_STATES:
            raise InvalidArgs(f"job state must be one of {', '.join(JOB_STATES)}, not "
                              f"{quoted(state)}")
        if old.job and state != old.job and not JOB.allows(old.job, state):
            raise InvalidArgs(f"the command of {booking_id} is {old.job}: it cannot become "
                              f"{state}")
        check_text("detail", detail)
        booking = replace(old, job=state, job_exit=exit_code, job_detail=detail)
        self.bookings[booking_id] = booking  # the hold is the same: the job is not held
        return booking, [BookingEvent(booking, "job")]

    # -- the clock ---------------------------------------------------------------------
    def due(self, now: int) -> tuple[list[BookingEvent], int | None]:
        """Start what starts by ``now``, end what ends by it; and when to call again."""
        events = []
        for booking_id in self._due.due(now):
            b = self.bookings[booking_id]
            if b.state == SCHEDULED:
                b = self.bookings[b.id] = replace(b, state=BOOKING.move(b.state, ACTIVE))
                events.append(BookingEvent(b, "started"))
            if b.end_usec <= now:
                events += self._end(b, EXPIRED, -1, "", b.end_usec)[1]
            else:
                self._due.set(b.id, b.end_usec)
        return events, self._due.next()

    def prune(self, now: int) -> list[str]:
        """Forget ended bookings older than the retention; returns their ids."""
        cutoff = now - usec_of_seconds(self.limits.retention)
        gone = [b.id for b in self.bookings.values() if b.state == ENDED and b.ended_usec < cutoff]
        gone += [n.id for n in self.notices.values() if 0 < n.until_usec <= now]
        for item_id in gone:
            self.bookings.pop(item_id, None)
            self.notices.pop(item_id, None)
        self._ops = {k: v for k, v in self._ops.items() if v[1] in self.bookings}
        return gone

    # -- notices -----------------------------------------------------------------------
    def add_notice(self, notice: Notice) -> None:
        if not notice.text.strip():
            raise InvalidArgs("a notice needs a text")
        check_instant("the notice's end", notice.until_usec)
        check_text("notice", notice.text)
        self.notices[notice.id] = notice

    def remove_notice(self, notice_id: str) -> Notice:
        try:
            return self.notices.pop(notice_id)
        except KeyError:
            raise NoSuchClaim(f"no notice {quoted(notice_id)}") from None

    # -- blackouts ---------------------------------------------------------------------
    def add_blackout(self, blackout: Blackout) -> list[Booking]:
        """Nothing new is placed in the window; the bookings already in it stay (returned,
        so their owners can be told)."""
        if blackout.end_usec <= blackout.start_usec:
            raise InvalidArgs("a blackout must end after it starts")
        check_instant("the blackout's end", blackout.end_usec)
        check_text("reason", blackout.reason)
        self.blackouts[blackout.id] = blackout
        return [b for b in self.bookings.values() if b.state != ENDED
                and b.start_usec < blackout.end_usec and blackout.start_usec < b.end_usec]

    def remove_blackout(self, blackout_id: str) -> Blackout:
        try:
            return self.blackouts.pop(blackout_id)
        except KeyError:
            raise NoSuchClaim(f"no blackout {quoted(blackout_id)}") from None

    # -- views -------------------------------------------------------------------------
    def slots(self, request: BookingRequest, now: int, count: int = 3) -> list[tuple[int, tuple[str, ...]]]:
        """The earliest ``count`` distinct starts where ``request`` would fit (read-only)."""
        self._check_request(request)
        if request.start_usec is not None:
            self._check_horizon(request.start_usec, now)
        found, not_before = [], max(now, request.start_usec or now)
        while len(found) < count:
            fit = self.timeline.earliest(request.takes, request.duration_usec,
                                         not_before, allowed=request.on(self.timeline.memory),
                                         blocked=self._blocked())
            if fit is None or (self.limits.horizon and fit[0] - now > self.limits.horizon * USEC):
                break  # never, or not within the horizon: book would refuse it
            start, whole, share = fit
            found.append((start, _gpus(whole, share)))
            later = [e for e in self._ends() if e > start]
            if not later:
                break
            not_before = min(later)
        return found

    def check_invariants(self) -> None:
        self.timeline.check_invariants()
        live = {b.id for b in self.bookings.values() if b.state != ENDED}
        assert live <= set(self.timeline.holds), "a live booking holds nothing"
        assert all(b in self._due for b in live), "a live booking is not due for anything"
        per_user: dict[int, int] = {}
        for booking_id in live:
            uid = self.bookings[booking_id].uid
            per_user[uid] = per_user.get(uid, 0) + 1
        assert per_user == self._live_of, "live bookings per user"
        booked: Counter = Counter()
        for booking_id in live:
            b = self.bookings[booking_id]
            booked.update({b.uid: b.gpu_usec, (b.uid, b.session): b.gpu_usec})
        assert +booked == self._booked_of, "GPU-usec booked per user and session"
        for booking_id in live:
            assert self.timeline.holds[booking_id] == self.bookings[booking_id].hold()

    # -- internals ---------------------------------------------------------------------
    def _once(self, uid: int, op_id: str, what: tuple, change) -> tuple[Booking, list[BookingEvent]]:
        """Make ``change`` once per (uid, ``op_id``): a replay of the same ``what`` answers
        the booking as it is, with no events; another request with that id is refused."""
        if not op_id:
            return change()
        fingerprint = hashlib.sha256(json.dumps(what).encode()).hexdigest()
        seen = self._ops.get((uid, op_id))
        if seen is not None:
            if seen[0] != fingerprint:
                raise InvalidArgs(f"operation id {quoted(op_id)} was used for another request")
            return self.bookings[seen[1]], []
        booking, events = change()
        booking = replace(booking, ops=(*booking.ops, (uid, op_id, fingerprint)))
        self.bookings[booking.id] = booking  # the hold is the same: ops are not held
        self._ops[(uid, op_id)] = (fingerprint, booking.id)
        return booking, [replace(e, booking=booking) if e.booking.id == booking.id else e
                         for e in events]

    def _admit(self, request: BookingRequest, now: int, ignore: frozenset[str] = frozenset(),
               kept: tuple[int, int] | None = None) -> tuple[int, tuple[str, ...], bool]:
        """Where and when ``request`` goes; an edit keeps the time it had (``kept``) even
        inside a blackout added since."""
        duration = request.duration_usec
        self._check_request(request)
        demand, allowed = request.takes, request.on(self.timeline.memory)
        blocked = self._blocked(kept)
        start = request.start_usec
        if start is not None:
            if start < now:
                raise InvalidArgs("the start is in the past")
            self._check_horizon(start, now)
            placed = self.timeline.fit(demand, start, duration, ignore, allowed, blocked)
            if placed is None:
                raise NotEnoughCapacity(self._refusal(request, demand, start, now, ignore, blocked))
        else:
            fit = self.timeline.earliest(demand, duration, now, ignore, allowed, blocked)
            if fit is None:
                raise NotEnoughCapacity(f"it never fits{self._never_why(ignore)}")
            start, *placed = fit
            self._check_horizon(start, now)
        whole, share = placed
        return start, _gpus(whole, share), bool(share)

    def _refusal(self, request, demand, start, now, ignore, blocked) -> str:
        """Why an exact start does not fit, and the nearest start that would (and where)."""
        allowed = request.on(self.timeline.memory)
        args = (ignore, allowed, blocked)
        after = self.timeline.earliest(demand, request.duration_usec, start, *args)
        before = self.timeline.latest_before(demand, request.duration_usec, start, now, *args)
        nearest = min((f for f in (after, before) if f is not None),
                      key=lambda f: abs(f[0] - start), default=None)
        unblocked = self.timeline.fit(demand, start, request.duration_usec, ignore, allowed)
        why = "falls in a blackout" if unblocked is not None else "does not fit then"
        if nearest is None:
            return f"{_describe(demand)} {why}, and never fits{self._never_why(ignore)}"
        where = ", ".join(self.labels.get(u, u) for u in _gpus(*nearest[1:])) or "the pools"
        return (f"{_describe(demand)} {why}; the nearest start that fits: {iso_utc(nearest[0])} "
                f"on {where}")

    def _never_why(self, ignore) -> str:
        """What keeps a request from ever fitting: the claims without an end (a booking
        always has one), and what would change it."""
        open_ended = sorted(h.id for h in self.timeline.holds.values()
                            if h.end is None and h.id not in ignore)
        if not open_ended:
            return ""
        shown = ", ".join(open_ended[:5]) + (" ..." if len(open_ended) > 5 else "")
        return (f": claims without an end hold what it needs ({shown}); it fits once they "
                "are released (gpuctl release REF) or made with --for")

    def _check_request(self, request: BookingRequest) -> None:
        """What makes a request impossible whenever it is: too long, more than there is."""
        if self.limits.longest and request.duration_usec > self.limits.longest * USEC:
            raise InvalidArgs(f"a booking may last at most {_span(self.limits.longest)}")
        _check_satisfiable(request, self.timeline)

    def _check_horizon(self, start: int, now: int) -> None:
        if self.limits.horizon and start - now > self.limits.horizon * USEC:
            raise InvalidArgs(f"bookings may start at most {_span(self.limits.horizon)} ahead")

    def _in_the_way(self, old: Booking, until: int) -> str:
        """Why ``old`` cannot last until ``until`` on its GPUs: the first booking, claim or
        blackout on one of them after its end, and the latest end that fits; what cannot
        be said simply (pools, shares beside a share) in general words."""
        mine = set(old.gpus)
        first: tuple[int, str] | None = None
        for h in self.timeline.holds.values():
            theirs = set(h.whole) | ({h.share} if h.share and not old.share else set())
            if h.id == old.id or not mine & theirs or not h.overlaps(old.end_usec, until):
                continue
            other = self.bookings.get(h.id)
            what = f"{other.user}'s booking {h.id}" if other else f"claim {h.id}"
            when = max(h.start, old.end_usec)
            if first is None or when < first[0]:
                first = (when, what)
        for b in self.blackouts.values():
            if b.start_usec < until and b.end_usec > old.end_usec:
                when = max(b.start_usec, old.end_usec)
                if first is None or when < first[0]:
                    first = (when, f"blackout {b.id}")
        if first is None:
            return "its GPUs or amounts are booked then"
        when, what = first
        where = ", ".join(self.labels.get(u, u) for u in old.gpus)
        if when <= old.end_usec:
            return f"{what} holds {where} from its end on"
        return (f"{what} holds {where} from {iso_utc(when)}; the latest end that fits is "
                f"{iso_utc(when)}")

    def _blocked(self, kept: tuple[int, int] | None = None) -> tuple[tuple[int, int], ...]:
        """The blackout windows, less the time ``kept`` (what an edited booking had)."""
        windows = [(b.start_usec, b.end_usec) for b in self.blackouts.values()]
        if kept is not None:
            windows = [piece for start, end in windows
                       for piece in ((start, min(end, kept[0])), (max(start, kept[1]), end))
                       if piece[0] < piece[1]]
        return tuple(windows)

    def _ends(self) -> list[int]:
        return [h.end for h in self.timeline.holds.values() if h.end is not None] + [
            b.end_usec for b in self.blackouts.values()]

    def _check_hours(self, booking: Booking, old: Booking | None = None) -> None:
        """Refuse a booking (or a change: ``old`` is what it replaces) that takes its user or
        session past their GPU-hours (a user the configuration exempts: its session's only)."""
        if old is not None and booking.gpu_usec <= old.gpu_usec:
            return
        added = booking.gpu_usec - (old.gpu_usec if old is not None else 0)
        per_user = 0 if booking.uid in self.limits.exempt else self.limits.gpu_hours_per_user
        for key, most, name in (
                (booking.uid, per_user, "max_booked_gpu_hours_per_user"),
                ((booking.uid, booking.session), self.limits.gpu_hours_per_session,
                 "max_booked_gpu_hours_per_session")):
            booked = self._booked_of[key]
            if most and booked + added > most * HOUR:
                whose = f"uid {booking.uid}" if name.endswith("user") else \
                    f"session {booking.session}"
                raise LimitExceeded(
                    f"{whose} has {booked / HOUR:g} GPU-hour(s) booked; {added / HOUR:g} "
                    f"more would pass the most allowed, {most:g} ({name})")

    def _own(self, booking_id: str, uid: int, admin: bool) -> Booking:
        booking = self.bookings.get(booking_id)
        if booking is None:
            raise NoSuchClaim(f"no booking {quoted(booking_id)}")
        if not admin and uid not in (0, booking.uid):
            raise NotClaimOwner(f"booking {booking_id} belongs to {booking.user or booking.uid}")
        return booking

    def _fits_inventory(self, booking: Booking) -> bool:
        return (all(u in self.timeline.memory for u in booking.gpus)
                and all(n in self.timeline.capacity for n, _ in booking.request.demand.pools))

    def _put(self, booking: Booking) -> None:
        """Record a booking; a live one holds its interval and is due at its next change."""
        self.bookings[booking.id] = booking
        if booking.state != ENDED:
            self.timeline.add(booking.hold())
            self._due.set(booking.id, booking.start_usec if booking.state == SCHEDULED
                          else booking.end_usec)
            self._live_of[booking.uid] = self._live_of.get(booking.uid, 0) + 1
            for key in (booking.uid, (booking.uid, booking.session)) if booking.gpu_usec else ():
                self._booked_of[key] += booking.gpu_usec

    def _drop(self, booking: Booking) -> None:
        """Undo what ``_put`` did for a live booking."""
        if booking.state != ENDED:
            self.timeline.remove(booking.id)
            self._due.cancel(booking.id)
            self._live_of[booking.uid] -= 1
            if not self._live_of[booking.uid]:
                del self._live_of[booking.uid]
            for key in (booking.uid, (booking.uid, booking.session)) if booking.gpu_usec else ():
                self._booked_of[key] -= booking.gpu_usec
                if not self._booked_of[key]:
                    del self._booked_of[key]

    def _replace(self, booking: Booking, what: str) -> tuple[Booking, list[BookingEvent]]:
        self._drop(self.bookings[booking.id])
        self._put(booking)
        return booking, [BookingEvent(booking, what)]

    def _end(self, booking: Booking, how: str, by: int, reason: str,
             when: int) -> tuple[Booking, list[BookingEvent]]:
        self._drop(booking)
        end = when if how in (RELEASED, NO_SHOW) else booking.end_usec  # ended early: then
        ended = replace(booking, state=BOOKING.move(booking.state, ENDED), ended=BOOKING.end(how),
                        ended_by=by, reason=reason,
                        ended_usec=when, end_usec=end)
        self._put(ended)
        return ended, [BookingEvent(ended, "ended")]


def check_instant(name: str, usec: int) -> None:
    if not 0 <= usec <= LAST_INSTANT:
        raise InvalidArgs(f"{name} is out of range: times run up to the year 9999")


def _gpus(whole: tuple[str, ...], share: str) -> tuple[str, ...]:
    """The GPUs of a placement: those held whole, or the one of the share (or none)."""
    return whole or ((share,) if share else ())


def _describe(d: Demand) -> str:
    parts = [f"{d.gpus} GPU(s)"] if d.gpus else []
    if d.vram:
        parts.append(f"VRAM {format_amount(d.vram, 'bytes')}")
    parts += [f"{name} {amount}" for name, amount in d.pools]
    return ", ".join(parts)


def _span(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


def _check_satisfiable(request: BookingRequest, timeline: Timeline) -> None:
    """What makes a request impossible on this inventory, whenever it is."""
    demand, allowed = request.takes, request.on(timeline.memory)
    gpus = [u for u in timeline.memory if allowed is None or u in allowed]
    unknown = set(request.named + request.excluded) - set(timeline.memory)
    if unknown:
        raise InvalidArgs(f"no GPU {quoted(min(unknown))}")
    # More than there is: refused as a claim is (never_fits), whatever is asked.
    if demand.gpus > len(gpus):
        raise NotEnoughGPUs(f"{demand.gpus} GPU(s) wanted, {len(gpus)} may be used")
    biggest = max(timeline.memory.values(), default=0)
    if request.demand.vram > biggest:
        raise NotEnoughCapacity(f"{format_amount(request.demand.vram, 'bytes')} of VRAM wanted, "
                                f"the largest GPU has {format_amount(biggest, 'bytes')}")
    for name, amount in demand.pools:
        if name not in timeline.capacity:
            known = ", ".join(sorted(timeline.capacity)) or "none"
            raise NoSuchPool(f"no pool {quoted(name)}; pools: {known}")
        if amount > timeline.capacity[name]:
            raise NotEnoughCapacity(f"more {name} than the pool holds")
