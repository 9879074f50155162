"""Signals as an outsider sends them: addressed to one connection (unicast), which the bus
delivers whatever the receiver's match rules say. Only the sender field, which the bus
writes, tells them from the daemon's own."""

from jeepney import DBusAddress, new_signal
from jeepney.bus_messages import message_bus
from jeepney.io.blocking import open_dbus_connection
from jeepney.low_level import HeaderFields


def connections_of(pid: int) -> list[str]:
    """The unique names of the connections process ``pid`` has on the session bus."""
    with open_dbus_connection("SESSION") as conn:
        names = conn.send_and_get_reply(message_bus.ListNames()).body[0]
        found = []
        for name in names:
            if name.startswith(":"):
                reply = conn.send_and_get_reply(message_bus.GetConnectionUnixProcessID(name))
                if reply.body and reply.body[0] == pid:
                    found.append(name)
        return found


def forge(destinations, path: str, interface: str, member: str, signature: str, body):
    """Send the signal to each of ``destinations`` from a connection of our own; returns
    once the bus has routed them (a round trip to the bus after them)."""
    with open_dbus_connection("SESSION") as conn:
        for destination in destinations:
            msg = new_signal(DBusAddress(path, interface=interface), member, signature, body)
            msg.header.fields[HeaderFields.destination] = destination
            conn.send(msg)
        conn.send_and_get_reply(message_bus.GetId())
