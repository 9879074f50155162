"""A private D-Bus session bus, for the demo and the tests: nothing leaks to the real one."""

import os
import signal
import subprocess


class PrivateBus:
    """``dbus-daemon --session`` on its own socket; a context manager that stops it."""

    def __init__(self):
        self.address = ""
        self.pid = 0

    def start(self) -> "PrivateBus":
        try:
            out = subprocess.run(
                ["dbus-daemon", "--session", "--fork", "--nopidfile",
                 "--print-address=1", "--print-pid=1"],
                check=True, capture_output=True, text=True, timeout=10,
            ).stdout.split()
        except FileNotFoundError as exc:
            raise RuntimeError("dbus-daemon is not installed (Debian: apt-get install dbus-daemon)") from exc
        self.address, self.pid = out[0], int(out[1])
        return self

    def stop(self) -> None:
        if self.pid:
            try:
                os.kill(self.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            self.pid = 0

    def env(self) -> dict[str, str]:
        """The environment that points programs at this bus (session and system alike)."""
        return {"DBUS_SESSION_BUS_ADDRESS": self.address, "RESOURCED_BUS": "session"}

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
