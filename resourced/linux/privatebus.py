"""A private D-Bus session bus, for the demo and the tests: nothing leaks to the real one.

The bus has a configuration of its own rather than ``--session``: the standard one loads
the machine's service directories, so a call to a name nobody owns (a notification
server, say) would start whatever the machine has installed for it.  Here only the
service files in ``servicedirs`` can be activated.
"""

import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path
from xml.sax.saxutils import escape

CONFIG = """<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>session</type>
  <keep_umask/>
  <listen>unix:dir={dir}</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow send_destination="*" eavesdrop="true"/>
    <allow eavesdrop="true"/>
    <allow own="*"/>
  </policy>
{servicedirs}</busconfig>
"""


class PrivateBus:
    """A session-type ``dbus-daemon`` on its own socket; a context manager that stops it."""

    def __init__(self, servicedirs: tuple[Path, ...] = ()):
        self.servicedirs = servicedirs
        self.address = ""
        self.pid = 0
        self._dir = ""

    def start(self) -> "PrivateBus":
        self._dir = tempfile.mkdtemp(prefix="resourced-bus-")
        config = Path(self._dir) / "bus.conf"
        dirs = "".join(f"  <servicedir>{escape(str(d))}</servicedir>\n" for d in self.servicedirs)
        config.write_text(CONFIG.format(dir=escape(self._dir), servicedirs=dirs))
        try:
            out = subprocess.run(
                ["dbus-daemon", f"--config-file={config}", "--fork", "--nopidfile",
                 "--print-address=1", "--print-pid=1"],
                check=True, capture_output=True, text=True, timeout=10,
            ).stdout.split()
        except FileNotFoundError as exc:
            self._remove_dir()
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
        self._remove_dir()

    def _remove_dir(self) -> None:
        if self._dir:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = ""

    def env(self) -> dict[str, str]:
        """The environment that points programs at this bus (session and system alike)."""
        return {"DBUS_SESSION_BUS_ADDRESS": self.address, "RESOURCED_BUS": "session"}

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
