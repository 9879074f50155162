"""Asking the GPU backend what runs where, without ever stalling the event loop.

Backend calls run in a thread of their own, with a deadline (``probe_timeout``).  A call
that overruns is reported as unknown; if it hangs for good, later probes do not queue
behind it (which would make every caller wait for a dead driver) but answer "unknown" at
once until the hung call returns.  Concurrent probes share one call.
"""

import asyncio
import time
from dataclasses import dataclass

from resourced.backends import Backend, BackendError, GpuProcess
from resourced.linux.threads import OneThread


@dataclass(frozen=True)
class GpuEvidence:
    """GPU UUID -> compute processes, or ``processes is None`` with the reason."""

    processes: dict[str, list[GpuProcess]] | None
    reason: str = ""

    @property
    def known(self) -> bool:
        return self.processes is not None


class GpuProbe:
    def __init__(self, backend: Backend, timeout: float):
        self.backend = backend
        self.timeout = timeout
        self._executor = OneThread("gpu-probe")  # one call in flight at a time, see below
        self._inflight: asyncio.Future | None = None
        self._started = 0.0

    def begin(self) -> asyncio.Future | None:
        """A look begun now (or the one in flight), for the caller's ``processes(begun)``:
        a claim begins it before checking the request, so the hop to the backend's thread
        overlaps that work.  None when the backend answers at once."""
        if not self.backend.blocking or self._now() is not None:
            return None
        if self._inflight is None or self._inflight.done():
            self._started = time.monotonic()
            self._inflight = self._look()
        return self._inflight

    def _now(self) -> dict | None:
        """A blocking backend's answer without blocking, where it has one for this look
        (the simulation's file, unchanged: ``processes_now``); None: look off the loop."""
        now = getattr(self.backend, "processes_now", None)
        return now() if now is not None else None

    def _look(self) -> asyncio.Future:
        look = asyncio.get_running_loop().run_in_executor(self._executor, self.backend.processes)
        # Whoever stopped waiting, the outcome is consumed here, never left unretrieved.
        look.add_done_callback(lambda f: f.cancelled() or f.exception())
        return look

    async def processes(self, begun: asyncio.Future | None = None) -> GpuEvidence:
        """What runs on each GPU: a look begun now (or joining the one in flight, or the
        caller's own from ``begin``, done or not)."""
        if not self.backend.blocking:
            try:
                return GpuEvidence(self.backend.processes())
            except BackendError as exc:
                return GpuEvidence(None, str(exc))
        if begun is None and (now := self._now()) is not None:
            return GpuEvidence(now)
        loop = asyncio.get_running_loop()
        if self._inflight is not None and self._inflight.done() and self._inflight is not begun:
            self._inflight = None
        if self._inflight is None:
            self._started = time.monotonic()
            self._inflight = self._look()
        elif not self._inflight.done() and time.monotonic() - self._started > self.timeout:
            return GpuEvidence(None, f"the GPU driver has not answered for "
                                     f"{time.monotonic() - self._started:.0f} s")
        inflight = self._inflight
        if not await _done_within(loop, inflight, self.timeout - (time.monotonic() - self._started)):
            return GpuEvidence(None, f"the GPU driver did not answer within {self.timeout:g} s")
        try:
            return GpuEvidence(inflight.result())
        except BackendError as exc:
            return GpuEvidence(None, str(exc))


async def _done_within(loop: asyncio.AbstractEventLoop, future: asyncio.Future,
                       seconds: float) -> bool:
    """Wait until ``future`` is done or ``seconds`` have passed (whether it is done); a
    waiter that gives up, or is cancelled, leaves ``future`` running (what
    ``wait_for(shield(future))`` does, with a third of its callbacks and futures: it is
    on every claim's path when the backend blocks)."""
    if not future.done():
        waiter = loop.create_future()

        def wake(_=None):
            if not waiter.done():
                waiter.set_result(None)

        future.add_done_callback(wake)
        timer = loop.call_later(max(seconds, 0), wake)
        try:
            await waiter
        finally:
            timer.cancel()
            future.remove_done_callback(wake)
    return future.done()

