"""The blocking client: ``Client``, its ``Lease``, and ``SharedClient`` for threads.

The calls are ``calls.Calls``'; here is only how a step is done, over jeepney's blocking
I/O, which does not import asyncio, so scripts and ``gpuctl`` start fast.

    >>> from resourced import Client
    >>> with Client() as client:
    ...     claim = client.claim(mode="dev", gpus=1, task_name="tuning", owner_pid=os.getpid())
    ...     client.release(claim["allocation"]["ref"])

Leases, after reslock: a process-bound claim of GPUs, VRAM or pool amounts, released on
leaving the ``with`` block (or when the process dies)::

    with client.acquire(vram="4G", priority=5, label="whisper") as lease:
        run_whisper(lease.env)
    lease = client.try_acquire(ram="64G", cpu=8)       # None if it does not fit now
"""

import contextlib
import time

from jeepney.bus_messages import message_bus

from resourced.errors import DaemonUnreachable

from . import connecting, steps, wire
from .calls import Calls, Leased

__all__ = ["Client", "Lease", "SharedClient"]


class Lease(Leased):
    """A granted, process-bound claim; a context manager that releases it."""

    _blocking = True

    @property
    def reclaim_requested(self) -> bool:
        """Whether the daemon asks this lease back for a higher-priority waiter."""
        return self.client.reclaim_requested(self.ref)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()


class Client(Calls):
    """A blocking client. Use as a context manager, or call ``close()``."""

    _blocking = True
    _lease = Lease
    _conn = None

    def _run(self, call_steps):
        with _Doing(self) as doing:
            return steps.run(call_steps, doing.perform)

    def _iterate(self, call_steps):
        with _Doing(self) as doing:
            yield from steps.iterate(call_steps, doing.perform)

    def _connection(self):
        if self._conn is None:
            doing = _Doing(self)
            try:
                self.bus = steps.run(connecting.connect(self), doing.perform)
            except BaseException:
                self.close()
                raise
        return self._conn

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class _Doing:
    """How one call's steps are done on a blocking connection; what it listened for and
    asked the bus for ends with it."""

    def __init__(self, client: Client):
        self.client = client
        self.filters = []
        self.asked = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for handle in self.filters:
            handle.close()
        conn = self.client._conn
        for rule in self.asked if conn is not None else ():
            with contextlib.suppress(Exception):  # closing: the bus drops it with us anyway
                conn.send(message_bus.RemoveMatch(rule))

    def perform(self, step):
        client, kind = self.client, type(step)
        if kind is steps.Open:
            from jeepney.io.blocking import open_dbus_connection

            client._conn = open_dbus_connection(step.address)
            wire.install(client._conn)  # replies read in a third of jeepney's time
            return None
        if kind is steps.Shut:
            return client.close()
        if kind is steps.Raw:
            return client._conn.send_and_get_reply(step.message, timeout=client.timeout)
        if kind is steps.Sleep:
            return time.sleep(step.seconds)
        conn = client._connection()
        if kind is steps.Listen:
            self.filters.append(conn.filter(step.rule, bufsize=step.bufsize))
            return self.filters[-1].queue
        if kind is steps.Next:
            return conn.recv_until_filtered(step.handle, timeout=step.timeout)
        if kind is steps.Post:
            return conn.send(step.message, serial=step.serial)
        if kind is steps.Subscribe:
            self.perform(message_bus.AddMatch(step.rule))
            self.asked.append(step.rule)
            return None
        try:
            reply = conn.send_and_get_reply(step, timeout=client.timeout)
        except (OSError, TimeoutError) as exc:
            raise client._unreachable(client.bus, exc) from exc
        return client._answer(reply)


class SharedClient:
    """One blocking ``Client`` shared by threads, used one call at a time, and made anew
    at the next call after the daemon was lost (for long-lived programs: resourced-mcp,
    gpuctl top).  ``options`` go to ``Client``."""

    def __init__(self, bus: str | None = None, **options):
        import threading

        self.bus = bus
        self._options = options
        self._client: Client | None = None
        self._lock = threading.Lock()

    @property
    def bus_in_use(self) -> str | None:
        """The bus of the open connection (None while there is none)."""
        return self._client.bus if self._client is not None else None

    def call(self, fn):
        """``fn(client)`` under the lock, in the calling thread."""
        with self._lock:
            if self._client is None:
                self._client = Client(bus=self.bus, **self._options)
            try:
                return fn(self._client)
            except DaemonUnreachable:
                self._client.close()
                self._client = None
                raise

    def close(self) -> None:
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None
