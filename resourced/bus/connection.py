"""The daemon's bus connection: dbus-fast's, without ObjectManager's Added/Removed signals.

dbus-fast emits ``org.freedesktop.DBus.ObjectManager.InterfacesAdded``/``Removed`` on every
export and unexport, from the *child's* path with every property, where object-manager
clients (which watch the manager's path) never see them.  For a claim that is two useless
signals per claim, about a tenth of the daemon's work per claim+release.  The contract is
``ClaimNew``/``ClaimRemoved`` on the Manager (see dbus/org.resourced.xml);
``GetManagedObjects`` still answers.
"""

from dbus_fast.aio import MessageBus


class DaemonBus(MessageBus):
    def _emit_interface_added(self, path, interface) -> None:
        """Not emitted: see the module docstring."""

    def _emit_interface_removed(self, path, removed_interfaces) -> None:
        """Not emitted: see the module docstring."""
