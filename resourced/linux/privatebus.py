"""A private D-Bus session bus, for the demo and the tests: nothing leaks to the real one.

The bus has a configuration of its own rather than ``--session``: the standard one loads
the machine's service directories, so a call to a name nobody owns (a notification
server, say) would start whatever the machine has installed for it.  Here only the
service files in ``servicedirs`` can be activated.
"""

import contextlib
import ctypes
import os
import select
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


START_TIMEOUT = 10.0
PR_SET_PDEATHSIG = 1  # prctl(2)


class PrivateBus:
    """A session-type ``dbus-daemon`` on its own socket; a context manager that stops it.

    The bus is the starter's child and ends with the thread that started it, killed or not
    (``PR_SET_PDEATHSIG``), and so does a resourced daemon on it (it exits when it loses
    its bus): a demo or a test run stopped with SIGKILL leaves nothing running."""

    def __init__(self, servicedirs: tuple[Path, ...] = ()):
        self.servicedirs = servicedirs
        self.address = ""
        self._dir = ""
        self._proc: subprocess.Popen | None = None

    @property
    def pid(self) -> int:
        """The bus's pid while it runs, else 0."""
        return self._proc.pid if self._proc else 0

    def start(self) -> "PrivateBus":
        self._dir = tempfile.mkdtemp(prefix="resourced-bus-")
        config = Path(self._dir) / "bus.conf"
        dirs = "".join(f"  <servicedir>{escape(str(d))}</servicedir>\n" for d in self.servicedirs)
        config.write_text(CONFIG.format(dir=escape(self._dir), servicedirs=dirs))
        log = open(Path(self._dir) / "bus.log", "w")  # (its warnings, named on a failure)
        try:
            self._proc = subprocess.Popen(
                ["dbus-daemon", f"--config-file={config}", "--nofork", "--nopidfile",
                 "--print-address=1"],
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log, text=True,
                preexec_fn=_ending_with(os.getpid()))
        except FileNotFoundError as exc:
            self._remove_dir()
            raise RuntimeError("dbus-daemon is not installed (Debian: apt-get install dbus-daemon)") from exc
        finally:
            log.close()
        with self._proc.stdout as out:
            ready, _, _ = select.select([out], [], [], START_TIMEOUT)
            self.address = out.readline().strip() if ready else ""
        if not self.address:
            said = (Path(self._dir) / "bus.log").read_text().strip()
            self.stop()
            raise RuntimeError(f"dbus-daemon gave no address within {START_TIMEOUT:g} s"
                               + (f": {said.splitlines()[-1]}" if said else ""))
        return self

    def stop(self) -> None:
        if self._proc is not None:
            with contextlib.suppress(ProcessLookupError):
                self._proc.send_signal(signal.SIGTERM)
            try:
                self._proc.wait(START_TIMEOUT)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._proc = None
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


def _ending_with(parent: int):
    """What the bus runs before exec: a SIGTERM when ``parent``'s starting thread ends
    (and at once if it has ended already).  The function is looked up here, before the
    fork, so that the child only calls it."""
    prctl = ctypes.CDLL(None, use_errno=True).prctl

    def child() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGTERM)
    return child
