"""Asking the GPU backend what runs where, without ever stalling the event loop.

Backend calls run in a thread of their own, with a deadline (``probe_timeout``).  A call
that overruns is reported as unknown; if it hangs for good, later probes do not queue
behind it (which would make every caller wait for a dead driver) but answer "unknown" at
once until the hung call returns.  Concurrent probes share one call.
"""

import asyncio
import time
from dataclasses import dataclass

from ..backends import Backend, BackendError, GpuProcess
from ..threads import DaemonThreads


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
        self._executor = DaemonThreads("gpu-probe")  # one call in flight at a time, see below
        self._inflight: asyncio.Future | None = None
        self._started = 0.0

    async def processes(self) -> GpuEvidence:
        if not self.backend.blocking:
            try:
                return GpuEvidence(self.backend.processes())
            except BackendError as exc:
                return GpuEvidence(None, str(exc))
        loop = asyncio.get_running_loop()
        if self._inflight is not None and self._inflight.done():
            self._inflight = None
        if self._inflight is None:
            self._started = time.monotonic()
            self._inflight = loop.run_in_executor(self._executor, self.backend.processes)
            # Whoever stopped waiting, the outcome is consumed here, never left unretrieved.
            self._inflight.add_done_callback(lambda f: f.cancelled() or f.exception())
        elif time.monotonic() - self._started > self.timeout:
            return GpuEvidence(None, f"the GPU driver has not answered for "
                                     f"{time.monotonic() - self._started:.0f} s")
        remaining = self.timeout - (time.monotonic() - self._started)
        try:
            result = await asyncio.wait_for(asyncio.shield(self._inflight), max(remaining, 0))
        except TimeoutError:
            return GpuEvidence(None, f"the GPU driver did not answer within {self.timeout:g} s")
        except BackendError as exc:
            return GpuEvidence(None, str(exc))
        return GpuEvidence(result)

