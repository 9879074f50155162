"""Opening a client's connection, as steps: which bus (``discovery``'s one order), and
whether its daemon is the one to trust, for ``Client`` and ``AsyncClient`` alike."""

from jeepney import DBusAddress, new_method_call

from resourced.errors import DaemonUnreachable
from resourced.protocol.names import BUS_NAME

from . import discovery, wire
from .steps import Open, Raw, Shut

_DBUS = DBusAddress("/org/freedesktop/DBus", bus_name="org.freedesktop.DBus",
                    interface="org.freedesktop.DBus")


def _ask_bus(method: str, signature: str | None = None, body: tuple = ()):
    return wire.fast(new_method_call(_DBUS, method, signature, body))


def connect(client):
    """Steps that open ``client``'s connection; the name of the bus it is on."""
    if discovery.preset_bus(client._requested_bus) == "shared":
        target = discovery.target()
        try:
            yield Open(target.address)
        except Exception as exc:  # jeepney's failures to connect or authenticate
            raise discovery.unreachable(target, exc) from exc
        try:
            reply = yield Raw(_ask_bus("GetConnectionUnixUser", "s", (BUS_NAME,)))
            try:
                owner = client._body(reply)[0]
            except DaemonUnreachable:
                raise client._not_running("shared") from None
            discovery.check_host(target, owner)
        except BaseException:
            yield Shut()
            raise
        return "shared"
    if client._requested_bus:
        yield from _open(client, client._requested_bus)
        return client._requested_bus
    if (yield from _session_serves(client)):
        return "session"
    yield from _open(client, "system")
    return "system"


def _open(client, bus: str):
    try:
        yield Open(bus.upper())
    except (OSError, KeyError, ValueError) as exc:
        raise client._unreachable(bus, exc) from exc


def _session_serves(client):
    """Whether the session bus has org.resourced, owned or startable there (the session
    bus open, then); a socket refused on the way is remembered for the message."""
    try:
        yield Open("SESSION")
    except PermissionError as exc:
        client._session_refused = exc
        return False
    except (OSError, KeyError, ValueError):
        return False
    try:
        owned = client._body((yield Raw(_ask_bus("NameHasOwner", "s", (BUS_NAME,)))))[0]
        if owned or discovery.serves(owned, client._body(
                (yield Raw(_ask_bus("ListActivatableNames"))))[0]):
            return True
    except BaseException:
        yield Shut()
        raise
    yield Shut()
    return False
