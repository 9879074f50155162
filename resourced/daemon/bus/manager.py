"""``org.resourced.Manager`` at /org/resourced: lookups, listings, claims, signals.

Handlers decide nothing: who is calling, decode, call the engine, encode the reply.
The engine's events come back through ``_publish``, the one place that unexports claim
objects and emits signals and PropertiesChanged, once per change.

Claim objects are exported when first needed, not at every claim: a dbus-fast object
costs about 100 us and a few kB, which a daemon holding 10,000 claims should not pay
for objects nobody looks at.  A claim's object appears the moment anything needs it:
a call to its path, a signal it must emit (except a waiter's ``Granted``, ``Cancelled``
and state change, sent from its path without one: an object for each waiter cost more
than the rest of its wait), an Introspect of a path above it (so ``busctl tree`` shows
every claim) or ``GetManagedObjects``.  To a client it is there from the ``ClaimNew``
on, as before.

``/org/resourced`` is also an ``org.freedesktop.DBus.ObjectManager`` (see
``connection.py``).  The bus announces the objects exported at start (GPUs, pools,
checks, and checks again after a reload) and the per-user ones; claims, exported
lazily and quietly, are announced here: ``InterfacesAdded`` (their ``org.resourced.Claim``
properties, read from the record without exporting) just before ``ClaimNew``, and
``InterfacesRemoved`` just before ``ClaimRemoved``, whether or not the object was ever
exported.
"""

import contextlib
import json

from dbus_fast import Message, MessageFlag, MessageType, PropertyAccess
from dbus_fast.service import dbus_method, dbus_property, dbus_signal

from resourced import __version__
from resourced.config import ConfigError
from resourced.core.calendar import check_instant
from resourced.core.claims import ClaimOptions, Demand, check_named
from resourced.core.verify import GpuReport
from resourced.errors import (
    AccessDenied,
    InteractiveAuthorizationRequired,
    InvalidArgs,
    NotClaimOwner,
)
from resourced.protocol.names import (
    CLAIM_PREFIX,
    MANAGER_IFACE,
    MANAGER_PATH,
    RELEASE_DRY_RUN,
    RELEASE_FORCE,
    check_path,
    claim_path,
    gpu_path,
    pool_path,
    user_path,
)
from resourced.protocol.records import (
    BOOK_OPTIONS,
    CHANGE_OPTIONS,
    CLAIM_OPTIONS,
    END_OPTIONS,
    JOB_OPTIONS,
    OPTIONS,
    PROCESS,
    REPORT,
    SLOT,
    STOP_OPTIONS,
    USAGE_OPTIONS,
    wire,
)
from resourced.protocol.time import DAY

from .. import memory
from ..engine.engine import Engine
from ..health_monitor import HealthMonitor
from .bookings import (
    MAX_SLOTS,
    BookingTexts,
    UserInterface,
    blackout_record,
    booking_fields,
    booking_record,
    booking_request,
    list_filter,
    notice_record,
)
from .caller import Credentials, current_call
from .claim import ClaimInterface
from .connection import REPLY_LATER, eager_methods
from .departures import Departures
from .describe import StateView
from .errors import bus_errors
from .gpu import GpuInterface
from .health import CheckInterface
from .held_calls import HeldCalls
from .interface import Interface
from .options import parse_options, wire_record
from .polkit import CLAIM, MANAGE, RELEASE_OTHER, RESERVE, Authority, GroupAuthority, SharedAccess
from .pool import PoolInterface
from .signals import Signals
from .throttle import Throttle

R = PropertyAccess.READ

RELEASE_FLAGS = RELEASE_FORCE | RELEASE_DRY_RUN
DAY_USEC = DAY
FEATURES = ["claims", "dev-claims", "verify", "health", "pools", "queue", "reclaim",
            "bookings", "slurm-jobs", "reply-when-granted", "metrics", "diagnose"]



class ManagerInterface(Interface):
    CONST_PROPERTIES = frozenset({"Version", "Mode", "Instance", "Backend", "BackendNote",
                                  "Features", "NGPUs"})
    OUT_NAMES = {
        "Claim": ("claim_id", "claim", "grant"),
        "GetClaim": ("claim",),
        "GetGrant": ("grant",),
        "GetClaimByCall": ("claim_id", "claim", "grant"),
        "ListGPUs": ("gpus",),
        "ListClaims": ("claims",),
        "ListPools": ("pools",),
        "Describe": ("json",),
        "Release": ("warnings",),
        "ReleaseGPU": ("claim_id",),
        "Confine": ("unit",),
        "Verify": ("report",),
        "Reload": ("applied", "needs_restart"),
        "ClaimNew": ("claim_id", "claim"),
        "ClaimRemoved": ("claim_id", "claim", "reason"),
        "LevelChanged": ("check", "old_level", "new_level", "reason"),
        "Book": ("status", "booking"),
        "EditBooking": ("booking",),
        "SetBookingEnd": ("booking",),
        "CancelBooking": ("booking",),
        "ListBookings": ("json",),
        "GetBooking": ("booking",),
        "FindSlots": ("slots",),
        "AddBlackout": ("blackout_id", "bookings_inside"),
        "ListBlackouts": ("blackouts",),
        "AddNotice": ("notice_id",),
        "ListNotices": ("notices",),
        "NoticeAdded": ("notice_id", "text"),
        "Stop": ("claims", "bookings"),
        "ReportJob": ("booking",),
        "Usage": ("json",),
        "Metrics": ("text",),
        "Diagnose": ("json",),
        "ClaimJob": ("claim_id", "claim"),
        "ReleaseJob": ("claim_ids",),
    }

    def __init__(self, bus, engine: Engine, mode: str, health: HealthMonitor, reload=None,
                 shared: SharedAccess | None = None, metrics=None, diagnose=None,
                 instance: str = ""):
        super().__init__(MANAGER_IFACE)
        self.engine = engine
        self.mode = mode
        self.health = health
        self.reload = reload
        self.metrics = metrics  # the Metrics the daemon keeps (resourced.daemon.metrics)
        self.diagnose = diagnose  # async () -> the daemon's checks (resourced.daemon.self_check)
        self._checks: dict[str, CheckInterface] = {}
        self._pools: dict[str, PoolInterface] = {}
        self.shared = shared
        self._bind(bus)
        engine.after_reply.hold(lambda: self.bus.batch())  # a turn's signals: one write
        engine.after_reply.wait_for(lambda: self.bus.unanswered > 0)
        self._gpus: dict[str, GpuInterface] = {}
        self._claims: dict[str, ClaimInterface] = {}  # the claim objects exported so far
        self._waiting: set[str] = set()  # queued claims (their outcome is signalled so)
        self._can_keep_calls = eager_methods(bus)  # (ReplyWhenGranted; else Wait's reply)
        self.signals = Signals(self)
        self._totals = Throttle(self.signals.announce_totals)
        self._users: dict[int, UserInterface] = {}  # per-user signal objects, made when needed
        self._texts = BookingTexts()
        self.instance = instance  # this daemon's identity (resourced.daemon.store.instance)
        self.view = StateView(engine, mode, health)

    def _bind(self, bus) -> None:
        self.bus = bus
        self.departures = Departures(bus)
        self.held = HeldCalls(self.departures, lambda claim_id: self.engine.withdraw(
            claim_id, "the caller waiting on it left the bus"))
        self.managers_watching: set[str] = set()  # object-manager clients on the bus now
        self.authority = (GroupAuthority(bus, *self.shared) if self.shared
                          else Authority(bus, enabled=self.mode == "system"))
        self.credentials = Credentials(bus)

    def export(self) -> None:
        """Export the manager and one object per GPU; follow the engine from now on."""
        self._export_objects()
        self.engine.subscribe(self.signals.publish)
        self.health.subscribe(self.signals.levels)
        self.health.on_sample(self.signals.figures)

    def move_to(self, bus) -> None:
        """Serve on a new connection (the shared bus was restarted): the objects leave the
        old one and are exported on the new one; claim objects again when asked for."""
        self.bus.unexport_all()
        self._bind(bus)
        self._claims.clear()
        self._users.clear()
        self._waiting.clear()
        self._export_objects()

    def _export_objects(self) -> None:
        self.bus.export(MANAGER_PATH, self)
        gpus = list(self.engine.ledger.gpus.values())
        for gpu in gpus:
            iface = GpuInterface(gpu, self.engine)
            self._gpus[gpu.uuid] = iface
            self.bus.export(gpu_path(gpu.index), iface)
        for pool in self.engine.ledger.pools.values():
            self._pools[pool.name] = PoolInterface(pool, self.engine.ledger)
            self.bus.export(pool_path(pool.name), self._pools[pool.name])
        self._waiting.update(claim.id for claim in list(self.engine.ledger.waiting))
        self.bus.add_message_handler(self._export_claims_for)
        self._export_checks()

    async def settled(self) -> None:
        await self.engine.bookings.synced()

    # -- methods -----------------------------------------------------------------------
    @dbus_method()
    @bus_errors
    async def Claim(self, gpus: "u", options: "a{sv}") -> "soa{sv}":
        opts = parse_options(options, CLAIM_OPTIONS)
        call = current_call.get()
        keep = (opts.get("reply_when_granted", False) and self._can_keep_calls
                and not call.flags & MessageFlag.NO_REPLY_EXPECTED)
        with self.held.deciding(call) if keep else contextlib.nullcontext():
            return await self._claim(call, keep, gpus, opts)

    async def _claim(self, call: Message, keep: bool, gpus: int, opts: dict) -> list:
        caller = await self.credentials.caller()
        await self.authority.check(call, caller.uid, CLAIM, {
            "gpus": str(gpus), "mode": opts.get("mode", "run"), "label": opts.get("label", "")})
        if opts.get("isolate") is False and self.engine.settings.isolation == "always" \
                and caller.uid != 0:  # only an administrator runs unconfined here
            await self.authority.check(call, caller.uid, MANAGE, {"isolate": "false"})
        await self._check_priority(call, caller.uid, opts.get("priority", 0))
        demand = Demand.of(gpus, opts.pop("vram_bytes", 0), opts.pop("pools", None))
        on = self._placed_on(demand, opts.pop("gpu_names", None), opts.pop("exclude", None))
        held = opts.pop("reply_when_granted", False)
        ask = ClaimOptions(demand, on=on, wait=opts.pop("wait", False) or held,
                           member_pids=tuple(opts.pop("member_pids", ())), **opts)
        claim, warnings = await self.engine.claim(caller, ask, call.serial)
        if ask.dry_run:  # no claim was made: no reference, no object
            return ["", "/", self.view.grant(claim, warnings, dry_run=True)]
        if keep and claim.id in self._waiting:
            self.held.hold(claim.id, call, warnings)  # answered by _tell_waiter
            return REPLY_LATER
        return [claim.id, claim_path(claim.id), self.view.grant(claim, warnings)]

    async def _check_priority(self, call: Message, uid: int, priority: int) -> None:
        """A priority above ``max_priority`` needs the manage action: it goes ahead of
        everyone's waiters and asks reclaimable leases back.  (On the session bus, one
        person's, the authority allows everything.)"""
        bound = self.engine.settings.max_priority
        if not bound or priority <= bound:
            return
        try:
            await self.authority.check(call, uid, MANAGE, {"priority": str(priority)})
        except (AccessDenied, InteractiveAuthorizationRequired) as exc:
            raise type(exc)(f"priority {priority} is above max_priority ({bound}): "
                            f"{exc.message}") from None

    def _placed_on(self, demand: Demand, names: list[str] | None,
                   exclude: list[str] | None) -> tuple[str, ...]:
        """The GPUs a claim may go on, from GPUNames (those, whole; or the one of a VRAM
        share) and Exclude (all but those), as Book reads them; () for any."""
        if names is None and exclude is None:
            return ()
        ledger = self.engine.ledger
        named = tuple(ledger.gpu_by_name(n).uuid for n in names or ())
        excluded = tuple(ledger.gpu_by_name(n).uuid for n in exclude or ())
        check_named(demand, named, excluded, "claimed")
        if excluded:
            return tuple(u for u in ledger.gpus if u not in excluded)
        return named

    @dbus_method()
    @bus_errors
    async def Release(self, claim_id: "s", flags: "t") -> "as":
        return await self.release(claim_id, flags)

    @dbus_method()
    @bus_errors
    async def Confine(self, claim_id: "s", pid: "u") -> "s":
        """Run the caller's process ``pid`` in isolated claim ``claim_id``'s scope, where
        it opens the claim's GPUs and no others (before it execs its command); the
        scope's unit name."""
        return await self.engine.confine(await self.credentials.caller(), claim_id, pid)

    @dbus_method()
    @bus_errors
    async def ReleaseGPU(self, gpu: "s", reason: "s") -> "s":
        claim_id = self.engine.holder_of(gpu).id
        await self._release(claim_id, force=True, reason=reason)
        return claim_id

    @dbus_method()
    @bus_errors
    async def ClaimJob(self, job_id: "s", gpus: "as", options: "a{sv}") -> "so":
        """Slurm job ``job_id``'s GPUs here (names) become its claim, in mode slurm (its
        prolog, as root; anyone else needs manage).  ``UID``: the job's user (default: the
        caller); ``Name``: the job's name, for the label."""
        opts = parse_options(options, JOB_OPTIONS)
        caller = await self._manager()
        claim = await self.engine.jobs.claim(caller, job_id, list(gpus),
                                             opts.get("uid", caller.uid), opts.get("name", ""))
        return [claim.id, claim_path(claim.id)]

    @dbus_method()
    @bus_errors
    async def ReleaseJob(self, job_id: "s") -> "as":
        """End Slurm job ``job_id``'s claim (its epilog); the claims ended."""
        await self._manager()
        return self.engine.jobs.release(job_id)

    @dbus_method()
    @bus_errors
    async def Stop(self, options: "a{sv}") -> "asas":
        """End every claim and booking of one of the caller's sessions (``Session``; none:
        all of theirs), or of user ``UID``'s (needs manage, as cancelling another's
        booking does, and a ``Reason``).
        Returns the claims and bookings stopped (``DryRun``: that would be)."""
        opts = parse_options(options, STOP_OPTIONS)
        caller = await self.credentials.caller()
        uid = opts.get("uid", caller.uid)
        admin = caller.uid not in (0, uid)
        if admin:
            await self.authority.check(current_call.get(), caller.uid, MANAGE, {
                "owner_uid": str(uid), "session": opts.get("session", "")})
        claims, bookings = self.engine.stop(caller, uid, opts.get("session"),
                                            opts.get("reason", ""), admin,
                                            opts.get("dry_run", False))
        return [[c.id for c in claims], [b.id for b in bookings]]

    @dbus_method()
    @bus_errors
    async def Verify(self) -> "aa{sv}":
        reports, claims = await self.engine.tracker.verify(), self.engine.ledger.claims
        return [_report(r, r.claim_id in claims and claims[r.claim_id].isolated)
                for r in reports]

    @dbus_method()
    @bus_errors
    async def Reload(self) -> "asas":
        caller = await self.credentials.caller()
        await self.authority.check(current_call.get(), caller.uid, MANAGE, {})
        try:
            applied, restart = self.reload()
        except ConfigError as exc:
            raise InvalidArgs(f"the configuration was not reloaded: {exc}") from exc
        return [applied, restart]

    @dbus_method()
    @bus_errors
    def GetClaim(self, claim_id: "s") -> "o":
        return claim_path(self.engine.claim_of(claim_id).id)

    @dbus_method()
    @bus_errors
    async def GetGrant(self, claim_id: "s") -> "a{sv}":
        """A claim's grant, from which its environment is made: for its own user (and
        root). Anyone else needs manage, and is told whose claim it is; reading what a
        claim is (GetClaim, Describe) stays open to all."""
        caller = await self.credentials.caller()
        claim = self.engine.claim_of(claim_id)
        if caller.uid in (0, claim.uid):
            return self.view.grant(claim)
        whose = f"{claim_id} is {claim.user or f'uid {claim.uid}'}'s claim"
        try:
            await self.authority.check(current_call.get(), caller.uid, MANAGE, {
                "claim": claim_id, "owner_uid": str(claim.uid)})
        except (AccessDenied, InteractiveAuthorizationRequired):
            raise NotClaimOwner(whose) from None
        return self.view.grant(claim, [f"{whose}: you use it as an administrator"])

    @dbus_method()
    @bus_errors
    async def GetClaimByCall(self, serial: "u") -> "soa{sv}":
        sender = current_call.get().sender
        await self.held.decided(sender, serial)
        claim = self.engine.claim_of_call(sender, serial)
        return [claim.id, claim_path(claim.id), self.view.grant(claim)]

    @dbus_method()
    @bus_errors
    def ListGPUs(self) -> "a(ussso)":
        return [
            [g.index, g.uuid, g.name, self.engine.tracker.gpu_state(g), gpu_path(g.index)]
            for g in self.engine.ledger.gpus.values()
        ]

    @dbus_method()
    @bus_errors
    def ListPools(self) -> "a(sttso)":
        ledger = self.engine.ledger
        return [[p.name, p.capacity, ledger.pool_free(p.name), p.unit, pool_path(p.name)]
                for p in ledger.pools.values()]

    @dbus_method()
    @bus_errors
    def ListClaims(self) -> "a(sssuubo)":
        return [
            [c.id, c.mode, c.user, c.uid, c.owner.pid, c.owner_alive, claim_path(c.id)]
            for c in self.engine.ledger.claims.values()
        ]

    @dbus_method()
    @bus_errors
    def Describe(self) -> "s":
        text = self.view.describe()
        if len(text) > memory.BIG:
            self.engine.after_reply(memory.trim)
        return text

    # -- bookings ----------------------------------------------------------------------
    @dbus_method()
    @bus_errors
    async def Book(self, options: "a{sv}") -> "sa{sv}":
        opts = parse_options(options, OPTIONS["Book"])
        session = opts.pop("session", None)
        request, op_id, dry_run = booking_request(opts, self._gpu_uuid)
        caller = await self.credentials.caller()
        await self.authority.check(current_call.get(), caller.uid, RESERVE, {
            "gpus": str(request.demand.gpus), "duration_usec": str(request.duration_usec)})
        booking, status = await self.engine.bookings.book(caller, request, op_id, dry_run, session)
        return [status, self._record(booking)]

    @dbus_method()
    @bus_errors
    async def EditBooking(self, booking_id: "s", options: "a{sv}") -> "a{sv}":
        caller, admin = await self._owner_or_admin(booking_id)
        base = self.engine.bookings.get(booking_id)
        request, op_id, dry_run = booking_request(parse_options(options, BOOK_OPTIONS),
                                                  self._gpu_uuid, base)
        return self._record(self.engine.bookings.edit(caller, booking_id, request, admin, op_id,
                                                      dry_run))

    @dbus_method()
    @bus_errors
    async def SetBookingEnd(self, booking_id: "s", end_usec: "t", options: "a{sv}") -> "a{sv}":
        opts = parse_options(options, END_OPTIONS)
        if bool(end_usec) == bool(opts.get("by_usec")):
            raise InvalidArgs("give either an end (end_usec) or ByUSec, not both or neither")
        caller, admin = await self._owner_or_admin(booking_id)
        return self._record(self.engine.bookings.set_end(
            caller, booking_id, end_usec, admin, opts.get("op_id", ""), opts.get("by_usec", 0),
            opts.get("dry_run", False)))

    @dbus_method()
    @bus_errors
    async def CancelBooking(self, booking_id: "s", reason: "s", options: "a{sv}") -> "a{sv}":
        opts = parse_options(options, CHANGE_OPTIONS)
        caller, admin = await self._owner_or_admin(booking_id)
        return self._record(self.engine.bookings.cancel(caller, booking_id, reason, admin,
                                                        opts.get("op_id", ""),
                                                        opts.get("dry_run", False)))

    @dbus_method()
    @bus_errors
    def Usage(self, options: "a{sv}") -> "s":
        """GPU-hours held, used and idle per user (``ByGPU``: per GPU, with mean load),
        from ``SinceUSec`` (default: 7 days ago) to ``UntilUSec`` (default: now); ``UID``:
        one user.  JSON: a list of rows."""
        opts = parse_options(options, USAGE_OPTIONS)
        now = self.engine.clock()
        since, until = opts.get("since_usec", now - 7 * DAY_USEC), opts.get("until_usec", now)
        check_instant(wire(USAGE_OPTIONS, "since_usec"), since)
        check_instant(wire(USAGE_OPTIONS, "until_usec"), until)
        if since >= until:
            raise InvalidArgs("SinceUSec must be before UntilUSec")
        return json.dumps(self.engine.history.usage(since, until, opts.get("uid"),
                                                    opts.get("by_gpu", False)))

    @dbus_method()
    @bus_errors
    def Metrics(self) -> "s":
        """The daemon's metrics in the Prometheus text format (``gpuctl metrics``)."""
        if self.metrics is None:
            raise InvalidArgs("this daemon keeps no metrics")
        return self.metrics.text()

    @dbus_method()
    @bus_errors
    async def Diagnose(self) -> "s":
        """The daemon's own checks for ``gpuctl doctor``, as JSON: a list of records."""
        if self.diagnose is None:
            raise InvalidArgs("this daemon does not diagnose itself")
        return json.dumps(await self.diagnose())

    @dbus_method()
    @bus_errors
    async def ReportJob(self, booking_id: "s", state: "s", exit_code: "i", detail: "s") -> "a{sv}":
        """The owner's runner reports the state of the booking's command."""
        caller = await self.credentials.caller()
        return self._record(self.engine.bookings.report_job(caller, booking_id, state, exit_code,
                                                            detail))

    @dbus_method()
    @bus_errors
    async def ListBookings(self, options: "a{sv}") -> "s":
        """The caller's bookings (``All``: everyone's), live ones and those ended since
        ``SinceUSec`` (default: 24 hours ago), by start; ``Offset``/``Limit`` page.  JSON,
        as Describe: 5,000 records of 22 variants each are slow to decode in a client."""
        opts = list_filter(options)
        uid = None if opts.get("all") else (await self.credentials.caller()).uid
        found = self.engine.bookings.list(uid, opts.get("since_usec"), opts.get("until_usec"))
        offset = opts.get("offset", 0)
        page = found[offset: offset + opts["limit"]] if "limit" in opts else found[offset:]
        gpus = self.engine.ledger.gpus
        self._texts.forget_missing(self.engine.calendar.bookings)
        return self._texts.array(page, gpus, self.engine.ledger.claims, self._claim_of)

    @dbus_method()
    @bus_errors
    def GetBooking(self, booking_id: "s") -> "a{sv}":
        return self._record(self.engine.bookings.get(booking_id))

    @dbus_method()
    @bus_errors
    def FindSlots(self, options: "a{sv}", count: "u") -> "aa{sv}":
        """The earliest ``count`` starts where a booking would fit (read-only)."""
        if not 1 <= count <= MAX_SLOTS:
            raise InvalidArgs(f"count must be from 1 to {MAX_SLOTS}")
        request, _, _ = booking_request(parse_options(options, BOOK_OPTIONS), self._gpu_uuid)
        gpus = self.engine.ledger.gpus
        return [wire_record(SLOT, {"start_usec": start,
                                   "end_usec": start + request.duration_usec,
                                   "gpu_uuids": list(on),
                                   "gpu_indices": [gpus[u].index for u in on]})
                for start, on in self.engine.bookings.slots(request, count)]

    @dbus_method()
    @bus_errors
    async def AddBlackout(self, start_usec: "t", end_usec: "t", reason: "s") -> "sas":
        caller = await self._manager()
        blackout, inside = self.engine.bookings.add_blackout(caller, start_usec, end_usec, reason)
        return [blackout.id, [b.id for b in inside]]

    @dbus_method()
    @bus_errors
    async def RemoveBlackout(self, blackout_id: "s") -> "":
        self.engine.bookings.remove_blackout(await self._manager(), blackout_id)

    @dbus_method()
    @bus_errors
    def ListBlackouts(self) -> "aa{sv}":
        return [blackout_record(b) for b in sorted(self.engine.calendar.blackouts.values(),
                                                   key=lambda b: b.start_usec)]

    @dbus_method()
    @bus_errors
    async def AddNotice(self, text: "s", until_usec: "t") -> "s":
        return self.engine.bookings.add_notice(await self._manager(), text, until_usec).id

    @dbus_method()
    @bus_errors
    async def RemoveNotice(self, notice_id: "s") -> "":
        self.engine.bookings.remove_notice(await self._manager(), notice_id)

    @dbus_method()
    @bus_errors
    def ListNotices(self) -> "aa{sv}":
        return [notice_record(n) for n in self.engine.bookings.notices()]

    # -- signals -----------------------------------------------------------------------
    @dbus_signal()
    def NoticeAdded(self, notice_id: str, text: str) -> "ss":
        return [notice_id, text]

    @dbus_signal()
    def ClaimNew(self, claim_id: str, path: str) -> "so":
        return [claim_id, path]

    @dbus_signal()
    def ClaimRemoved(self, claim_id: str, path: str, reason: str) -> "sos":
        return [claim_id, path, reason]

    @dbus_signal()
    def LevelChanged(self, check: str, old: str, new: str, reason: str) -> "ssss":
        return [check, old, new, reason]

    # -- properties --------------------------------------------------------------------
    @dbus_property(access=R)
    def Version(self) -> "s":
        return __version__

    @dbus_property(access=R)
    def Mode(self) -> "s":
        return self.mode

    @dbus_property(access=R)
    def Instance(self) -> "s":
        return self.instance

    @dbus_property(access=R)
    def Backend(self) -> "s":
        return self.engine.backend.name

    @dbus_property(access=R)
    def BackendNote(self) -> "s":
        return self.engine.backend_note

    @dbus_property(access=R)
    def Features(self) -> "as":
        return FEATURES + (["isolation"] if self.engine.scopes is not None else [])

    @dbus_property(access=R)
    def NGPUs(self) -> "u":
        return len(self.engine.ledger.gpus)

    @dbus_property(access=R)
    def FreeGPUs(self) -> "u":
        return self.engine.tracker.free_count()

    @dbus_property(access=R)
    def NClaims(self) -> "u":
        return len(self.engine.ledger.claims)

    @dbus_property(access=R)
    def NQueued(self) -> "u":
        return len(self.engine.ledger.waiting)

    @dbus_property(access=R)
    def HealthLevel(self) -> "s":
        return self.health.health

    @dbus_property(access=R)
    def Levels(self) -> "a{ss}":
        return self.health.levels()

    # -- shared by the Manager and Claim objects ---------------------------------------
    async def release(self, claim_id: str, flags: int) -> list[str]:
        if flags & ~RELEASE_FLAGS:
            raise InvalidArgs(f"unknown release flags {flags & ~RELEASE_FLAGS:#x}")
        return await self._release(claim_id, force=bool(flags & RELEASE_FORCE),
                                   dry_run=bool(flags & RELEASE_DRY_RUN))

    async def _release(self, claim_id: str, force: bool, reason: str = "",
                       dry_run: bool = False) -> list[str]:
        """The claim's user (or root) may release it; anyone else needs release-other."""
        caller = await self.credentials.caller()
        claim = self.engine.claim_of(claim_id)
        admin = caller.uid not in (0, claim.uid)
        if admin:
            await self.authority.check(current_call.get(), caller.uid, RELEASE_OTHER, {
                "claim": claim_id, "owner_uid": str(claim.uid), "force": str(force).lower()})
        return await self.engine.release(caller, claim_id, force=force, reason=reason,
                                         admin=admin, dry_run=dry_run)

    # -- internals ---------------------------------------------------------------------
    async def _owner_or_admin(self, booking_id: str):
        """The caller, and whether they act as an administrator (not the booking's own
        user: that needs ``manage``)."""
        caller = await self.credentials.caller()
        booking = self.engine.bookings.get(booking_id)
        admin = caller.uid not in (0, booking.uid)
        if admin:
            try:
                await self.authority.check(current_call.get(), caller.uid, MANAGE, {
                    "booking": booking_id, "owner_uid": str(booking.uid)})
            except (AccessDenied, InteractiveAuthorizationRequired) as exc:
                whose = f"{booking_id} is {booking.user or f'uid {booking.uid}'}'s booking"
                if isinstance(exc, InteractiveAuthorizationRequired):
                    whose += (": changing it is an administrator's, who must authenticate "
                              "(on a terminal, gpuctl asks)")
                raise NotClaimOwner(whose) from None
        return caller, admin

    async def _manager(self):
        caller = await self.credentials.caller()
        await self.authority.check(current_call.get(), caller.uid, MANAGE, {})
        return caller

    def _gpu_uuid(self, name: str) -> str:
        return self.engine.ledger.gpu_by_name(name).uuid

    def _record(self, booking) -> dict:
        return booking_record(booking_fields(booking, self.engine.ledger.gpus,
                                             *self._claim_of(booking)))

    def _claim_of(self, booking) -> tuple[str, list[str]]:
        """An active booking's claim state, and the claims it waits for."""
        ledger = self.engine.ledger
        claim = ledger.claims.get(booking.id)
        if claim is None:
            return "", []
        if claim.state != "queued":
            return claim.state, []
        holding = {c.id for u in booking.gpus for c in ledger.claims_on(u)}
        return claim.state, sorted(holding)

    def _user_object(self, uid: int) -> UserInterface:
        iface = self._users.get(uid)
        if iface is None:
            iface = self._users[uid] = UserInterface()
            self.bus.export(user_path(uid), iface)
        return iface

    def _export_checks(self) -> None:
        """(Re-)export one object per configured check (again after a reload)."""
        for name, iface in self._checks.items():
            self.bus.unexport(check_path(name), iface)
        self._checks = {s["name"]: CheckInterface(s) for s in self.health.states()}
        for name, iface in self._checks.items():
            self.bus.export(check_path(name), iface)

    def _claim_object(self, claim_id: str) -> ClaimInterface | None:
        """The claim's object, exported now if it was not yet (None: no such claim)."""
        iface = self._claims.get(claim_id)
        if iface is None and (claim := self.engine.ledger.claims.get(claim_id)) is not None:
            iface = self._claims[claim_id] = ClaimInterface(claim, self)
            self.bus.export(claim_path(claim_id), iface, announce=False)  # see _claim_added
        return iface

    def _export_claims_for(self, msg: Message) -> bool:
        """Before dbus-fast dispatches a call, export the claim objects it needs; the call
        itself is never handled here."""
        if msg.message_type is not MessageType.METHOD_CALL or not msg.path:
            return False
        if msg.path.startswith(CLAIM_PREFIX):
            self._claim_object(msg.path[len(CLAIM_PREFIX):])
        elif msg.member == "GetManagedObjects" or (
                msg.member == "Introspect" and CLAIM_PREFIX.startswith(msg.path.rstrip("/") + "/")):
            for claim_id in self.engine.ledger.claims:
                self._claim_object(claim_id)
            if msg.member == "GetManagedObjects":
                self.managers_watching.add(msg.sender)
                self.departures.watch(msg.sender, self.managers_watching.discard)
        return False

def _report(r: GpuReport, isolated: bool) -> dict:
    """One GPU's verify report as a{sv} (processes as aa{sv}: Pid, UsedMemoryBytes, UID,
    User, Command, Claim, Ambiguous, Container); ``isolated``: its claim's."""
    processes = [wire_record(PROCESS, {
        "pid": p.pid, "used_memory_bytes": p.used_memory_bytes, "uid": p.uid, "user": p.user,
        "command": p.command, "claim": p.claim_id, "ambiguous": p.ambiguous,
        "container": p.container}) for p in r.processes]
    return wire_record(REPORT, {
        "uuid": r.uuid, "alias": r.alias, "index": r.index, "status": r.status,
        "claim": r.claim_id, "isolated": isolated, "detail": r.detail, "processes": processes})
