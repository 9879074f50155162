"""Which bus a client uses, the one order for gpuctl, both clients, the services and the
MCP server; and how it finds a shared bus and decides to trust it.

The order: the bus named (``bus=``, ``--bus``), else ``$RESOURCED_BUS``; else the shared
bus this account is connected to; else the session bus, where ``org.resourced`` runs or
can be started (an activation file, as ``gpuctl service enable --user`` installs); else
the system bus.

A shared bus's address is ``$RESOURCED_BUS_ADDRESS``, else the directory that ``gpuctl connect DIR``
wrote into ``$XDG_CONFIG_HOME/resourced/client.toml``. The host is the owner of that
directory: a client talks to ``org.resourced`` there only if that account owns the name,
so nobody else can stand in for the service while it is down. Light on imports (no
pathlib: paths are strings here), as every client start may read this.
"""

import os
from collections import namedtuple

from resourced.errors import AccessDenied, DaemonUnreachable, InvalidArgs
from resourced.linux.users import user_name
from resourced.linux.xdg import base_dir
from resourced.protocol.names import BUS_NAME, SHARED_SOCKET, shared_bus_address

from .sandbox import refused

BUSES = ("session", "system", "shared")
ADDRESS_VARIABLE = "RESOURCED_BUS_ADDRESS"
CLIENT_FILE = "client.toml"


def named_bus(bus: str | None, environ=os.environ) -> str | None:
    """The bus named by the caller, else by ``$RESOURCED_BUS``; None: none is."""
    bus = bus or environ.get("RESOURCED_BUS") or None
    if bus is not None and bus not in BUSES:
        raise InvalidArgs(f"bus must be 'session', 'system' or 'shared', not {bus!r}")
    return bus


def preset_bus(bus: str | None, environ=os.environ) -> str | None:
    """The bus the order gives without asking any: the one named, else the shared bus
    when this account is connected to one.  None: ask the session bus (``serves``)."""
    bus = named_bus(bus, environ)
    if bus is None and configured(environ):
        return "shared"
    return bus


def serves(owned: bool, activatable: list[str]) -> bool:
    """Whether the session bus is the one: ``org.resourced`` owned there (NameHasOwner),
    or among the names it can start (ListActivatableNames)."""
    return owned or BUS_NAME in activatable


def bus_address(bus: str) -> str:
    """What jeepney opens for a bus by name: SESSION, SYSTEM, or the shared bus's address
    (for connections that only listen; ``Client`` also checks who hosts a shared bus)."""
    return target().address if bus == "shared" else bus.upper()


def choose_bus(bus: str | None) -> str:
    """The order, asked over a connection of its own: for the services, which choose once
    at their start and then keep to it."""
    if chosen := preset_bus(bus):
        return chosen
    from jeepney.bus_messages import message_bus
    from jeepney.io.blocking import open_dbus_connection

    try:
        with open_dbus_connection("SESSION") as conn:
            owned = conn.send_and_get_reply(message_bus.NameHasOwner(BUS_NAME), timeout=5)
            if owned.body and owned.body[0] is True:
                return "session"
            names = conn.send_and_get_reply(message_bus.ListActivatableNames(), timeout=5)
    except (OSError, KeyError, ValueError, TimeoutError, EOFError):
        return "system"
    return "session" if serves(False, list(names.body[0]) if names.body else []) else "system"


SharedTarget = namedtuple("SharedTarget", "address directory host_uid")
"""A shared bus: its address, its directory and the uid that must own the service."""


def client_file(environ=os.environ) -> str:
    """This account's client settings (where ``gpuctl connect`` writes)."""
    return os.path.join(base_dir("XDG_CONFIG_HOME", environ), "resourced", CLIENT_FILE)


def connected_dir(environ=os.environ) -> str | None:
    """The directory ``gpuctl connect`` recorded, if any."""
    path = client_file(environ)
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise DaemonUnreachable(f"cannot read {path}: {exc.strerror}") from exc
    import tomllib

    try:
        directory = tomllib.loads(text).get("shared_dir", "")
    except tomllib.TOMLDecodeError as exc:
        raise DaemonUnreachable(f"{path} is not valid TOML ({exc}): run `gpuctl connect DIR` "
                                "again") from exc
    return directory if isinstance(directory, str) and directory else None


def configured(environ=os.environ) -> bool:
    """Whether this account uses a shared bus by default."""
    return bool(environ.get(ADDRESS_VARIABLE)) or os.path.isfile(client_file(environ))


def target(environ=os.environ) -> SharedTarget:
    """The shared bus to use; DaemonUnreachable says how to set one up if there is none."""
    address = environ.get(ADDRESS_VARIABLE, "")
    if address:
        if not address.startswith("unix:path="):
            raise DaemonUnreachable(f"${ADDRESS_VARIABLE} must be unix:path=DIR/{SHARED_SOCKET}, "
                                    f"not {address!r}")
        directory = os.path.dirname(address.removeprefix("unix:path=").split(",")[0])
    else:
        directory = connected_dir(environ)
        if directory is None:
            raise DaemonUnreachable("no shared bus is set up for this account: run "
                                    "`gpuctl connect DIR` with the directory its host gave "
                                    f"you, or set ${ADDRESS_VARIABLE}")
        address = shared_bus_address(directory)
    try:
        host_uid = os.stat(directory).st_uid
    except PermissionError:
        raise not_in_group(directory) from None
    except OSError as exc:
        raise DaemonUnreachable(f"no shared bus at {directory} ({exc.strerror})") from exc
    return SharedTarget(address, directory, host_uid)


def _group_of(directory: str) -> str:
    import grp

    try:
        return grp.getgrgid(os.stat(directory).st_gid).gr_name
    except (OSError, KeyError):
        return "its group"


def not_in_group(directory: str) -> AccessDenied:
    return AccessDenied(f"cannot reach the shared bus in {directory}: permission denied; only "
                        f"members of {_group_of(directory)} may use it (ask its host to add "
                        "you, then log in again)")


def unreachable(target: SharedTarget, exc: Exception) -> Exception:
    """What a failed connection to the shared bus means, in words."""
    host = user_name(target.host_uid)
    if isinstance(exc, PermissionError):
        socket = os.path.join(target.directory, SHARED_SOCKET)
        if os.access(socket, os.R_OK | os.W_OK):  # allowed by its mode: refused by a sandbox
            return refused("shared", exc, socket)
        return not_in_group(target.directory)
    if isinstance(exc, ConnectionRefusedError):
        return DaemonUnreachable(f"the shared bus in {target.directory} is down (its socket is "
                                 f"left from a stopped bus): ask {host} to start resourced "
                                 f"--shared {target.directory}")
    if isinstance(exc, FileNotFoundError):
        return DaemonUnreachable(f"no shared bus runs in {target.directory}: ask {host} to "
                                 f"start resourced --shared {target.directory}")
    if isinstance(exc, (ConnectionResetError, EOFError)) or "auth" in type(exc).__name__.lower():
        return AccessDenied(f"the shared bus in {target.directory} refused this account: its "
                            f"policy admits {host}, root and the members of "
                            f"{_group_of(target.directory)}")
    why = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
    return DaemonUnreachable(f"cannot reach the shared bus in {target.directory} ({why})")


def check_host(target: SharedTarget, owner_uid: int) -> None:
    """Refuse a service whose name is owned by anyone but the directory's owner."""
    if owner_uid != target.host_uid:
        raise AccessDenied(f"org.resourced on the shared bus in {target.directory} is owned by "
                           f"{user_name(owner_uid)}, not by {user_name(target.host_uid)} who "
                           "owns the directory: not trusting it (tell the host)")


def write_connection(directory, environ=os.environ):
    """Record ``directory`` as this account's shared bus; return the file written."""
    from pathlib import Path

    from resourced.linux.atomic_file import write_atomically

    path = Path(client_file(environ))
    path.parent.mkdir(parents=True, exist_ok=True)
    quoted = str(directory).replace("\\", "\\\\").replace('"', '\\"')
    write_atomically(path, "# Written by `gpuctl connect`: the shared bus this account uses.\n"
                     f'shared_dir = "{quoted}"\n', mode=0o644)
    return path
