"""systemd integration without libsystemd: sd_notify, the watchdog, and journal logging.

The notify protocol is a datagram of ``KEY=VALUE`` lines sent to ``$NOTIFY_SOCKET`` (a
leading ``@`` names an abstract socket).  The watchdog pings from the event loop itself,
so a stalled loop really does stop the pings.  Logging goes to stderr, with ``<N>``
priority prefixes when stderr is the journal (``$JOURNAL_STREAM`` matches it); audit
events additionally go to the journal's native socket with structured fields, so
``journalctl RESOURCED_CLAIM=c1x2y3z`` finds them.
"""

import asyncio
import logging
import os
import socket
import sys
import time

JOURNAL_SOCKET = "/run/systemd/journal/socket"
AUDIT_MESSAGE_ID = "3f5b3c2e9a0d4e61b1a7c4d2e8f90a17"  # MESSAGE_ID of every resourced audit event

log = logging.getLogger("resourced")
audit_log = logging.getLogger("resourced.audit")


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
    try:
        return int(usec) / 2e6
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


def _priority(record: logging.LogRecord) -> int:
    return getattr(record, "priority", None) or PRIORITIES.get(record.levelno, 6)


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


class StderrFormatter(logging.Formatter):
    """``<N>message`` for journald (which adds time and name), else ``resourced: message``."""

    def __init__(self, journal: bool):
        super().__init__()
        self.journal = journal

    def format(self, record: logging.LogRecord) -> str:
        text = one_line(record.getMessage())
        fields = getattr(record, "fields", None)
        if fields and not self.journal:
            text += " " + " ".join(f"{k.lower()}={one_line(str(v))}" for k, v in fields.items())
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        if self.journal:
            return "\n".join(f"<{_priority(record)}>{line}" for line in text.splitlines())
        return f"resourced: {text}"


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


class JournalHandler(logging.Handler):
    """Sends records to journald's native socket with their structured fields."""

    def __init__(self, path: str):
        super().__init__()
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)

    def emit(self, record: logging.LogRecord) -> None:
        fields = {
            "MESSAGE": record.getMessage(),
            "PRIORITY": str(_priority(record)),
            "SYSLOG_IDENTIFIER": "resourced",
            "MESSAGE_ID": AUDIT_MESSAGE_ID,
            **{k: str(v) for k, v in getattr(record, "fields", {}).items()},
        }
        try:
            self.sock.sendto(encode_journal_fields(fields), self.path)
        except OSError:
            self.handleError(record)

    def close(self) -> None:
        self.sock.close()
        super().close()


def setup_logging() -> None:
    """stderr for everything; audit events also natively to the journal when there is one.

    ``RESOURCED_JOURNAL_SOCKET`` names another native socket (tests bind their own).
    """
    journal = stderr_is_journal()
    # No record carries the pid, thread or process name: nothing here prints them (the
    # journal knows the pid), and finding them cost a system call per line.
    logging.logProcesses = logging.logThreads = logging.logMultiprocessing = False
    stderr = logging.StreamHandler(sys.stderr)
    stderr.setFormatter(StderrFormatter(journal))
    root = logging.getLogger("resourced")
    root.handlers[:] = [stderr]
    root.setLevel(logging.INFO)
    root.propagate = False
    native = os.environ.get("RESOURCED_JOURNAL_SOCKET") or (JOURNAL_SOCKET if journal else "")
    audit_log.handlers[:] = []
    audit_log.propagate = True
    if native:
        audit_log.addHandler(JournalHandler(native))
        # The native record already carries the message; don't log it to the journal twice.
        audit_log.propagate = not journal


def audit(message: str, priority: int = 5, **fields) -> None:
    """An audit event: a log line with structured RESOURCED_* fields (priority 5 = notice).

    The record is made directly, without ``Logger.info``'s look up the stack for the
    caller's file and line, which no handler here prints (two audit lines per claim and
    release: that look was a third of their cost)."""
    if not audit_log.isEnabledFor(logging.INFO):
        return
    audit_log.handle(audit_log.makeRecord(
        audit_log.name, logging.INFO, "(audit)", 0, message, None, None,
        extra={"priority": priority, "fields": {f"RESOURCED_{k.upper()}": v for k, v in fields.items()}}))
