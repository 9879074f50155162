"""The daemon's bus connection leans on dbus-fast internals to start methods at once: the
installed dbus-fast must have them, or the daemon quietly falls back to dbus-fast's own,
slower handler (a new version that drops one is to be noticed here)."""

import asyncio

from resourced.bus.connection import DaemonBus, eager_methods


def test_the_installed_dbus_fast_lets_methods_start_at_once():
    async def check():
        return eager_methods(DaemonBus(bus_address="unix:path=/nonexistent"))

    assert asyncio.run(check())
