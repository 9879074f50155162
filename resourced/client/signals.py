"""One way to hear the daemon's signals, for gpuctl top, the runner, notify, a command's
reclaim forwarder and the clients: from the daemon, and from nobody else.

A match rule only says what the bus should send us; it keeps nothing out.  Any connection
may send a signal addressed to ours (a unicast signal), and the bus delivers it whatever
our rules say.  What a connection cannot forge is the sender field: the bus writes it.  So
a signal is acted on only when its sender is the unique name that owns ``org.resourced``
now, as the bus driver said (``GetNameOwner``) and keeps saying (``NameOwnerChanged``, sent
by the driver itself, ``org.freedesktop.DBus``, a name no connection can take).
``FromDaemon`` holds that rule for every listener; the rules asked of the bus name the
daemon as their sender too, so the bus sends us nothing else of its own accord.
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
    """The rule as a local filter applies it: without the sender, which on the wire is
    the owner's unique name, not the well-known one (``FromDaemon`` checks the sender)."""
    from jeepney import MatchRule

    fields = {k: v for k, v in match.header_fields.items() if k != "sender"}
    copy = MatchRule(**fields)
    copy.arg_conditions = dict(match.arg_conditions)
    return copy


class FromDaemon:
    """A filter (jeepney asks only ``matches``): the signals that one of ``filters`` matches
    and that the owner of ``name`` sent, and the bus driver's ``NameOwnerChanged`` of
    ``name``, which keeps ``owner`` current as the messages arrive, in their order (the
    driver tells of a new owner before that owner's first signal reaches us).

    ``owner`` is None until known (``follow``, ``listen``): then nothing but the driver's
    news passes."""

    def __init__(self, filters, name: str = BUS_NAME):
        self.filters = list(filters)
        self.name = name
        self.owner: str | None = None

    def matches(self, msg) -> bool:
        from jeepney import MessageType
        from jeepney.low_level import HeaderFields

        if msg.header.message_type is not MessageType.signal:
            return False
        fields = msg.header.fields
        sender = fields.get(HeaderFields.sender)
        if sender == DBUS:
            if (fields.get(HeaderFields.member) == "NameOwnerChanged"
                    and len(msg.body) == 3 and msg.body[0] == self.name):
                self.owner = msg.body[2] or None
                return True
            return False
        return (self.owner is not None and sender == self.owner
                and any(f.matches(msg) for f in self.filters))

    def learn(self, reply) -> None:
        """The owner from the bus driver's answer to ``GetNameOwner`` (an error: none)."""
        from jeepney import MessageType

        self.owner = (reply.body[0] if reply.header.message_type is MessageType.method_return
                      else None)


def is_owner_change(msg) -> bool:
    """Whether ``msg`` is the bus driver's ``NameOwnerChanged`` (``FromDaemon`` lets only
    the driver's own through)."""
    from jeepney.low_level import HeaderFields

    return msg.header.fields.get(HeaderFields.member) == "NameOwnerChanged"


def follow(heard: FromDaemon):
    """Client steps: ask the bus for the driver's news of ``heard.name``, then learn its
    owner now (after asking: a change in between is heard, in order)."""
    from jeepney.bus_messages import message_bus

    from .steps import Raw, Subscribe

    yield Subscribe(owner_changed(heard.name))
    heard.learn((yield Raw(message_bus.GetNameOwner(heard.name))))


def listen(bus: str, rules, timeout: float, name: str = BUS_NAME):
    """A blocking connection of its own on ``bus`` (a name, ``discovery.bus_address``),
    with ``rules`` and the owner's changes asked of the bus, and the ``FromDaemon`` of
    ``rules`` that knows the owner now: ``(conn, heard)``; filter with ``heard``
    (``conn.filter(heard)``, or ``heard.matches`` on what ``conn.receive()`` gives).
    OSError and its kin when the bus cannot be had."""
    from jeepney.bus_messages import message_bus
    from jeepney.io.blocking import open_dbus_connection

    from .discovery import bus_address

    conn = open_dbus_connection(bus_address(bus))
    heard = FromDaemon([local(match) for match in rules], name)
    try:
        for match in (*rules, owner_changed(name)):
            conn.send_and_get_reply(message_bus.AddMatch(match), timeout=timeout)
        heard.learn(conn.send_and_get_reply(message_bus.GetNameOwner(name), timeout=timeout))
    except BaseException:
        conn.close()
        raise
    return conn, heard


async def listen_async(router, rules, queue, timeout: float, name: str = BUS_NAME):
    """On a jeepney asyncio ``router``, put into ``queue`` (an ``asyncio.Queue``) what
    ``rules`` match of the owner of ``name``'s signals, and the owner's changes; ask the
    bus for them. ``(filter, heard)``: the filter to close when done, and the
    ``FromDaemon`` that knows the owner now."""
    import asyncio

    from jeepney.bus_messages import message_bus

    heard = FromDaemon([local(match) for match in rules], name)
    handle = router.filter(heard, queue=queue)
    for match in (*rules, owner_changed(name)):
        await asyncio.wait_for(router.send_and_get_reply(message_bus.AddMatch(match)), timeout)
    heard.learn(await asyncio.wait_for(
        router.send_and_get_reply(message_bus.GetNameOwner(name)), timeout))
    return handle, heard
