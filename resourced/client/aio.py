"""The asyncio client: ``AsyncClient`` and its ``AsyncLease``, the calls of ``Client``
(``calls.Calls``) awaited over one jeepney router.

    async with AsyncClient() as client:
        claim = await client.claim(mode="dev", gpus=1, owner_pid=os.getpid())
    async with AsyncClient().acquire(vram="4G") as lease: ...

A cancelled wait leaves the queue.
"""

import asyncio
import contextlib

from jeepney.bus_messages import message_bus

from . import connecting, steps, wire
from .calls import DEFAULT_TIMEOUT, Calls, Leased

__all__ = ["AsyncClient", "AsyncLease"]


class AsyncLease(Leased):
    """A granted, process-bound claim for asyncio; ``async with`` releases it."""

    _blocking = False

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.release()


class AsyncClient(Calls):
    """The asyncio client. Use as ``async with AsyncClient() as client:``."""

    _blocking = False
    _lease = AsyncLease
    _router = None
    _router_cm = None
    _opening = None  # an asyncio.Lock, made by the first call that connects
    _closing = False  # close() has begun: a call it cuts short is cancelled, not failed

    async def _run(self, call_steps):
        async with _Doing(self) as doing:
            return await steps.run_async(call_steps, doing.perform)

    async def _iterate(self, call_steps):
        doing = _Doing(self)
        async with doing, contextlib.aclosing(steps.iterate_async(call_steps,
                                                                  doing.perform)) as items:
            async for item in items:
                yield item

    @staticmethod
    def _entered(start):
        return _Entered(start)

    @classmethod
    def on(cls, router, bus: str, timeout: float = DEFAULT_TIMEOUT) -> "AsyncClient":
        """The calls on ``router``, a jeepney asyncio router on ``bus`` that its caller
        opened, listens on and closes (gpuctl notify's): it never connects, and ``close()``
        leaves the router alone.  A call the connection's end cuts short raises jeepney's
        ``RouterClosed``."""
        client = cls(bus, timeout)
        client._router, client.bus = router, bus
        return client

    async def _connection(self):
        if self._router is None:
            if self._opening is None:  # (calls that start together share one connection)
                self._opening = asyncio.Lock()
            async with self._opening:
                if self._router is None:
                    try:
                        self.bus = await steps.run_async(connecting.connect(self),
                                                         _Doing(self).perform)
                    except BaseException:
                        await self.close()
                        raise
        return self._router

    async def close(self) -> None:
        if self._router_cm is not None:
            self._closing = True
            try:
                await self._router_cm.__aexit__(None, None, None)
            finally:
                self._router = self._router_cm = None
                self._closing = False

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()


class _Doing:
    """How one call's steps are done on the client's router; what it listened for and
    asked the bus for ends with it."""

    def __init__(self, client: AsyncClient):
        self.client = client
        self.filters = []
        self.asked = []

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        for handle in self.filters:
            handle.close()
        router = self.client._router
        for rule in self.asked if router is not None else ():
            with contextlib.suppress(Exception):  # closing: the bus drops it with us anyway
                await router.send(message_bus.RemoveMatch(rule))

    async def perform(self, step):
        client, kind = self.client, type(step)
        if kind is steps.Open:
            from jeepney.io.asyncio import open_dbus_router

            cm = open_dbus_router(step.address)
            client._router = await cm.__aenter__()
            client._router_cm = cm
            wire.install(getattr(client._router, "_conn", None))
            return None
        if kind is steps.Shut:
            return await client.close()
        if kind is steps.Raw:
            return await self._reply(client._router, step.message)
        if kind is steps.Sleep:
            return await asyncio.sleep(step.seconds)
        router = await client._connection()
        if kind is steps.Listen:
            self.filters.append(router.filter(step.rule, bufsize=step.bufsize))
            return self.filters[-1].queue
        if kind is steps.Next:
            async with asyncio.timeout(step.timeout):
                return await step.handle.get()
        if kind is steps.Post:
            return await router.send(step.message, serial=step.serial)
        if kind is steps.Subscribe:
            await self.perform(message_bus.AddMatch(step.rule))
            self.asked.append(step.rule)
            return None
        try:
            reply = await self._reply(router, step)
        except (OSError, TimeoutError) as exc:
            raise client._unreachable(client.bus, exc) from exc
        return client._answer(reply)

    async def _reply(self, router, message):
        """``message``'s reply.  A call the client's own close() cuts short (a task still
        waiting when ``async with AsyncClient()`` ends) is cancelled, as its caller closed
        it: jeepney fails it with RouterClosed, then a KeyError from its bookkeeping, and
        a task nobody awaits any more logged that as a traceback."""
        from jeepney.io.common import RouterClosed

        try:
            async with asyncio.timeout(self.client.timeout):
                return await router.send_and_get_reply(message)
        except (RouterClosed, KeyError) as exc:
            if self.client._closing or self.client._router is None:
                raise asyncio.CancelledError("the client was closed") from exc
            raise


class _Entered:
    """What ``acquire`` answers: awaitable (the lease), and an ``async with`` that
    releases it on leaving."""

    def __init__(self, start):
        self._start = start
        self._lease = None

    def __await__(self):
        return self._start().__await__()

    async def __aenter__(self):
        self._lease = await self._start()
        return self._lease

    async def __aexit__(self, *exc):
        await self._lease.__aexit__(*exc)
