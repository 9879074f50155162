"""A bus of its own for a group, hosted by an ordinary account (``resourced --shared DIR``).

DIR holds the host's lock, the bus configuration and the bus socket. Its mode (0750, group
G) turns everyone outside G away before the bus does; the bus policy then lets only G, the
host and root connect, only the host own ``org.resourced``, and only them call it. With
EXTERNAL authentication the bus vouches for each caller's uid and groups, which is what
the daemon's authorization reads (``bus.polkit.GroupAuthority``: no polkit on this bus).

The daemon starts the ``dbus-daemon`` as its child, in a session of its own (a Ctrl-C meant
for the daemon does not reach it first) and asked by the kernel to stop when the daemon
dies (``PR_SET_PDEATHSIG``), so a killed daemon leaves no bus behind; a restarted daemon
simply starts a new one on the same path.
"""

import asyncio
import contextlib
import ctypes
import fcntl
import grp
import os
import signal
from pathlib import Path

from resourced.linux.atomic_file import write_atomically
from resourced.linux.users import user_name
from resourced.protocol.names import shared_bus_address

LOCK = "lock"
CONFIG = "bus.conf"
DIR_MODE = 0o750
START_TIMEOUT = 10.0
MAX_CONNECTIONS_PER_USER = 64

SYSTEM_BUS_DEFAULTS = """\
    <deny own="*"/>
    <deny send_type="method_call"/>
    <allow send_type="signal"/>
    <allow send_requested_reply="true" send_type="method_return"/>
    <allow send_requested_reply="true" send_type="error"/>
    <allow receive_type="method_call"/>
    <allow receive_type="method_return"/>
    <allow receive_type="error"/>
    <allow receive_type="signal"/>
    <allow send_destination="org.freedesktop.DBus" send_interface="org.freedesktop.DBus"/>
    <allow send_destination="org.freedesktop.DBus"
           send_interface="org.freedesktop.DBus.Introspectable"/>
    <allow send_destination="org.freedesktop.DBus"
           send_interface="org.freedesktop.DBus.Properties"/>
    <deny send_destination="org.freedesktop.DBus" send_interface="org.freedesktop.DBus"
          send_member="UpdateActivationEnvironment"/>
    <deny send_destination="org.freedesktop.DBus"
          send_interface="org.freedesktop.DBus.Debug.Stats"/>"""
"""The default-deny rules of a system bus's own configuration (Debian's system.conf):
the shared bus keeps them, and so does the private system bus of the system tests."""

BUS_CONFIG = """<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<!-- Written by resourced at each start of the shared bus: edits are overwritten. -->
<busconfig>
  <listen>{listen}</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow user={host}/>
    <allow user="root"/>
    <allow group={group}/>
{defaults}
  </policy>
  <policy user={host}>
    <allow own="org.resourced"/>
    <allow send_destination="org.resourced"/>
  </policy>
  <policy user="root">
    <allow send_destination="org.resourced"/>
  </policy>
  <policy group={group}>
    <allow send_destination="org.resourced"/>
  </policy>
  <limit name="max_connections_per_user">{max_connections}</limit>
</busconfig>
"""


class SharedBusError(Exception):
    """The shared bus cannot be hosted; the message says why."""


class SharedBusTaken(SharedBusError):
    """Another resourced hosts the directory (holds its lock)."""


def bus_config(directory: Path, host: str, group: str) -> str:
    """The configuration of the shared bus: who may connect, own the name and call it."""
    from xml.sax.saxutils import quoteattr  # (here: it imports urllib, 20 ms of every start)

    return BUS_CONFIG.format(listen=shared_bus_address(directory), defaults=SYSTEM_BUS_DEFAULTS,
                             host=quoteattr(host), group=quoteattr(group),
                             max_connections=MAX_CONNECTIONS_PER_USER)


def _die_with_parent() -> None:
    """In the bus's child process: the kernel sends it SIGTERM when the daemon dies."""
    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


class SharedBus:
    """DIR made ready (lock, mode, group, configuration) and the bus started in it."""

    def __init__(self, directory: str | Path, group: str | None = None):
        self.directory = Path(directory).absolute()
        self.group = group
        self.address = shared_bus_address(self.directory)
        self._lock_fd = -1
        self._proc: asyncio.subprocess.Process | None = None

    def prepare(self) -> None:
        """Make DIR (0750, the group), take its lock, write the bus configuration."""
        host = user_name(os.getuid())
        try:
            self.directory.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
            info = self.directory.stat()
        except OSError as exc:
            raise SharedBusError(f"cannot make {self.directory}: {exc.strerror}") from exc
        if info.st_uid != os.getuid():
            raise SharedBusError(f"{self.directory} belongs to uid {info.st_uid}: the account "
                                 "that hosts the shared bus must own its directory")
        self._lock()
        try:
            gid = self._gid(info)
        except SharedBusError:
            self.close()
            raise
        try:
            os.chown(self.directory, -1, gid)
            os.chmod(self.directory, DIR_MODE)
            write_atomically(self.directory / CONFIG,
                             bus_config(self.directory, host, self.group), mode=0o644)
        except PermissionError as exc:
            self.close()
            raise SharedBusError(f"cannot give {self.directory} to group {self.group}: "
                                 f"{exc.strerror} (the host account must be a member of "
                                 "it)") from exc
        except OSError as exc:
            self.close()
            raise SharedBusError(f"cannot set up {self.directory}: {exc.strerror}") from exc

    def _gid(self, info: os.stat_result) -> int:
        if self.group is None:
            self.group = grp.getgrgid(info.st_gid).gr_name
            return info.st_gid
        try:
            return grp.getgrnam(self.group).gr_gid
        except KeyError:
            raise SharedBusError(f"no group named {self.group!r}") from None

    def _lock(self) -> None:
        path = self.directory / LOCK
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "?"
            os.close(fd)
            raise SharedBusTaken(f"{self.directory} is already hosted by another resourced "
                                 f"(pid {holder})") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._lock_fd = fd

    async def start(self) -> str:
        """Start the bus; return its address once it listens."""
        try:
            self._proc = await asyncio.create_subprocess_exec(
                "dbus-daemon", f"--config-file={self.directory / CONFIG}", "--nofork",
                "--nopidfile", "--print-address=1", stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE, start_new_session=True,
                preexec_fn=_die_with_parent)
        except FileNotFoundError:
            raise SharedBusError("dbus-daemon is not installed (Debian: apt-get install "
                                 "dbus-daemon)") from None
        try:
            line = await asyncio.wait_for(self._proc.stdout.readline(), START_TIMEOUT)
        except TimeoutError:
            line = b""
        if not line.strip():
            await self.stop()
            raise SharedBusError(f"the bus in {self.directory} did not start (see the "
                                 "messages of dbus-daemon above)")
        return self.address

    @property
    def pid(self) -> int:
        return self._proc.pid if self._proc else 0

    async def stop(self) -> None:
        """Stop the bus (if it still runs) and wait for it."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        # os.kill, not terminate(): that reaps a dead child itself, before asyncio's
        # watcher does (which then warns that it lost the exit status).
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), 5)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
            await proc.wait()

    def close(self) -> None:
        """Let go of DIR's lock (the bus must be stopped first)."""
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1

