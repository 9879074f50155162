"""Claims: who holds which GPUs, and the request that asks for them."""

from dataclasses import dataclass, field

from ..errors import InvalidRequest

MODES = ("run", "dev")
"""run: a one-off command, released when its processes are gone; dev: kept until released."""


@dataclass(frozen=True)
class ProcessRef:
    """A process as the kernel knows it: a pid is reused, (pid, start time) is not."""

    pid: int
    start_time: int  # clock ticks after boot, field 22 of /proc/<pid>/stat


@dataclass(frozen=True)
class ClaimRequest:
    """What a caller asks for. Validated on construction, so the ledger sees only sane input."""

    gpus: int
    mode: str
    owner: ProcessRef
    uid: int
    user: str = ""
    label: str = ""
    task_name: str = ""

    def __post_init__(self):
        if self.mode not in MODES:
            raise InvalidRequest(f"mode must be one of {', '.join(MODES)}, not {self.mode!r}")
        if self.gpus < 1:
            raise InvalidRequest(f"at least 1 GPU must be requested, not {self.gpus}")


@dataclass
class Claim:
    """A granted claim. Everything but ``owner_alive`` is fixed once granted."""

    id: str
    mode: str
    gpus: tuple[str, ...]  # UUIDs
    owner: ProcessRef
    uid: int
    user: str
    label: str
    task_name: str
    created_usec: int
    owner_alive: bool = field(default=True)
