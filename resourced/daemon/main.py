"""The resourced daemon: wires the engine to the bus and runs the event loop.

    resourced [--session | --system | --shared DIR [--group G]] [--config FILE] [--replace]

Start-up order: read the GPUs, export the objects, then take the bus name, so a client
that sees ``org.resourced`` owned always finds a usable API.
"""

import argparse
import asyncio
import contextlib
import grp
import logging
import os
import resource
import signal
import sqlite3
import sys
import time
from pathlib import Path

from dbus_fast import BusType, Message, MessageType, NameFlag, RequestNameReply

from resourced import __version__
from resourced.backends import select_backend
from resourced.config import Config, ConfigError, find_config, load_config, reload_changes
from resourced.evidence.host import host_pools
from resourced.evidence.processes import boot_id
from resourced.isolation.scopes import Scopes
from resourced.linux.inotify import FileWatch
from resourced.linux.sd import notify, reloading, run_watchdog, setup_logging, watchdog_interval
from resourced.linux.users import user_name
from resourced.protocol.names import (
    BUS_DRIVER,
    BUS_NAME,
    NO_RUNTIME_DIR,
    no_session_bus,
    session_bus_missing,
)
from resourced.protocol.time import clock_from_env

from . import memory
from .bus.caller import remember_call
from .bus.connection import DaemonBus
from .bus.manager import ManagerInterface
from .bus.polkit import SharedAccess
from .engine.engine import Engine
from .health_monitor import HealthMonitor
from .metrics import Metrics, Textfile
from .self_check import diagnose
from .shared_bus import SharedBus, SharedBusError, SharedBusTaken
from .store.calendar import CalendarStore
from .store.claims import ClaimStore
from .store.instance import instance_id
from .store.jsonlog import StoreBusy, StoreError
from .store.usage import UsageStore

log = logging.getLogger("resourced")

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_NAME_TAKEN = 3


class StartupError(Exception):
    """The daemon cannot start; the message says why and ``exit_code`` how to exit."""

    def __init__(self, message: str, exit_code: int = EXIT_FAILURE):
        super().__init__(message)
        self.exit_code = exit_code


ENVIRONMENT = """environment:
  RESOURCED_CONFIG          the configuration file (after --config)
  RESOURCED_RUNTIME_DIR     where live claims are kept (default: per mode)
  RESOURCED_STATE_DIR       where the calendar and the usage history are kept
  RESOURCED_SIMULATED_GPUS  simulated GPUs: a number (0-4096) or a simulation file
  RESOURCED_SIMULATED_CLOCK with simulated GPUs: a file holding the instant that is now
  RESOURCED_JOURNAL_SOCKET  the journal's socket for the audit events
  DBUS_SESSION_BUS_ADDRESS, DBUS_SYSTEM_BUS_ADDRESS  the buses
  XDG_RUNTIME_DIR, XDG_STATE_HOME  the session daemon's default directories
  NOTIFY_SOCKET, WATCHDOG_USEC, WATCHDOG_PID, STATE_DIRECTORY, JOURNAL_STREAM  set by systemd"""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="resourced", description="The resourced daemon.",
                                epilog=ENVIRONMENT,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    bus = p.add_mutually_exclusive_group()
    bus.add_argument("--session", dest="mode", action="store_const", const="session",
                     help="serve one user on the session bus (the default)")
    bus.add_argument("--system", dest="mode", action="store_const", const="system",
                     help="serve every user on the system bus")
    bus.add_argument("--shared", metavar="DIR",
                     help="host a bus of its own in DIR for a group, without root "
                          "(default: [daemon] shared_dir)")
    p.add_argument("--group", metavar="GROUP",
                   help="with --shared: the group that may use it (default: [daemon] "
                        "access_group)")
    p.add_argument("--config", metavar="FILE", help="configuration file")
    p.add_argument("--replace", action="store_true",
                   help="take the bus name from a running daemon (for development)")
    p.add_argument("--version", action="version", version=f"resourced {__version__}")
    args = p.parse_args(argv)
    if args.shared is not None:
        args.mode = "shared"
    if args.group is not None and args.mode not in (None, "shared"):
        p.error("--group goes with --shared")
    if args.replace and args.mode == "shared":
        p.error("--replace does not apply to --shared: the directory's lock keeps one host")
    return args


def runtime_dir(mode: str, configured: str, environ=os.environ, shared: str | None = None
                ) -> Path:
    """Where live claims are kept: $RESOURCED_RUNTIME_DIR, the config's, else per mode; a
    shared bus's host reached through su or sudo -u has no $XDG_RUNTIME_DIR, and keeps
    them in DIR/runtime instead."""
    if environ.get("RESOURCED_RUNTIME_DIR"):
        return Path(environ["RESOURCED_RUNTIME_DIR"])
    if configured:
        return Path(configured)
    if mode == "system":
        return Path("/run/resourced")
    if mode == "shared" and shared and not environ.get("XDG_RUNTIME_DIR"):
        return Path(shared) / "runtime"
    if not environ.get("XDG_RUNTIME_DIR"):
        raise StartupError(f"XDG_RUNTIME_DIR is not set (a shell of dbus-run-session or a bare "
                           f"login has none): log in through a session manager, or "
                           f"{NO_RUNTIME_DIR}, or "
                           "set RESOURCED_RUNTIME_DIR", EXIT_USAGE)
    return Path(environ["XDG_RUNTIME_DIR"]) / "resourced"


def state_dir(mode: str, configured: str, environ=os.environ) -> Path:
    """Where the calendar lasts: $RESOURCED_STATE_DIR, the config's, else systemd's
    $STATE_DIRECTORY or /var/lib/resourced (system), else $XDG_STATE_HOME/resourced."""
    if environ.get("RESOURCED_STATE_DIR"):
        return Path(environ["RESOURCED_STATE_DIR"])
    if configured:
        return Path(configured)
    if mode == "system":
        return Path(environ.get("STATE_DIRECTORY", "/var/lib/resourced").split(":")[0])
    base = environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "resourced"


def status_line(engine: Engine) -> str:
    ledger = engine.ledger
    return (f"{len(ledger.gpus)} GPU(s), {engine.tracker.free_count()} free, "
            f"{len(ledger.claims)} claim(s)")


def _status_notifier(engine: Engine):
    """An engine listener that tells the service manager the new STATUS= after a change:
    once the reply has gone out, once for the changes of one loop turn, and only when it
    reads otherwise (it sent a datagram before every reply, from a new socket)."""
    last, pending = [""], [False]

    def send() -> None:
        pending[0] = False
        text = status_line(engine)
        if text != last[0]:
            last[0] = text
            notify(f"STATUS={text}")

    def changed(_events) -> None:
        if not pending[0]:
            pending[0] = True
            engine.after_reply(send)
    return changed


class Reloader:
    """Re-reads the configuration file and applies what needs no restart."""

    def __init__(self, path: Path | None, config: Config, engine: Engine, health: HealthMonitor,
                 metrics: Metrics, textfile: Textfile):
        self.path = path
        self.config = config
        self.started = config  # what needs a restart is what differs from this
        self.engine = engine
        self.health = health
        self.metrics = metrics
        self.textfile = textfile

    def reload(self) -> tuple[list[str], list[str]]:
        """(keys applied, keys that need a restart); ConfigError keeps the old config."""
        reloading()
        try:
            new = load_config(self.path)
        except ConfigError as exc:
            log.error("reload refused, keeping the running configuration: %s", exc)
            raise
        finally:
            notify("READY=1")
        applied = reload_changes(self.config, new)[0]
        restart = reload_changes(self.started, new)[1]
        self.engine.apply_settings(new.daemon)
        self.health.apply(new.checks, new.daemon.sample_interval, new.daemon.probe_timeout)
        self.metrics.refresh = new.daemon.sample_interval
        self.textfile.move(new.metrics.textfile)
        self.config = new
        log.info("configuration reloaded from %s; applied: %s; needs a restart: %s",
                 self.path or "defaults", ", ".join(applied) or "nothing",
                 ", ".join(restart) or "nothing")
        return applied, restart


def load_startup_config(args: argparse.Namespace) -> tuple[Path | None, Config]:
    """The configuration; it also settles the mode left open (--shared without --session
    or --system where ``shared_dir`` is set, else the session bus)."""
    try:
        path = find_config(args.config, os.environ, system=args.mode == "system")
        config = load_config(path)
    except ConfigError as exc:
        raise StartupError(str(exc), EXIT_USAGE) from exc
    if args.mode is None:
        args.mode = "shared" if config.daemon.shared_dir else "session"
    if args.mode == "shared":
        args.shared = args.shared or config.daemon.shared_dir
        args.group = args.group or config.daemon.access_group
    return path, config


async def host_shared_bus(args: argparse.Namespace) -> SharedBus:
    """Take DIR and start its bus (``resourced --shared``)."""
    shared = SharedBus(args.shared, args.group)
    try:
        shared.prepare()
    except SharedBusError as exc:
        raise StartupError(str(exc), EXIT_NAME_TAKEN if isinstance(exc, SharedBusTaken)
                           else EXIT_FAILURE) from exc
    try:
        await shared.start()
    except SharedBusError as exc:
        shared.close()
        raise StartupError(str(exc)) from exc
    log.info("hosting the shared bus %s for group %s (bus pid %d)", shared.address,
             shared.group, shared.pid)
    return shared


async def connect(args: argparse.Namespace, shared: SharedBus | None,
                  stop: asyncio.Event) -> DaemonBus:
    """A connection to the mode's bus, with the daemon's message handlers."""
    try:
        if shared:
            bus = await DaemonBus(bus_address=shared.address).connect()
        else:
            bus_type = BusType.SYSTEM if args.mode == "system" else BusType.SESSION
            bus = await DaemonBus(bus_type=bus_type).connect()
    except (OSError, ValueError) as exc:
        if args.mode == "session" and not shared and session_bus_missing():
            raise StartupError(f"{no_session_bus()}; then: resourced --session") from exc
        raise StartupError(f"cannot connect to the {args.mode} bus: {exc}") from exc
    bus.add_message_handler(remember_call)
    bus.add_message_handler(_name_lost_watcher(stop))
    return bus


RESTART_TRIES = 5


async def restart_shared_bus(args, shared: SharedBus, stop: asyncio.Event) -> DaemonBus | None:
    """The shared bus died: start it again and connect (a few tries, a second apart);
    None if it will not come back."""
    for attempt in range(1, RESTART_TRIES + 1):
        await shared.stop()
        try:
            await shared.start()
            bus = await connect(args, shared, stop)
        except (SharedBusError, StartupError) as exc:
            log.error("restarting the shared bus (try %d of %d): %s", attempt, RESTART_TRIES, exc)
            await asyncio.sleep(1)
            continue
        log.warning("the shared bus stopped; started it again (bus pid %d)", shared.pid)
        return bus
    return None


NAME_TAKEN_MESSAGE = ("{name} is already owned on the {mode} bus: another resourced is running "
                      "(stop it, or start this one with --replace)")
REPLACE_WAIT = 10.0


async def take_name(bus, mode: str, replace: bool) -> None:
    flags = NameFlag.DO_NOT_QUEUE | NameFlag.ALLOW_REPLACEMENT
    if replace:
        flags |= NameFlag.REPLACE_EXISTING
    reply = await bus.request_name(BUS_NAME, flags)
    if reply not in (RequestNameReply.PRIMARY_OWNER, RequestNameReply.ALREADY_OWNER):
        raise StartupError(NAME_TAKEN_MESSAGE.format(name=BUS_NAME, mode=mode), EXIT_NAME_TAKEN)


async def open_store(opener, wait: float):
    """Lock a directory (``opener()``: a store on it), waiting up to ``wait`` seconds for a
    previous daemon to let go of it."""
    deadline = time.monotonic() + wait
    while True:
        try:
            return opener()
        except StoreBusy:
            if time.monotonic() >= deadline:
                raise
            await asyncio.sleep(0.05)


async def serve(args: argparse.Namespace) -> int:
    loop = asyncio.get_running_loop()
    config_path, config = load_startup_config(args)
    try:
        backend = select_backend()
    except ValueError as exc:  # RESOURCED_SIMULATED_GPUS that names nothing
        raise StartupError(str(exc), EXIT_USAGE) from exc
    stop = asyncio.Event()
    shared = await host_shared_bus(args) if args.mode == "shared" else None
    try:
        bus = await connect(args, shared, stop)
    except StartupError:
        await _close_shared(shared)
        raise
    try:
        # --replace takes the name first, so the old daemon exits and frees the directory;
        # otherwise the name is taken last, once the API is complete.
        if args.replace:
            await take_name(bus, args.mode, replace=True)
        try:
            runtime = runtime_dir(args.mode, config.daemon.runtime_dir, shared=args.shared)
            store = await open_store(lambda: ClaimStore(runtime, boot_id()),
                                     REPLACE_WAIT if args.replace else 0)
        except StoreBusy as exc:
            if await _name_owned(bus):
                raise StartupError(NAME_TAKEN_MESSAGE.format(name=BUS_NAME, mode=args.mode),
                                   EXIT_NAME_TAKEN) from exc
            raise StartupError(str(exc), EXIT_NAME_TAKEN) from exc
        except StoreError as exc:
            raise StartupError(str(exc), EXIT_FAILURE) from exc
        try:
            restored = store.load() if config.daemon.persist else {}
        except (StoreError, OSError) as exc:
            store.close()
            raise StartupError(str(exc), EXIT_FAILURE) from exc
        try:
            state = state_dir(args.mode, config.daemon.state_dir)
            calendar = await open_store(lambda: CalendarStore(state),
                                        REPLACE_WAIT if args.replace else 0)
            usage = UsageStore(state)
            instance = instance_id(state)
            clock, simulated = clock_from_env()
        except (StoreError, ValueError, OSError, sqlite3.Error) as exc:
            store.close()
            raise StartupError(str(exc), EXIT_FAILURE) from exc
    except StartupError:
        bus.disconnect()
        await _close_shared(shared)
        raise
    engine = Engine(backend, store if config.daemon.persist else None,
                    config.daemon, config.gpus, host_pools(config.pools), clock=clock,
                    calendar_store=calendar, poll_clock=simulated, usage_store=usage,
                    slurm=config.slurm, scopes=Scopes(bus) if args.mode == "system" else None,
                    shared=args.mode != "session")
    try:
        await engine.start(restored)
    except (StoreError, OSError, ValueError) as exc:
        store.close()
        calendar.close()
        usage.close()
        bus.disconnect()
        await _close_shared(shared)
        raise StartupError(f"cannot read the calendar: {exc}", EXIT_FAILURE) from exc
    clock_watch = _watch_clock(clock, engine) if simulated else None
    health = HealthMonitor(config.checks, config.daemon.sample_interval,
                           config.daemon.probe_timeout)
    await health.sample_now()  # so the first answer never shows "not measured yet"
    metrics = Metrics(engine, health, args.mode, _count_start(usage, engine),
                      config.daemon.sample_interval)
    textfile = Textfile(metrics, config.metrics.textfile)
    reloader = Reloader(config_path, config, engine, health, metrics, textfile)
    manager = ManagerInterface(
        bus, engine, args.mode, health, reloader.reload,
        shared_access(shared) if shared else None, metrics,
        lambda: diagnose(engine, {"runtime": runtime, "state": state}, len(config.gpus)),
        instance)
    manager.export()
    engine.subscribe(textfile.changed)
    health.on_sample(textfile.write)
    sampling = asyncio.ensure_future(health.run())
    if not args.replace:
        try:
            await take_name(bus, args.mode, replace=False)
        except StartupError:
            engine.close()
            store.close()
            calendar.close()
            usage.close()
            bus.disconnect()
            await _close_shared(shared)
            raise
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    loop.add_signal_handler(signal.SIGHUP, _reload_quietly, reloader)
    log.info(
        "resourced %s serving %d GPU(s) (%s backend) on the %s bus",
        __version__, len(engine.ledger.gpus), engine.backend.name, args.mode,
    )
    for note in config.notes:
        log.warning("%s: %s", config_path, note)
    if os.environ.get("NOTIFY_SOCKET"):  # (read once: so does every notify)
        engine.subscribe(_status_notifier(engine))
    memory.trim()  # what reading the claims and the calendar left behind
    textfile.write()
    notify("READY=1", f"STATUS={status_line(engine)}")
    interval = watchdog_interval()
    watchdog = asyncio.ensure_future(run_watchdog(interval)) if interval else None
    stopping = asyncio.ensure_future(stop.wait())
    while True:
        disconnected = asyncio.ensure_future(bus.wait_for_disconnect())
        await asyncio.wait({disconnected, stopping}, return_when=asyncio.FIRST_COMPLETED)
        if stopping.done() or shared is None:
            break
        with contextlib.suppress(Exception):
            disconnected.exception()  # the bus died: it is started again below
        new_bus = await restart_shared_bus(args, shared, stop)
        if new_bus is None:
            break
        bus = new_bus
        manager.move_to(bus)
        try:
            await take_name(bus, args.mode, replace=False)
        except StartupError as exc:
            log.error("%s", exc)
            break
    lost = not stop.is_set()  # the bus went away (and did not come back)
    notify("STOPPING=1")
    stopping.cancel()
    sampling.cancel()
    textfile.close()
    health.close()
    if watchdog:
        watchdog.cancel()
    if clock_watch:
        clock_watch.close()
    engine.close()
    store.close()
    calendar.close()
    usage.close()
    if lost:
        log.error("lost the connection to the %s bus", args.mode)
        with contextlib.suppress(Exception):
            disconnected.exception()  # retrieved: the reason is the log line above
        await _close_shared(shared)
        return EXIT_FAILURE
    log.info("resourced stopping")
    bus.disconnect()
    with contextlib.suppress(EOFError, OSError):
        await disconnected
    await _close_shared(shared)
    return EXIT_OK


def _watch_clock(clock, engine: Engine) -> FileWatch | None:
    """A new instant in the simulated clock's file acts at once (deadlines, the calendar),
    not at the daemon's next look, at most a second later; without inotify, the looks."""
    try:
        return FileWatch(clock.path, engine.alarms.run_due)
    except OSError as exc:
        log.warning("the simulated clock is looked at each second only: %s", exc)
        return None


def _count_start(usage: UsageStore, engine: Engine) -> int:
    """Note this start in the usage history; the starts so far (0 if it cannot say)."""
    try:
        return usage.record_start(engine.clock(), __version__)
    except sqlite3.Error as exc:
        log.error("cannot count this start in %s: %s", usage.path, exc)
        return 0


async def _close_shared(shared: SharedBus | None) -> None:
    if shared:
        await shared.stop()
        shared.close()


def shared_access(shared: SharedBus) -> SharedAccess:
    """Who administers the shared bus (this account) and which group uses it."""
    uid = os.getuid()
    return SharedAccess(uid, user_name(uid), shared.group,
                        grp.getgrnam(shared.group).gr_gid)


async def _name_owned(bus) -> bool:
    reply = await bus.call(Message(**BUS_DRIVER, member="NameHasOwner", signature="s",
                                   body=[BUS_NAME]))
    return reply.message_type is MessageType.METHOD_RETURN and reply.body[0]


def _reload_quietly(reloader: Reloader) -> None:
    """SIGHUP: reload; a bad file is logged (by reload) and the running config kept."""
    with contextlib.suppress(ConfigError):
        reloader.reload()


def _name_lost_watcher(stop: asyncio.Event):
    """Stop serving when another daemon takes the name with --replace."""

    def handler(msg: Message) -> None:
        if (
            msg.message_type is MessageType.SIGNAL
            and msg.member == "NameLost"
            and msg.sender == "org.freedesktop.DBus"
            and msg.body == [BUS_NAME]
        ):
            log.warning("%s was taken over by another daemon", BUS_NAME)
            stop.set()

    return handler


def raise_file_limit() -> None:
    """One pidfd per watched process: take the hard limit on open files, not the soft 1024."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    setup_logging()
    raise_file_limit()
    try:
        return asyncio.run(serve(args))
    except StartupError as exc:
        log.error("%s", exc)
        return exc.exit_code


def entry() -> None:
    """The ``resourced`` command (and ``python -m resourced.daemon``): ``main``, then out
    at once.  By then every store is closed and synced and the bus left; the
    interpreter's own teardown (freeing every module and object) took 85 ms, most of what
    a stop cost, on every restart and every test's daemon."""
    code = main()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
