"""The daemon's signals, heard in a thread: what tells ``gpuctl top`` to read again.

One jeepney connection of its own, on the daemon's bus, asks the bus for

* the Manager's signals (``ClaimNew``, ``ClaimRemoved``, ``LevelChanged``,
  ``NoticeAdded``, ...) on ``/org/resourced``;
* everyone's ``BookingChanged`` (interface ``org.resourced.User``, on any path: each user
  has ``/org/resourced/user/<uid>``);
* the claims' own signals (``Granted`` when a waiter is served, ``Cancelled``, ``Ending``);
* ``NameOwnerChanged`` of ``org.resourced``: the daemon went or came back.

and calls ``on_signal(member)`` for each that the daemon sent (``client.signals``: a signal
anyone else sent to this connection is dropped), from its thread.  It never polls: it blocks on
the socket until the bus sends something.  ``stop()`` shuts the socket down, which wakes
the blocked read.  A lost bus connection calls ``on_lost(reason)`` once and ends the
thread.
"""

import contextlib
import socket
import threading
from collections.abc import Callable

from resourced.protocol.names import BUS_NAME, CLAIM_IFACE, MANAGER_IFACE, MANAGER_PATH, USER_IFACE

DBUS = "org.freedesktop.DBus"
INTERFACES = frozenset({MANAGER_IFACE, USER_IFACE, CLAIM_IFACE})


def match_rules():
    """The rules to ask of the bus (``client.signals``)."""
    from resourced.client import signals

    return [signals.rule(MANAGER_IFACE, path=MANAGER_PATH),
            signals.rule(USER_IFACE, "BookingChanged"), signals.rule(CLAIM_IFACE)]


def wanted(msg) -> str | None:
    """The member of a signal that should make the view read again, else None."""
    from jeepney import MessageType
    from jeepney.low_level import HeaderFields

    if msg.header.message_type != MessageType.signal:
        return None
    fields = msg.header.fields
    interface, member = fields.get(HeaderFields.interface), fields.get(HeaderFields.member)
    if interface in INTERFACES:
        return member
    if interface == DBUS and member == "NameOwnerChanged" and msg.body[:1] == (BUS_NAME,):
        return member
    return None


class Feed(threading.Thread):
    """Listens on ``bus`` (``"session"`` or ``"system"``) until stopped."""

    def __init__(self, bus: str, on_signal: Callable[[str], None],
                 on_lost: Callable[[str], None] = lambda reason: None, timeout: float = 10.0):
        super().__init__(name="resourced-top-feed", daemon=True)
        self.bus = bus
        self.on_signal = on_signal
        self.on_lost = on_lost
        self.timeout = timeout
        self.ready = threading.Event()   # the rules are in place: no change is missed after
        self._stopping = threading.Event()
        self._conn = None
        self._heard = None  # the daemon's signals alone (client.signals.FromDaemon)

    def subscribe(self) -> None:
        """Connect and add the rules; raises when the bus cannot be had (call it before
        ``start`` to fail early, or let ``run`` call it)."""
        from resourced.client.signals import listen

        self._conn, self._heard = listen(self.bus, match_rules(), self.timeout)
        self.ready.set()

    def run(self) -> None:
        try:
            if self._conn is None:
                self.subscribe()
            while not self._stopping.is_set():
                msg = self._conn.receive()
                member = wanted(msg) if self._heard.matches(msg) else None
                if member is not None and not self._stopping.is_set():
                    self.on_signal(member)
        except Exception as exc:  # noqa: BLE001 - any end of the connection ends the feed
            if not self._stopping.is_set():
                self.on_lost(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)
        finally:
            if self._conn is not None:
                with contextlib.suppress(OSError):
                    self._conn.close()

    def stop(self, timeout: float = 2.0) -> None:
        """End the thread: wake its blocked read by shutting the socket down."""
        self._stopping.set()
        conn = self._conn
        if conn is not None:
            with contextlib.suppress(OSError):
                conn.sock.shutdown(socket.SHUT_RDWR)
        if self.is_alive():
            self.join(timeout)
