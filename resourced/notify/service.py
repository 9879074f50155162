"""gpuctl notify: the per-user agent that shows RAM and disk health as desktop notifications.

It listens on the daemon's bus for ``org.resourced.Manager.LevelChanged(s check, s old,
s new, s reason)`` and keeps one bubble per check on the user's session bus
(``org.freedesktop.Notifications``): WARN, ERROR and UNAVAILABLE show with normal
urgency, STOP critical (and it stays until the level drops); a later change replaces the
bubble in place; back to OK closes it.

It also tells the user about their calendar: ``BookingChanged`` on their own
``/org/resourced/user/<uid>`` (a booking started, ends soon, was ended by someone else
with a reason, or lies in a new blackout), ``Ending`` of their claims other than a
booking's (given back soon: a booking needs the GPUs, or the claim's own end; a booking's
end is its "ending"), and the administrators' ``NoticeAdded``: one bubble each
(``calendar_message``).  And a blackout over one of their live bookings, ``warn_before``
(``Describe``'s limits) before it begins (``Blackouts``): the blackouts and the user's
bookings are read when resourced (re)appears, when a booking of theirs changes, and again
when a warning is due (a removed blackout sends no signal); in between only a timer runs,
and the daemon is not asked.

Where the server lists ``"actions"`` in ``GetCapabilities`` (asked once per server), a
health bubble carries the action ``default`` ("Show details") and a booking's bubble
"Show bookings": the server's ``ActionInvoked(u id, s key)`` on one of our ids opens a
terminal ($TERMINAL, else ``x-terminal-emulator``, with ``-e``) running
``gpuctl resources`` or ``gpuctl bookings`` (``Launcher``), detached and reaped.

``Bubbles`` is the pure part: given what is on screen and what the server can do, which
``Notify`` (with which actions) or ``CloseNotification`` to make, and what an invoked id
opens.  ``Agent`` does the I/O, one message at a time, in order; it asks the daemon
through the client (``AsyncClient.on`` its own connection), which builds each call and
reads each record.
It outlives both of its peers: when resourced goes and comes back (``NameOwnerChanged``)
it re-reads the levels from ``Describe``; when the notification server is missing it logs,
forgets the ids it held, and shows the current levels once a server appears (or at the
next change).  The daemon's bus and the session bus may be one bus (a per-user daemon);
then one connection serves both.  It exits 1 only when it loses a bus connection, so
``Restart=on-failure`` brings it back.
"""

import contextlib
import logging
import os
import re
import shlex
import signal
import sys
from dataclasses import dataclass

from resourced.config import DaemonConfig
from resourced.core.health import NOT_MEASURED, OK, STOP, UNAVAILABLE, WARN
from resourced.exits import GpuctlError
from resourced.protocol.time import usec_of_seconds

log = logging.getLogger("resourced.notify")

APP_NAME = "resourced"
NOTIFICATIONS = "org.freedesktop.Notifications"
NOTIFICATIONS_PATH = "/org/freedesktop/Notifications"
# Errors that mean "no notification server": forget the ids, retry on the next change.
SERVER_GONE = frozenset({
    "org.freedesktop.DBus.Error.ServiceUnknown",
    "org.freedesktop.DBus.Error.NameHasNoOwner",
    "org.freedesktop.DBus.Error.NoReply",
    "org.freedesktop.DBus.Error.Disconnected",
    "org.freedesktop.DBus.Error.Spawn.ServiceNotFound",
    "org.freedesktop.DBus.Error.Spawn.ChildExited",
    "org.freedesktop.DBus.Error.Spawn.ChildSignaled",
    "org.freedesktop.DBus.Error.Spawn.ExecFailed",
    "org.freedesktop.DBus.Error.Spawn.Failed",
})
CALL_TIMEOUT = 25.0      # Notify may first start the server by bus activation
KEEPALIVE_INTERVAL = 15.0
# What an invoked bubble opens: gpuctl's arguments, and the label of the action.
RESOURCES = ("resources",)
BOOKINGS = ("bookings",)
ACTION_LABELS = {RESOURCES: "Show details", BOOKINGS: "Show bookings"}
DEFAULT_ACTION = "default"  # the spec's key for invoking the bubble itself (a click)
OPENS_KEPT = 64             # ids remembered for ActionInvoked, the newest
# BookingChanged "what"s that may change which blackouts cover the user's bookings.
RESHAPES = frozenset({"created", "changed", "blackout", "ended", "no-show"})
BLACKOUT_DUE = object()     # queued by the timer: a blackout's warning is due
WALL_CLOCK_LOOK = 60.0      # seconds between looks at the wall clock (it may jump)


# -- the pure part ----------------------------------------------------------------------


@dataclass(frozen=True)
class Show:
    """Call ``Notify`` for ``check`` (replacing ``replaces_id`` when not 0)."""

    check: str
    level: str
    reason: str
    replaces_id: int
    summary: str
    body: str
    urgency: int          # the ``urgency`` hint: 1 normal, 2 critical
    icon: str
    expire_timeout: int   # -1 the server's default, 0 never
    actions: tuple[str, ...] = ()  # Notify's actions: key, label, key, label...


@dataclass(frozen=True)
class Message:
    """Call ``Notify`` for a calendar event: a new bubble each time."""

    summary: str
    body: str
    urgency: int
    actions: tuple[str, ...] = ()
    opens: tuple[str, ...] = ()  # gpuctl's arguments when the bubble is invoked


@dataclass(frozen=True)
class Close:
    """Call ``CloseNotification(id)``: ``check`` is back to OK (or gone)."""

    check: str
    id: int


def check_label(name: str, type_: str | None = None, path: str | None = None) -> str:
    """How a check is named to the user: ``disk /data``, ``ram``, else its name."""
    if type_ == "disk" and path:
        return f"disk {path}"
    if type_ == "ram":
        return "ram" if name == "ram" else f"ram ({name})"
    return name


_REACHED = re.compile(r"(free|used) (\S+) [<>]= (stop|warn)_(free|used)_(gib|pct) (\S+)")
_ADVICE = {("disk", STOP): "Jobs should stop writing to it.",
           ("ram", STOP): "Jobs should not start anything large.",
           ("disk", WARN): "Nothing is stopped yet.",
           ("ram", WARN): "Nothing is stopped yet."}


def plain_words(label: str, level: str, reason: str) -> tuple[str, str]:
    """A bubble's title and text in words a person reads at a glance: "Disk /data is
    full" and "9.5G free; the limit is 10G free. Jobs should stop writing to it.", from
    the check's label, its level and the daemon's reason ("free 9.5G <= stop_free_gib 10")."""
    kind = "disk" if label.startswith("disk ") else "ram" if label.startswith("ram") else ""
    shown = label.replace("disk ", "Disk ", 1) if kind == "disk" else (
        label.replace("ram", "RAM", 1) if kind == "ram" else label)
    if level in (STOP, WARN) and kind:
        state = {("disk", STOP): "is full", ("disk", WARN): "is filling up",
                 ("ram", STOP): "is nearly exhausted", ("ram", WARN): "is running short"}
        title = f"{shown} {state[kind, level]}"
    elif level in (STOP, WARN):
        title = f"{shown} {'has reached its limit' if level == STOP else 'is near its limit'}"
    else:
        return f"{shown} cannot be measured", reason
    m = _REACHED.fullmatch(reason)
    if m is None:
        return title, reason
    what, figure, limit_level, limit_what, unit, limit = m.groups()
    limit = f"{limit}G" if unit == "gib" else f"{limit}%"
    edge = "the limit is" if limit_level == "stop" else "the warning is at"
    advice = _ADVICE.get((kind, level), "")
    return title, f"{figure} {what}; {edge} {limit} {limit_what}. {advice}".rstrip()


def calendar_message(what: str, booking: dict, when: str, me: int) -> tuple[str, str, int] | None:
    """(title, text, urgency) for a ``BookingChanged`` of ``booking`` (as the client reads
    a booking: id, ended, ended_by, reason, gpu_indices); ``when`` is its start or end in
    words; None when it is not worth a bubble (created and changed: the user did it)."""
    ref = booking["id"]
    gpus = ", ".join(f"gpu{i}" for i in booking.get("gpu_indices", [])) or "its pools"
    if what == "started":
        return f"Booking {ref} has started", f"{gpus} are yours until {when}.", 1
    if what == "ending":
        return f"Booking {ref} ends at {when}", f"Save your work: {gpus} go back then.", 1
    if what == "blackout":
        return (f"Booking {ref} falls in a maintenance window",
                ("An administrator blocked that time; the booking stays. See gpuctl blackout "
                 "list."), 1)
    if what == "ended" and booking.get("ended") == "no-show":
        return (f"Booking {ref} was released: its GPUs were not used",
                (f"{booking.get('reason') or 'nothing of yours ran on them'}. Book again when "
                 "you are ready."), 2)
    if what == "ended" and booking.get("ended_by", -1) not in (-1, me):
        reason = booking.get("reason") or "no reason given"
        return f"Booking {ref} was cancelled by an administrator", reason, 2
    return None


def blackout_message(blackout: dict, refs: list[str], start: str, end: str
                     ) -> tuple[str, str, int]:
    """(title, text, urgency) shortly before ``blackout`` (as the client reads one:
    start_usec, end_usec, reason) begins over the user's bookings ``refs``; ``start`` and
    ``end`` are its times in words."""
    which = f"Booking {refs[0]} falls" if len(refs) == 1 else f"Bookings {', '.join(refs)} fall"
    reason = blackout.get("reason") or "Maintenance"
    return (f"Maintenance begins at {start}",
            f"{reason}, until {end}. {which} in it: save your work.", 1)


class Blackouts:
    """The blackouts over the user's live bookings, and when to warn of each: ``lead``
    seconds before it begins, once, and not at all once it has begun."""

    def __init__(self, lead: float = DaemonConfig.warn_before):
        self.lead = lead
        self._coming: dict[str, tuple[dict, list[str]]] = {}  # id -> (blackout, refs)
        self._warned: set[str] = set()

    def update(self, blackouts: list[dict], bookings: list[dict]) -> None:
        """``blackouts`` and the user's ``bookings`` as the client gives them
        (``blackouts()``, ``bookings()``)."""
        live = [b for b in bookings if b["state"] in ("scheduled", "active")]
        self._coming = {}
        for x in blackouts:
            refs = [b["id"] for b in live
                    if b["start_usec"] < x["end_usec"] and x["start_usec"] < b["end_usec"]]
            if refs:
                self._coming[x["id"]] = (x, refs)
        self._warned.intersection_update(self._coming)

    def _warn_at(self, blackout: dict) -> int:
        return blackout["start_usec"] - usec_of_seconds(self.lead)

    def next_due(self) -> int | None:
        """When the next warning is due (microseconds), None if none is."""
        return min((self._warn_at(x) for i, (x, _) in self._coming.items()
                    if i not in self._warned), default=None)

    def due(self, now: int) -> list[tuple[dict, list[str]]]:
        """The (blackout, refs) to warn of at ``now``, by start; each is then warned."""
        out = []
        for blackout_id, (x, refs) in self._coming.items():
            if blackout_id in self._warned or now < self._warn_at(x):
                continue
            self._warned.add(blackout_id)
            if now < x["start_usec"]:
                out.append((x, refs))
        return sorted(out, key=lambda item: item[0]["start_usec"])


class Bubbles:
    """Which bubble each check has on screen, and what to do when its level changes."""

    def __init__(self):
        self._shown: dict[str, tuple[int, str, str]] = {}  # check -> (id, level, reason)
        self.labels: dict[str, str] = {}                   # check -> label, from Describe
        self.actions_supported = False  # the server lists "actions" in GetCapabilities
        # id -> gpuctl's arguments, for bubbles shown with an action.  Kept after the
        # bubble closes (a server may say NotificationClosed before ActionInvoked), the
        # newest OPENS_KEPT, until the server changes (ids are the server's).
        self._opens: dict[int, tuple[str, ...]] = {}

    @property
    def ids(self) -> dict[str, int]:
        return {check: shown[0] for check, shown in self._shown.items()}

    def _actions(self, opens: tuple[str, ...]) -> tuple[str, ...]:
        if not (self.actions_supported and opens):
            return ()
        return (DEFAULT_ACTION, ACTION_LABELS.get(opens, "Show details"))

    def _remember(self, notification_id: int, opens: tuple[str, ...]) -> None:
        self._opens.pop(notification_id, None)
        self._opens[notification_id] = opens
        while len(self._opens) > OPENS_KEPT:
            del self._opens[next(iter(self._opens))]

    def message(self, summary: str, body: str, urgency: int,
                opens: tuple[str, ...] = ()) -> Message:
        """A calendar bubble; invoking it opens ``gpuctl *opens`` where actions work."""
        actions = self._actions(opens)
        return Message(summary, body, urgency, actions, opens if actions else ())

    def message_shown(self, message: Message, notification_id: int) -> None:
        if message.actions:
            self._remember(notification_id, message.opens)

    def invoked(self, notification_id: int, key: str) -> tuple[str, ...] | None:
        """gpuctl's arguments to open for ``ActionInvoked(notification_id, key)``; None
        when that id is not one of our bubbles with an action, or the key is not ours."""
        if key != DEFAULT_ACTION:
            return None
        return self._opens.get(notification_id)

    def level_changed(self, check: str, level: str, reason: str) -> Show | Close | None:
        """The call to make now that ``check`` is at ``level``; None if there is none."""
        shown = self._shown.get(check)
        if level == OK:
            if shown is None:
                return None
            del self._shown[check]  # closed or not, the id is of no use any more
            return Close(check, shown[0])
        if shown is not None and shown[1:] == (level, reason):
            return None
        summary, body = plain_words(self.labels.get(check, check), level, reason)
        return Show(
            check=check, level=level, reason=reason,
            replaces_id=shown[0] if shown else 0,
            summary=summary,
            body=body,
            urgency=2 if level == STOP else 1,
            icon="dialog-error" if level == STOP else "dialog-warning",
            expire_timeout=0 if level == STOP else -1,
            actions=self._actions(RESOURCES),
        )

    def shown(self, show: Show, notification_id: int) -> None:
        """``Notify`` for ``show`` returned ``notification_id``."""
        self._shown[show.check] = (notification_id, show.level, show.reason)
        if show.actions:
            self._remember(notification_id, RESOURCES)

    def closed(self, notification_id: int) -> None:
        """The server closed a bubble (expired, dismissed): the next change opens a new one."""
        for check, shown in list(self._shown.items()):
            if shown[0] == notification_id:
                del self._shown[check]

    def forget_all(self) -> None:
        """The notification server went away: its ids mean nothing to the next one."""
        self._shown.clear()
        self._opens.clear()

    def resync(self, current: dict[str, tuple[str, str]]) -> list[Show | Close]:
        """The calls that make the screen show ``current`` (check -> (level, reason)).

        A check not measured yet is left as it is (its first reading comes as a change);
        a bubble of a check that is no longer reported is closed.
        """
        actions: list[Show | Close] = []
        for check in list(self._shown):
            if check not in current:
                actions.append(self.level_changed(check, OK, ""))
        for check, (level, reason) in current.items():
            if (level, reason) == (UNAVAILABLE, NOT_MEASURED):
                continue
            action = self.level_changed(check, level, reason)
            if action is not None:
                actions.append(action)
        return actions


# -- opening a terminal ----------------------------------------------------------------

# Keeps the window open once gpuctl has printed (a terminal closes when its command ends).
HOLD = '"$@"; printf "\\n%s" "Press Enter to close this window. "; read -r _'


def gpuctl_command(args, which, python: str = sys.executable) -> list[str]:
    """The command line of ``gpuctl *args``, held open: the ``gpuctl`` installed beside
    this Python, else the one on $PATH, else ``python -m resourced.cli``."""
    for candidate in (os.path.join(os.path.dirname(python), "gpuctl"), "gpuctl"):
        found = which(candidate)
        if found:
            base = [found]
            break
    else:
        base = [python, "-m", "resourced.cli"]
    return ["sh", "-c", HOLD, "sh", *base, *args]


def terminal_command(command: list[str], environ, which) -> list[str] | None:
    """``$TERMINAL -e command...`` ($TERMINAL may carry options), else
    ``x-terminal-emulator -e command...``; None when neither is found."""
    candidates = []
    with contextlib.suppress(ValueError):  # unbalanced quotes: as if unset
        candidates.append(shlex.split(environ.get("TERMINAL", "")))
    candidates.append(["x-terminal-emulator"])
    for terminal in candidates:
        found = terminal and which(terminal[0])
        if found:
            return [found, *terminal[1:], "-e", *command]
    return None


def spawn_detached(argv: list[str], env: dict):
    """Start ``argv`` in a session of its own without waiting for it; a thread reaps it.
    Returns the ``Popen``."""
    import subprocess
    import threading

    proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, start_new_session=True)

    def reap():
        code = proc.wait()
        if code:
            log.info("the terminal %s exited with status %s", argv[0], code)
    threading.Thread(target=reap, name=f"reap-{proc.pid}", daemon=True).start()
    return proc


class Launcher:
    """Opens ``gpuctl ARGS`` in a terminal, without blocking and without ever raising."""

    def __init__(self, environ=None, which=None, spawn=None, python: str = sys.executable):
        import shutil

        self.environ = os.environ if environ is None else environ
        self.which = which or (lambda name: shutil.which(name, path=self.environ.get("PATH")))
        self.spawn = spawn or spawn_detached
        self.python = python
        self._told_none = False

    def command(self, args) -> list[str] | None:
        return terminal_command(gpuctl_command(args, self.which, self.python), self.environ,
                                self.which)

    def open(self, args, extra_env: dict | None = None) -> bool:
        what = "gpuctl " + " ".join(args)
        argv = self.command(args)
        if argv is None:
            if not self._told_none:
                log.warning("cannot open %s: no terminal (set $TERMINAL, or install "
                            "x-terminal-emulator)", what)
                self._told_none = True
            return False
        self._told_none = False
        try:
            self.spawn(argv, {**self.environ, **(extra_env or {})})
        except Exception as exc:  # noqa: BLE001 - a failed launch never stops the agent
            log.warning("cannot open %s in %s: %s", what, argv[0], exc)
            return False
        log.info("opened %s in %s", what, argv[0])
        return True


# -- the agent --------------------------------------------------------------------------


class BusLost(Exception):
    """A bus connection is gone; the agent exits (systemd restarts it)."""


class Agent:
    """Turns LevelChanged signals into notifications; see the module docstring."""

    def __init__(self, daemon_router, notify_router, bus: str, launcher: Launcher | None = None):
        import asyncio

        from resourced.client.aio import AsyncClient

        self.daemon = daemon_router
        self.client = AsyncClient.on(daemon_router, bus, CALL_TIMEOUT)  # the daemon's calls
        self.notifications = notify_router
        self.bus = bus
        self.bubbles = Bubbles()
        self.launcher = launcher or Launcher()
        # The notification server as last asked: its unique name and GetCapabilities
        # (None: not asked yet since it changed).
        self.server: str | None = None
        self.capabilities: frozenset[str] | None = None
        self._token: tuple[int, str] | None = None      # the last ActivationToken(id, token)
        self.current: dict[str, tuple[str, str]] = {}  # check -> (level, reason), last known
        self.owner: str | None = None                   # unique name owning org.resourced
        self.queue: asyncio.Queue = asyncio.Queue()
        self.blackouts = Blackouts()
        self._rescheduled = asyncio.Event()  # the next blackout warning may have moved
        self._filters: list = []
        self._names = {id(notify_router): "session", id(daemon_router): bus}

    # -- set-up ------------------------------------------------------------------------
    async def start(self) -> None:
        """Subscribe first, then read the state, so no change falls in between."""
        from resourced.client import signals
        from resourced.client.calls import LEVEL_CHANGES
        from resourced.protocol.names import BUS_NAME

        daemon = await self._listen(self.daemon, [LEVEL_CHANGES, *_calendar_rules()])
        await self._listen(self.notifications, [
            signals.rule(NOTIFICATIONS, member, NOTIFICATIONS_PATH, sender=NOTIFICATIONS)
            for member in ("NotificationClosed", "ActionInvoked", "ActivationToken")],
            NOTIFICATIONS)
        self.owner = daemon.owner
        if self.owner:
            await self.resync()
        log.info("watching %s on the %s bus (%s)", BUS_NAME, self.bus,
                 "running" if self.owner else "not running yet")

    async def _listen(self, router, rules, name: str = ""):
        """Queue what ``rules`` match of the signals the owner of ``name`` (org.resourced
        by default) sends on ``router``, and its changes of owner (``client.signals``: a
        signal anyone else sends is dropped); the ``FromDaemon`` that knows the owner."""
        from jeepney.io.common import RouterClosed

        from resourced.client.signals import listen_async
        from resourced.protocol.names import BUS_NAME

        try:
            handle, heard = await listen_async(router, rules, self.queue, CALL_TIMEOUT,
                                               name or BUS_NAME)
        except (RouterClosed, EOFError, ConnectionError) as exc:
            raise BusLost(f"lost the connection to the {self._names[id(router)]} bus") from exc
        self._filters.append(handle)
        return heard

    # -- the loop ----------------------------------------------------------------------
    async def run(self) -> None:
        """Until cancelled, or until a bus connection is lost (``BusLost``)."""
        import asyncio

        await self.start()
        routers = {id(r): r for r in (self.daemon, self.notifications)}.values()
        tasks = [asyncio.create_task(self._consume()),
                 asyncio.create_task(self._blackout_timer()),
                 *(asyncio.create_task(self._keepalive(r)) for r in routers)]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            for task in done:
                task.result()
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _consume(self) -> None:
        while True:
            await self.handle(await self.queue.get())

    async def _keepalive(self, router) -> None:
        """A bus connection that died leaves the queue silent; notice it and exit."""
        import asyncio

        from jeepney.bus_messages import message_bus

        while True:
            await asyncio.sleep(KEEPALIVE_INTERVAL)
            await self._call(router, message_bus.GetId())

    async def _blackout_timer(self) -> None:
        """Queue ``BLACKOUT_DUE`` when a blackout's warning is due; in between, look only
        at the clock: at the due time, and every WALL_CLOCK_LOOK seconds (each second on
        the simulated clock, which tests move at will)."""
        import asyncio

        from resourced.protocol.time import clock_from_env, now_usec, seconds_of_usec

        look = 1.0 if clock_from_env()[1] else WALL_CLOCK_LOOK
        while True:
            self._rescheduled.clear()
            due = self.blackouts.next_due()
            wait = look if due is None else min(look, seconds_of_usec(due - now_usec()))
            if wait <= 0:
                await self.queue.put(BLACKOUT_DUE)
                await self._rescheduled.wait()  # set once it is handled
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._rescheduled.wait(), wait)

    async def handle(self, msg) -> None:
        """One queued signal (or the timer's ``BLACKOUT_DUE``)."""
        from jeepney.low_level import HeaderFields

        from resourced.protocol.names import BUS_NAME

        if msg is BLACKOUT_DUE:
            await self.warn_of_blackouts()
            return
        fields = msg.header.fields
        member, body = fields.get(HeaderFields.member), msg.body
        if member == "LevelChanged" and len(body) == 4 and all(isinstance(v, str) for v in body):
            sender = fields.get(HeaderFields.sender)
            if self.owner and sender != self.owner:
                return  # a stale signal of a previous daemon
            check, _old, new, reason = body
            self.current[check] = (new, reason)
            if new == OK and check not in self.bubbles.ids:
                return
            if check not in self.bubbles.labels:
                await self.refresh_labels()
            await self.ask_server()
            await self.apply([self.bubbles.level_changed(check, new, reason)])
        elif member == "NameOwnerChanged" and len(body) == 3:
            name, _old, new = body
            if name == BUS_NAME:
                self.owner = new or None
                log.info("%s %s", BUS_NAME, "is back" if new else "went away")
                if new:
                    await self.resync()
            elif name == NOTIFICATIONS:
                self.forget_server()
                if new:
                    log.info("a notification server appeared; showing the current levels")
                    await self.ask_server()
                    await self.apply(self.bubbles.resync(self.current))
        elif member == "NotificationClosed" and body:
            self.bubbles.closed(body[0])
        elif member in ("ActionInvoked", "ActivationToken") and len(body) == 2:
            if self.server is None or fields.get(HeaderFields.sender) != self.server:
                return  # not from the server our bubbles are on
            if member == "ActivationToken":
                self._token = (body[0], body[1])
            else:
                self.action_invoked(body[0], body[1])
        elif member in ("BookingChanged", "Ending", "NoticeAdded"):
            await self.calendar_signal(member, body, fields.get(HeaderFields.path, ""))
            if member == "BookingChanged" and len(body) == 3 and body[1] in RESHAPES:
                await self.read_blackouts()

    def action_invoked(self, notification_id: int, key: str) -> None:
        """``ActionInvoked``: open what one of our bubbles offers, in a terminal."""
        args = self.bubbles.invoked(notification_id, key)
        if args is None:
            return
        token, self._token = self._token, None
        extra = {}
        if token is not None and token[0] == notification_id:
            # the spec's ActivationToken: lets the new window take the focus
            extra = {"XDG_ACTIVATION_TOKEN": token[1], "DESKTOP_STARTUP_ID": token[1]}
        self.launcher.open([*args, "--bus", self.bus], extra)

    async def calendar_signal(self, member: str, body: tuple, path: str) -> None:
        """A bubble for a calendar signal that concerns this user."""
        from resourced.client.bookings import record
        from resourced.protocol.time import local_now
        from resourced.protocol.when import format_when, moment

        now = local_now()
        opens: tuple[str, ...] = ()
        try:
            if member == "NoticeAdded":
                _, text = body
                title, urgency = "Notice from the administrators", 1
            elif member == "BookingChanged":
                _, what, data = body
                booking = record(data)
                at = booking["start_usec"] if what == "started" else booking["end_usec"]
                message = calendar_message(what, booking,
                                           format_when(moment(at, now.tzinfo), now), os.getuid())
                if message is None:
                    return
                title, text, urgency = message
                opens = BOOKINGS
            else:
                until, booking = body
                if not await self._claim_to_tell(path):
                    return
                ref = path.rsplit("/", 1)[-1]
                when = format_when(moment(until, now.tzinfo), now)
                title = f"Claim {ref} must give its GPUs back at {when}"
                text = (f"Booking {booking} starts then." if booking else "Its time is up then.")
                urgency = 1
        except (ValueError, KeyError, TypeError):
            log.warning("ignoring a malformed %s signal", member)
            return
        await self._calendar_bubble(title, text, urgency, opens)

    async def warn_of_blackouts(self) -> None:
        """A warning is due: read again (a removed blackout sends no signal), then warn of
        each blackout over a booking of mine that begins within ``warn_before``."""
        from resourced.protocol.time import local_text, now_usec

        await self.read_blackouts()
        now = now_usec()
        for blackout, refs in self.blackouts.due(now):
            title, text, urgency = blackout_message(
                blackout, refs, local_text(blackout["start_usec"], now),
                local_text(blackout["end_usec"], now))
            await self._calendar_bubble(title, text, urgency, BOOKINGS)
        self._rescheduled.set()

    async def _calendar_bubble(self, title: str, text: str, urgency: int,
                               opens: tuple[str, ...]) -> None:
        from jeepney import new_method_call

        await self.ask_server()
        message = self.bubbles.message(title, text, urgency, opens)
        hints = {"urgency": ("y", message.urgency), "category": ("s", "device")}
        msg = new_method_call(_notifications(), "Notify", "susssasa{sv}i", (
            APP_NAME, 0, "appointment-soon", message.summary, message.body,
            list(message.actions), hints, -1))
        reply = await self._notify_call(msg, f"show {title!r}")
        if reply is not None:
            self.bubbles.message_shown(message, reply.body[0])

    async def _claim_to_tell(self, path: str) -> bool:
        """Whether the claim at ``path`` is mine and not a booking's (a booking's end
        comes as its ``BookingChanged`` "ending": one bubble, not two)."""
        from resourced.core.claims import BOOKING
        from resourced.errors import ResourcedError
        from resourced.protocol.names import CLAIM_PREFIX

        if not path.startswith(CLAIM_PREFIX):
            return False
        try:
            claim = await self._daemon(self.client.claim_properties(path[len(CLAIM_PREFIX):]))
        except ResourcedError:
            return False
        return claim.get("uid") == os.getuid() and claim.get("mode") != BOOKING

    # -- talking to the daemon ---------------------------------------------------------
    async def describe_health(self) -> list[dict] | None:
        """The daemon's checks (``Describe``'s ``health.checks``); None if it did not say."""
        from resourced.errors import ResourcedError
        from resourced.protocol.names import BUS_NAME

        try:
            described = await self._daemon(self.client.status())
            health = described.get("health") or {}
            checks = [c for c in health.get("checks", []) if isinstance(c.get("name"), str)]
            limits = described.get("limits") or {}
            self.blackouts.lead = float(limits.get("warn_before", DaemonConfig.warn_before))
        except (ResourcedError, ValueError, AttributeError, IndexError, TypeError) as exc:
            log.warning("cannot read the levels from %s: %s", BUS_NAME, exc)
            return None
        self.bubbles.labels = {c["name"]: check_label(c["name"], c.get("type"), c.get("path"))
                               for c in checks}
        return checks

    async def refresh_labels(self) -> None:
        if self.owner:
            await self.describe_health()

    async def read_blackouts(self) -> None:
        """Read the blackouts and my bookings: which blackouts to warn of, and when."""
        from resourced.errors import ResourcedError
        from resourced.protocol.names import BUS_NAME

        try:
            blackouts = await self._daemon(self.client.blackouts())
            bookings = await self._daemon(self.client.bookings())
            self.blackouts.update(blackouts, bookings)
        except (ResourcedError, ValueError, KeyError, TypeError, AttributeError) as exc:
            log.warning("cannot read the blackouts from %s: %s", BUS_NAME,
                        str(exc) or type(exc).__name__)
            return
        self._rescheduled.set()

    async def _daemon(self, call):
        """``call``, one of the client's on the daemon's connection, awaited: a lost
        connection is ``BusLost``, the daemon's refusal its ``ResourcedError``."""
        from jeepney.io.common import RouterClosed

        from resourced.errors import DaemonUnreachable

        try:
            return await call
        except (RouterClosed, EOFError) as exc:
            raise BusLost(f"lost the connection to the {self.bus} bus") from exc
        except DaemonUnreachable as exc:
            if isinstance(exc.__cause__, ConnectionError):  # the client's words for it
                raise BusLost(f"lost the connection to the {self.bus} bus") from exc
            raise

    async def resync(self) -> None:
        """resourced (re)appeared: show what it says now."""
        checks = await self.describe_health()
        await self.read_blackouts()
        if checks is None:
            return
        self.current = {c["name"]: (str(c.get("level", "")), str(c.get("reason") or ""))
                        for c in checks}
        await self.ask_server()
        await self.apply(self.bubbles.resync(self.current))

    # -- talking to the notification server --------------------------------------------
    async def ask_server(self) -> None:
        """``GetCapabilities``, once per server: do its bubbles get actions?"""
        if self.capabilities is not None:
            return
        from jeepney import new_method_call
        from jeepney.low_level import HeaderFields

        try:
            reply = await self._call(self.notifications,
                                     new_method_call(_notifications(), "GetCapabilities"))
        except TimeoutError:
            log.warning("the notification server did not say what it can do; no actions")
            self.capabilities = frozenset()
            return
        error = _error_name(reply)
        if error in SERVER_GONE:
            return  # no server: asked again with the next bubble
        if error:
            log.warning("cannot ask the notification server what it can do: %s; no actions",
                        error)
            self.capabilities = frozenset()
        else:
            self.capabilities = frozenset(c for c in reply.body[0] if isinstance(c, str))
        self.server = reply.header.fields.get(HeaderFields.sender)
        self.bubbles.actions_supported = "actions" in self.capabilities
        log.info("the notification server %s actions",
                 "supports" if self.bubbles.actions_supported else "does not support")

    def forget_server(self) -> None:
        """The notification server changed or went away: its ids and abilities with it."""
        self.bubbles.forget_all()
        self.bubbles.actions_supported = False
        self.server = self.capabilities = self._token = None

    async def apply(self, actions) -> None:
        for action in actions:
            if isinstance(action, Show):
                await self._show(action)
            elif isinstance(action, Close):
                await self._close(action)

    async def _show(self, show: Show) -> None:
        from jeepney import new_method_call

        hints = {"urgency": ("y", show.urgency), "category": ("s", "device")}
        msg = new_method_call(_notifications(), "Notify", "susssasa{sv}i", (
            APP_NAME, show.replaces_id, show.icon, show.summary, show.body, list(show.actions),
            hints, show.expire_timeout))
        reply = await self._notify_call(msg, f"show {show.summary!r}")
        if reply is not None:
            self.bubbles.shown(show, reply.body[0])

    async def _close(self, close: Close) -> None:
        from jeepney import new_method_call

        msg = new_method_call(_notifications(), "CloseNotification", "u", (close.id,))
        await self._notify_call(msg, f"close the bubble of {close.check}")

    async def _notify_call(self, msg, what: str):
        try:
            reply = await self._call(self.notifications, msg)
        except TimeoutError:
            log.warning("cannot %s: the notification server did not answer", what)
            return None
        error = _error_name(reply)
        if error in SERVER_GONE:
            log.warning("cannot %s: no notification server (%s); retrying at the next change",
                        what, error)
            self.forget_server()
            return None
        if error:
            log.warning("cannot %s: %s %s", what, error, reply.body[0] if reply.body else "")
            return None
        return reply

    async def _call(self, router, msg):
        import asyncio

        from jeepney.io.common import RouterClosed

        try:
            return await asyncio.wait_for(router.send_and_get_reply(msg), CALL_TIMEOUT)
        except (RouterClosed, EOFError, ConnectionError) as exc:
            raise BusLost(f"lost the connection to the {self._names[id(router)]} bus") from exc


def _calendar_rules():
    """What changes the calendar's bubbles: my bookings, claims' ends, notices."""
    from resourced.client import signals
    from resourced.protocol.names import (
        CLAIM_IFACE,
        MANAGER_IFACE,
        MANAGER_PATH,
        USER_IFACE,
        user_path,
    )

    return [signals.rule(USER_IFACE, "BookingChanged", user_path(os.getuid())),
            signals.rule(CLAIM_IFACE, "Ending"),
            signals.rule(MANAGER_IFACE, "NoticeAdded", MANAGER_PATH)]


def _notifications():
    from jeepney import DBusAddress

    return DBusAddress(NOTIFICATIONS_PATH, bus_name=NOTIFICATIONS, interface=NOTIFICATIONS)


def _error_name(reply) -> str | None:
    from jeepney import MessageType
    from jeepney.low_level import HeaderFields

    if reply.header.message_type is MessageType.error:
        return reply.header.fields.get(HeaderFields.error_name, "")
    return None


# -- the command ------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def _router(bus: str):
    """A jeepney router on ``bus``; closing one whose bus is gone raises nothing."""
    from jeepney.io.asyncio import open_dbus_router
    from jeepney.io.common import RouterClosed

    from resourced.client.discovery import bus_address

    opener = open_dbus_router(bus_address(bus))
    try:
        router = await opener.__aenter__()
    except KeyError as exc:  # jeepney: the address variable is not set
        raise GpuctlError(f"cannot reach the {bus} bus: ${exc.args[0]} is not set") from exc
    except (OSError, ValueError, EOFError) as exc:
        raise GpuctlError(f"cannot reach the {bus} bus: {exc or type(exc).__name__}") from exc
    try:
        yield router
    finally:
        # jeepney re-raises the receiver's EOFError here when the bus went away first
        with contextlib.suppress(EOFError, OSError, RouterClosed):
            await opener.__aexit__(None, None, None)


async def run_agent(requested_bus: str | None) -> None:
    """Run until SIGTERM or SIGINT (returns) or a lost bus connection (raises)."""
    import asyncio

    from resourced.client.discovery import choose_bus

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    bus = await asyncio.to_thread(choose_bus, requested_bus)
    async with contextlib.AsyncExitStack() as stack:
        daemon = await stack.enter_async_context(_router(bus))
        session = daemon if bus == "session" else await stack.enter_async_context(
            _router("session"))
        work = asyncio.create_task(Agent(daemon, session, bus).run())
        stopped = asyncio.create_task(stop.wait())
        await asyncio.wait({work, stopped}, return_when=asyncio.FIRST_COMPLETED)
        for task in (work, stopped):
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await stopped
        try:
            await work
        except asyncio.CancelledError:
            pass
        except BusLost as exc:
            raise GpuctlError(str(exc)) from None
