"""The resourced daemon: wires the engine to the bus and runs the event loop.

    resourced [--session | --system] [--config FILE] [--replace]

Start-up order: read the GPUs, export the objects, then take the bus name, so a client
that sees ``org.resourced`` owned always finds a usable API.
"""

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
from pathlib import Path

from dbus_fast import BusType, Message, MessageType, NameFlag, RequestNameReply
from dbus_fast.aio import MessageBus

from . import __version__
from .backends import select_backend
from .bus.caller import remember_call
from .bus.manager import ManagerInterface
from .bus.names import BUS_NAME
from .engine import Engine
from .evidence.processes import boot_id
from .sd import notify, run_watchdog, setup_logging, watchdog_interval
from .store import ClaimStore, StoreError

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


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="resourced", description="The resourced daemon.")
    bus = p.add_mutually_exclusive_group()
    bus.add_argument("--session", dest="mode", action="store_const", const="session",
                     help="serve one user on the session bus (the default)")
    bus.add_argument("--system", dest="mode", action="store_const", const="system",
                     help="serve every user on the system bus")
    p.add_argument("--config", metavar="FILE", help="configuration file")
    p.add_argument("--replace", action="store_true",
                   help="take the bus name from a running daemon (for development)")
    p.add_argument("--version", action="version", version=f"resourced {__version__}")
    p.set_defaults(mode="session")
    return p.parse_args(argv)


def runtime_dir(mode: str, environ=os.environ) -> Path:
    """Where live claims are kept: $RESOURCED_RUNTIME_DIR, else per mode."""
    if environ.get("RESOURCED_RUNTIME_DIR"):
        return Path(environ["RESOURCED_RUNTIME_DIR"])
    if mode == "system":
        return Path("/run/resourced")
    if not environ.get("XDG_RUNTIME_DIR"):
        raise StartupError("XDG_RUNTIME_DIR is not set: log in through a session manager, or "
                           "set RESOURCED_RUNTIME_DIR", EXIT_USAGE)
    return Path(environ["XDG_RUNTIME_DIR"]) / "resourced"


def status_line(engine: Engine) -> str:
    ledger = engine.ledger
    return (f"{len(ledger.gpus)} GPU(s), {engine.free_count()} free, "
            f"{len(ledger.claims)} claim(s)")


async def serve(args: argparse.Namespace) -> int:
    loop = asyncio.get_running_loop()
    try:
        store = ClaimStore(runtime_dir(args.mode), boot_id())
        restored = store.load()
    except StoreError as exc:
        raise StartupError(str(exc), EXIT_NAME_TAKEN) from exc
    engine = Engine(select_backend(), store)
    await engine.start(restored)

    bus_type = BusType.SYSTEM if args.mode == "system" else BusType.SESSION
    try:
        bus = await MessageBus(bus_type=bus_type).connect()
    except (OSError, ValueError) as exc:
        raise StartupError(f"cannot connect to the {args.mode} bus: {exc}") from exc
    bus.add_message_handler(remember_call)
    manager = ManagerInterface(bus, engine, args.mode)
    manager.export()

    stop = asyncio.Event()
    bus.add_message_handler(_name_lost_watcher(stop))
    flags = NameFlag.DO_NOT_QUEUE | NameFlag.ALLOW_REPLACEMENT
    if args.replace:
        flags |= NameFlag.REPLACE_EXISTING
    reply = await bus.request_name(BUS_NAME, flags)
    if reply not in (RequestNameReply.PRIMARY_OWNER, RequestNameReply.ALREADY_OWNER):
        bus.disconnect()
        raise StartupError(
            f"{BUS_NAME} is already owned on the {args.mode} bus: another resourced is "
            "running (stop it, or start this one with --replace)",
            EXIT_NAME_TAKEN,
        )
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    log.info(
        "resourced %s serving %d GPU(s) (%s backend) on the %s bus",
        __version__, len(engine.ledger.gpus), engine.backend.name, args.mode,
    )
    engine.subscribe(lambda _events: notify(f"STATUS={status_line(engine)}"))
    notify("READY=1", f"STATUS={status_line(engine)}")
    interval = watchdog_interval()
    watchdog = asyncio.ensure_future(run_watchdog(interval)) if interval else None
    disconnected = asyncio.ensure_future(bus.wait_for_disconnect())
    stopping = asyncio.ensure_future(stop.wait())
    await asyncio.wait({disconnected, stopping}, return_when=asyncio.FIRST_COMPLETED)
    notify("STOPPING=1")
    stopping.cancel()
    if watchdog:
        watchdog.cancel()
    engine.close()
    store.close()
    if disconnected.done():
        log.error("lost the connection to the %s bus", args.mode)
        disconnected.exception()  # retrieved: the reason is the log line above
        return EXIT_FAILURE
    log.info("resourced stopping")
    bus.disconnect()
    with contextlib.suppress(EOFError, OSError):
        await disconnected
    return EXIT_OK


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


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    setup_logging()
    try:
        return asyncio.run(serve(args))
    except StartupError as exc:
        log.error("%s", exc)
        return exc.exit_code


if __name__ == "__main__":
    sys.exit(main())
