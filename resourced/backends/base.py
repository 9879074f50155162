"""What every GPU backend answers. Calls block; the daemon runs them off its event loop."""

from dataclasses import dataclass
from typing import Protocol

from resourced.core.inventory import Gpu


class BackendError(Exception):
    """The backend could not answer (no driver, a lost GPU, a broken simulation file)."""


@dataclass(frozen=True)
class GpuProcess:
    """A compute process the driver reports on a GPU."""

    pid: int
    used_memory_bytes: int = 0


@dataclass(frozen=True)
class GpuLoad:
    """How busy a GPU is at one look: utilisation over the driver's last sample period
    (percent of time a kernel ran) and memory in use."""

    utilization_pct: int
    memory_used_bytes: int


class Backend(Protocol):
    name: str
    """``nvml``, ``simulated`` or ``none``."""
    blocking: bool
    """Whether answering may block (I/O, a driver); if not, it is asked on the event loop."""

    def inventory(self) -> list[Gpu]:
        """The GPUs present now."""

    def processes(self) -> dict[str, list[GpuProcess]]:
        """GPU UUID -> compute processes on it, for every GPU the driver answered for."""

    def load(self) -> dict[str, GpuLoad]:
        """GPU UUID -> its load now, for every GPU the driver answered for."""


class NoGpus:
    """The placeholder when neither NVML nor a simulation is available; says why."""

    name = "none"
    blocking = False

    def __init__(self, reason: str):
        self.reason = reason

    def inventory(self) -> list[Gpu]:
        return []

    def processes(self) -> dict[str, list[GpuProcess]]:
        return {}

    def load(self) -> dict[str, GpuLoad]:
        return {}
