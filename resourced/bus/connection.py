"""The daemon's bus connection: dbus-fast's, with three changes.

- No ObjectManager Added/Removed signals.  dbus-fast emits
  ``org.freedesktop.DBus.ObjectManager.InterfacesAdded``/``Removed`` on every export and
  unexport, from the *child's* path with every property, where object-manager clients
  (which watch the manager's path) never see them.  For a claim that is two useless
  signals per claim, about a tenth of the daemon's work per claim+release.  The contract
  is ``ClaimNew``/``ClaimRemoved`` on the Manager (see dbus/org.resourced.xml);
  ``GetManagedObjects`` still answers.
- A full socket buffer is not a lost connection.  dbus-fast 5.2 tries to write a new
  message at once when its queue is empty, even while an earlier one is half written;
  the socket then answers EAGAIN, which dbus-fast takes for a fatal error and drops the
  connection, and the daemon exits.  A large reply (Describe with thousands of claims,
  an error quoting a 1 MB argument) racing any other message did that.  The writer's
  socket is wrapped so that EAGAIN reads as "0 bytes written": dbus-fast then waits for
  the socket to become writable, as it does after a partial write.  (Only ``send``: the
  daemon sends no file descriptors, and ``sendmsg`` with them must not be retried
  without them.)
- A signal finds its object's path in O(1).  dbus-fast looks for the path of the
  emitting interface by scanning every exported object, for every signal and every
  PropertiesChanged: with 10,000 claims that was about 0.5 ms per signal and most of the
  daemon's time.  The bus keeps each exported interface's path instead.
"""

import socket

from dbus_fast import Message
from dbus_fast.aio import MessageBus
from dbus_fast.service import ServiceInterface


class _PatientSocket:
    """The writer's view of the socket: a full send buffer writes nothing, and says so."""

    def __init__(self, sock: socket.socket):
        self._sock = sock

    def send(self, data) -> int:
        try:
            return self._sock.send(data)
        except BlockingIOError:
            return 0

    def __getattr__(self, name):
        return getattr(self._sock, name)


class DaemonBus(MessageBus):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._path_of: dict[ServiceInterface, str] = {}  # each exported interface's path

    async def connect(self) -> "DaemonBus":
        await super().connect()
        self._writer.sock = _PatientSocket(self._writer.sock)
        return self

    def export(self, path: str, interface: ServiceInterface) -> None:
        super().export(path, interface)
        self._path_of[interface] = path

    def unexport(self, path: str, interface=None) -> None:
        exported = self._path_exports.get(path, {})
        going = [i for i in exported.values()
                 if interface is None or i is interface or i.name == interface]
        super().unexport(path, interface)
        for i in going:
            self._path_of.pop(i, None)

    def _interface_signal_notify(self, interface, interface_name, member, signature, body,
                                 unix_fds=()) -> None:
        self.send(Message.new_signal(path=self._path_of[interface], interface=interface_name,
                                     member=member, signature=signature, body=body,
                                     unix_fds=list(unix_fds)))

    def _emit_interface_added(self, path, interface) -> None:
        """Not emitted: see the module docstring."""

    def _emit_interface_removed(self, path, removed_interfaces) -> None:
        """Not emitted: see the module docstring."""
