"""One way to hear the daemon's signals, for gpuctl top, the runner, notify, a command's
reclaim forwarder and the clients.

A rule is asked of the bus with the daemon's well-known name as its sender: the bus
checks it against the name's owner now, so nobody else can send what we hear.  The
messages then carry the owner's unique name, which jeepney compares literally, so the
local filter goes without the sender.  ``NameOwnerChanged`` of ``org.resourced`` tells
when the daemon goes or comes back.
"""

from resourced.protocol.names import BUS_NAME

DBUS = "org.freedesktop.DBus"


def rule(interface: str, member: str | None = None, path: str | None = None,
         sender: str = BUS_NAME):
    """A signal rule, as the bus is asked it (with ``sender``)."""
    from jeepney import MatchRule, MessageType

    return MatchRule(type=MessageType.signal, sender=sender, interface=interface,
                     member=member, path=path)


def owner_changed(name: str = BUS_NAME):
    """``NameOwnerChanged`` for ``name``: its owner went, came, or changed."""
    match = rule(DBUS, "NameOwnerChanged", "/org/freedesktop/DBus", sender=DBUS)
    match.add_arg_condition(0, name)
    return match


def local(match):
    """The rule as the local filter applies it: without the sender."""
    from jeepney import MatchRule

    fields = {k: v for k, v in match.header_fields.items() if k != "sender"}
    copy = MatchRule(**fields)
    copy.arg_conditions = dict(match.arg_conditions)
    return copy


def listen(bus: str, rules, timeout: float):
    """A blocking connection of its own on ``bus`` (a name, ``discovery.bus_address``),
    with ``rules`` asked of the bus; what is matched waits on it (``conn.filter``).
    OSError and its kin when the bus cannot be had."""
    from jeepney.bus_messages import message_bus
    from jeepney.io.blocking import open_dbus_connection

    from .discovery import bus_address

    conn = open_dbus_connection(bus_address(bus))
    try:
        for match in rules:
            conn.send_and_get_reply(message_bus.AddMatch(match), timeout=timeout)
    except BaseException:
        conn.close()
        raise
    return conn


async def listen_async(router, rules, queue, timeout: float) -> list:
    """On a jeepney asyncio ``router``, put what ``rules`` match into ``queue`` (an
    ``asyncio.Queue``) and ask the bus for them; the filters, to close when done."""
    import asyncio

    from jeepney.bus_messages import message_bus

    filters = [router.filter(local(match), queue=queue) for match in rules]
    for match in rules:
        await asyncio.wait_for(router.send_and_get_reply(message_bus.AddMatch(match)), timeout)
    return filters
