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
    members: frozenset[ProcessRef] = frozenset()

    def __post_init__(self):
        if self.mode not in MODES:
            raise InvalidRequest(f"mode must be one of {', '.join(MODES)}, not {self.mode!r}")
        if self.gpus < 1:
            raise InvalidRequest(f"at least 1 GPU must be requested, not {self.gpus}")


@dataclass
class Claim:
    """A granted claim. Only the liveness fields and ``members`` change once granted.

    ``members`` are the owner's descendants seen while they lived; they stay the claim's
    even after being re-parented to init, until they exit.
    """

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
    owner_died_usec: int = 0  # when the owner's exit was noticed; 0 while it lives
    members: frozenset[ProcessRef] = field(default_factory=frozenset)

    def processes(self) -> frozenset[ProcessRef]:
        """The processes known to be the claim's: the owner (while alive) and the members."""
        return self.members | {self.owner} if self.owner_alive else self.members
