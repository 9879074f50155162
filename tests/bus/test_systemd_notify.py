"""sd_notify and the journal, without systemd: the test binds the sockets systemd would."""

import os
import signal
import socket
import struct
import uuid

import pytest

from resourced.client.sync import Client

from ..conftest import eventually


class Listener:
    """An AF_UNIX datagram socket that records (sender pid, payload), like PID 1 does."""

    def __init__(self, abstract: bool):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.name = f"rdtest-{uuid.uuid4().hex}"
        self.address = "\0" + self.name if abstract else f"/tmp/{self.name}.sock"
        self.sock.bind(self.address)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        self.sock.settimeout(0.05)
        self.received: list[tuple[int, bytes]] = []
        self.env_value = "@" + self.name if abstract else self.address

    def drain(self) -> list[tuple[int, bytes]]:
        while True:
            try:
                data, anc, _, _ = self.sock.recvmsg(65536, socket.CMSG_SPACE(12))
            except (TimeoutError, BlockingIOError):
                return self.received
            pid = next((struct.unpack("3i", d)[0] for lvl, typ, d in anc
                        if lvl == socket.SOL_SOCKET and typ == socket.SCM_CREDENTIALS), 0)
            self.received.append((pid, data))

    def close(self):
        self.sock.close()
        if not self.address.startswith("\0"):
            os.unlink(self.address)


@pytest.fixture
def listener():
    sockets = []

    def make(abstract=True):
        sockets.append(Listener(abstract))
        return sockets[-1]

    yield make
    for s in sockets:
        s.close()


def _lines(received):
    return [line for _, data in received for line in data.decode().split("\n")]


def test_ready_status_watchdog_and_stopping_come_from_the_daemon(start_daemon, listener):
    notify = listener(abstract=True)
    d = start_daemon(env={"NOTIFY_SOCKET": notify.env_value, "WATCHDOG_USEC": "200000"},
                     wait=False)
    eventually(lambda: "READY=1" in _lines(notify.drain()), timeout=10)
    # READY means usable: the API answers at once.
    with Client() as c:
        c.ping()
        c.claim(mode="dev", gpus=1, owner_pid=d.proc.pid)
    eventually(lambda: _lines(notify.drain()).count("WATCHDOG=1") >= 3, timeout=5)
    eventually(lambda: "STATUS=4 GPU(s), 3 free, 1 claim(s)" in _lines(notify.drain()))
    d.proc.send_signal(signal.SIGTERM)
    assert d.proc.wait(10) == 0
    lines = _lines(notify.drain())
    assert lines[-1] == "STOPPING=1"
    ready = next(data.decode() for _, data in notify.received if b"READY=1" in data)
    assert "STATUS=4 GPU(s), 4 free, 0 claim(s)" in ready.split("\n")
    assert {pid for pid, _ in notify.received} == {d.proc.pid}


def test_a_path_notify_socket_works_too(start_daemon, listener):
    notify = listener(abstract=False)
    start_daemon(env={"NOTIFY_SOCKET": notify.env_value})
    eventually(lambda: "READY=1" in _lines(notify.drain()))


def test_no_watchdog_pings_when_not_asked_for(start_daemon, listener):
    notify = listener()
    d = start_daemon(env={"NOTIFY_SOCKET": notify.env_value})
    eventually(lambda: "READY=1" in _lines(notify.drain()))
    with Client() as c:  # a first ping would come with READY=1, before this claim's status
        c.claim(mode="dev", gpus=1, owner_pid=d.proc.pid)
    eventually(lambda: "STATUS=4 GPU(s), 3 free, 1 claim(s)" in _lines(notify.drain()))
    assert "WATCHDOG=1" not in _lines(notify.received)


def _journal_fields(data: bytes) -> dict[str, str]:
    fields, rest = {}, data
    while rest:
        line, sep, tail = rest.partition(b"\n")
        if b"=" in line:
            key, _, value = line.partition(b"=")
            fields[key.decode()] = value.decode()
            rest = tail
        else:  # KEY\n<64-bit length><value>\n
            size = int.from_bytes(tail[:8], "little")
            fields[line.decode()] = tail[8 : 8 + size].decode()
            rest = tail[8 + size + 1 :]
    return fields


def test_audit_events_reach_the_journal_with_structured_fields(start_daemon, listener):
    journal = listener(abstract=False)
    d = start_daemon(env={"RESOURCED_JOURNAL_SOCKET": journal.address})
    with Client() as c:
        ref = c.claim(mode="dev", gpus=2, owner_pid=d.proc.pid)["allocation"]["ref"]
        c.release(ref)
    events = eventually(lambda: [_journal_fields(data) for _, data in journal.drain()
                                 if f"RESOURCED_CLAIM={ref}".encode() in data][1:] and
                        [_journal_fields(data) for _, data in journal.received
                         if f"RESOURCED_CLAIM={ref}".encode() in data])
    granted, released = events
    assert granted["RESOURCED_EVENT"] == "granted"
    assert granted["PRIORITY"] == "5"
    assert granted["SYSLOG_IDENTIFIER"] == "resourced"
    assert granted["RESOURCED_UID"] == str(os.getuid())
    assert len(granted["RESOURCED_GPU"].split(",")) == 2
    assert released["RESOURCED_EVENT"] == "released"
    assert f"released {ref}" in released["MESSAGE"]
