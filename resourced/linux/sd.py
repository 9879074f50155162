"""systemd integration without libsystemd: sd_notify, the watchdog, and journal logging.

The notify protocol is a datagram of ``KEY=VALUE`` lines sent to ``$NOTIFY_SOCKET`` (a
leading ``@`` names an abstract socket).  The watchdog pings from the event loop itself,
so a stalled loop really does stop the pings.  Logging goes to stderr, with ``<N>``
priority prefixes when stderr is the journal (``$JOURNAL_STREAM`` matches it); audit
events additionally go to the journal's native socket with structured fields, so
``journalctl RESOURCED_CLAIM=c1x2y3z`` finds them.
"""

import asyncio
import contextlib
import logging
import os
import socket
import sys
import time

from .nesting import Outermost

JOURNAL_SOCKET = "/run/systemd/journal/socket"
AUDIT_MESSAGE_ID = "3f5b3c2e9a0d4e61b1a7c4d2e8f90a17"  # MESSAGE_ID of every resourced audit event

log = logging.getLogger("resourced")


# -- sd_notify -------------------------------------------------------------------------
def _unix_address(value: str) -> str:
    return "\0" + value[1:] if value.startswith("@") else value


def notify(*assignments: str) -> bool:
    """Send ``KEY=VALUE`` lines to the service manager; False when there is none."""
    target = os.environ.get("NOTIFY_SOCKET")
    if not target:
        return False
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
        try:
            s.sendto("\n".join(assignments).encode(), _unix_address(target))
        except OSError as exc:
            log.warning("cannot notify the service manager at %s: %s", target, exc)
            return False
    return True


def watchdog_interval() -> float | None:
    """Seconds between watchdog pings (half the timeout), or None when not asked for."""
    usec = os.environ.get("WATCHDOG_USEC")
    pid = os.environ.get("WATCHDOG_PID")
    if not usec or (pid and pid != str(os.getpid())):
        return None
    from resourced.protocol.time import seconds_of_usec

    try:
        return seconds_of_usec(int(usec)) / 2
    except ValueError:
        return None


async def run_watchdog(interval: float) -> None:
    """Ping the watchdog from the event loop until cancelled."""
    while True:
        notify("WATCHDOG=1")
        await asyncio.sleep(interval)


def reloading() -> None:
    notify("RELOADING=1", f"MONOTONIC_USEC={time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000}")


# -- logging ---------------------------------------------------------------------------
PRIORITIES = {
    logging.DEBUG: 7,
    logging.INFO: 6,
    logging.WARNING: 4,
    logging.ERROR: 3,
    logging.CRITICAL: 2,
}


def stderr_is_journal() -> bool:
    stream = os.environ.get("JOURNAL_STREAM", "")
    try:
        dev, ino = (int(v) for v in stream.split(":"))
        st = os.fstat(sys.stderr.fileno())
    except (ValueError, OSError):
        return False
    return (st.st_dev, st.st_ino) == (dev, ino)


_CONTROL = {c: f"\\x{c:02x}" for c in [*range(0x20), 0x7f]}


def one_line(text: str) -> str:
    """``text`` with its control characters escaped: what a caller sent (a reason, a pool
    name) can never start a line of its own, or a journal entry with a priority of its
    choosing."""
    return text if text.isprintable() else text.translate(_CONTROL)


def stderr_text(message: str, priority: int, journal: bool, detail: str = "") -> str:
    """A line for stderr: ``<N>message`` for journald (which adds time and name), else
    ``resourced: message``.  The message is kept to one line (its control characters
    escaped); ``detail`` (a traceback) follows on lines of its own, each one an entry of
    its own in the journal."""
    text = one_line(message)
    if detail:
        text += "\n" + detail
    if journal:
        return "\n".join(f"<{priority}>{line}" for line in text.splitlines())
    return f"resourced: {text}"


class StderrFormatter(logging.Formatter):
    """Log records as ``stderr_text`` writes them, with any exception's traceback."""

    def __init__(self, journal: bool):
        super().__init__()
        self.journal = journal

    def format(self, record: logging.LogRecord) -> str:
        detail = self.formatException(record.exc_info) if record.exc_info else ""
        return stderr_text(record.getMessage(), PRIORITIES.get(record.levelno, 6),
                           self.journal, detail)


class StderrHandler(logging.StreamHandler):
    """stderr, where the lines written inside ``held()`` go out in one write at its end."""

    def __init__(self, journal: bool):
        super().__init__(sys.stderr)
        self.journal = journal
        self.setFormatter(StderrFormatter(journal))
        self._lines: list[str] | None = None
        self._held = Outermost(self._hold, self._flush)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.write(self.format(record))
        except Exception:  # noqa: BLE001 - as StreamHandler.emit does
            self.handleError(record)

    def write(self, text: str) -> None:
        """``text`` as a line of its own, now or at the end of ``held()``."""
        with self.lock:  # (worker threads log too)
            if self._lines is not None:
                self._lines.append(text + self.terminator)
            else:
                self._put(text + self.terminator)

    def held(self) -> Outermost:
        """A context: the lines written inside go out in one write at its end."""
        return self._held

    def _hold(self) -> None:
        self._lines = []

    def _flush(self) -> None:
        with self.lock:  # (a thread may be logging)
            lines, self._lines = self._lines, None
            if lines:
                self._put("".join(lines))

    def _put(self, text: str) -> None:
        with contextlib.suppress(OSError, ValueError):  # stderr gone: nothing to tell
            self.stream.write(text)
            self.stream.flush()


_stderr: StderrHandler | None = None  # set up by setup_logging
_journal: "JournalSocket | None" = None  # where audit events go natively, if anywhere
_audit_stderr: StderrHandler | None = None  # where they go as lines, if anywhere


def one_write():
    """A context: the stderr lines logged inside (the audit lines of a loop turn, say)
    are written together at its end, with one system call, not one each."""
    return _stderr.held() if _stderr is not None else contextlib.nullcontext()


def encode_journal_fields(fields: dict[str, str]) -> bytes:
    """The native journal protocol: ``KEY=value`` lines, or length-prefixed binary values."""
    out = bytearray()
    for key, value in fields.items():
        data = str(value).encode()
        if b"\n" in data:
            out += key.encode() + b"\n" + len(data).to_bytes(8, "little") + data + b"\n"
        else:
            out += key.encode() + b"=" + data + b"\n"
    return bytes(out)


class JournalSocket:
    """journald's native socket: an entry per datagram, with structured fields."""

    def __init__(self, path: str):
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)

    def send(self, message: str, priority: int, fields: dict) -> None:
        entry = {"MESSAGE": message, "PRIORITY": str(priority),
                 "SYSLOG_IDENTIFIER": "resourced", "MESSAGE_ID": AUDIT_MESSAGE_ID, **fields}
        try:
            self.sock.sendto(encode_journal_fields(entry), self.path)
        except OSError as exc:
            log.warning("cannot send an audit event to the journal at %s: %s", self.path, exc)


def setup_logging() -> None:
    """stderr for everything; audit events also natively to the journal when there is one.

    ``RESOURCED_JOURNAL_SOCKET`` names another native socket (tests bind their own).
    """
    journal = stderr_is_journal()
    # No record carries the pid, thread or process name: nothing here prints them (the
    # journal knows the pid), and finding them cost a system call per line.
    logging.logProcesses = logging.logThreads = logging.logMultiprocessing = False
    global _stderr, _journal, _audit_stderr
    stderr = _stderr = StderrHandler(journal)
    root = logging.getLogger("resourced")
    root.handlers[:] = [stderr]
    root.setLevel(logging.INFO)
    root.propagate = False
    native = os.environ.get("RESOURCED_JOURNAL_SOCKET") or (JOURNAL_SOCKET if journal else "")
    _journal = JournalSocket(native) if native else None
    # The native entry already carries the message; it is not logged to the journal twice.
    _audit_stderr = None if journal and native else stderr


def audit(message: str, priority: int = 5, **fields) -> None:
    """An audit event (priority 5 = notice), with structured ``RESOURCED_*`` fields: an
    entry on the journal's native socket where there is one, and a line on stderr unless
    stderr is the journal too.  Not a ``logging`` record: three of them per claim and
    release, and the logging machinery was three quarters of their cost."""
    if _journal is not None:
        _journal.send(message, priority,
                      {f"RESOURCED_{k.upper()}": str(v) for k, v in fields.items()})
    if _audit_stderr is not None:
        _audit_stderr.write(stderr_text(message, priority, True) if _audit_stderr.journal
                            else _audit_line(message, fields))


def _audit_line(message: str, fields: dict) -> str:
    """An audit event's line where stderr is not the journal: ``resourced: message
    resourced_key=value ...`` (the keys are keywords, lower case already), each value
    kept to one line."""
    return " ".join([f"resourced: {one_line(message)}",
                     *(f"resourced_{k}={v}" if type(v) is int else
                       f"resourced_{k}={one_line(str(v))}" for k, v in fields.items())])
