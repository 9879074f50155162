"""Claims: what a caller asks for (a demand), and what it holds or waits for."""

import functools
import sys
from dataclasses import dataclass, field

from resourced.errors import InvalidArgs, quoted

from .lifecycle import GRANTED

MODES = ("run", "dev")
"""run: bound to its processes, released when they are gone; dev: kept until released."""
BOOKING = "booking"
"""The mode of a booking's claim while the booking is active: no process of its own; it
ends with the booking."""
SLURM = "slurm"
"""The mode of a Slurm job's claim: made by the job's prolog on the GPUs Slurm gave it,
bound to the job's processes (found through its slurmstepd), ended by its epilog or when
they are gone."""
BOOKING_PRIORITY = 2**31 - 1
"""A booking at its start outranks every waiter (callers' priorities stay below it)."""



@dataclass(frozen=True, slots=True)
class ProcessRef:
    """A process as the kernel knows it: a pid is reused, (pid, start time) is not."""

    pid: int
    start_time: int  # clock ticks after boot, field 22 of /proc/<pid>/stat


@dataclass(frozen=True, slots=True)
class Demand:
    """Amounts asked for together, all or nothing.

    ``gpus`` whole GPUs (exclusive); ``vram`` bytes on one GPU shared with other such
    jobs; ``pools`` amounts of host or named pools, as sorted (name, amount) pairs.
    """

    gpus: int = 0
    vram: int = 0
    pools: tuple[tuple[str, int], ...] = ()

    def __post_init__(self):
        if self.gpus < 0 or self.vram < 0 or any(a <= 0 for _, a in self.pools):
            raise InvalidArgs("amounts must be positive")
        if not (self.gpus or self.vram or self.pools):
            raise InvalidArgs("nothing requested: ask for GPUs, VRAM or a pool amount")
        if self.gpus and self.vram:
            raise InvalidArgs("ask for whole GPUs or for VRAM on a shared GPU, not both")

    @property
    def wants_gpu(self) -> bool:
        """Whether it asks for a GPU: whole ones, or a share of one."""
        return bool(self.gpus or self.vram)

    @property
    def gpu_count(self) -> int:
        """The GPUs it counts against a limit: whole ones, or one for a VRAM share."""
        return self.gpus or (1 if self.vram else 0)

    @classmethod
    def of(cls, gpus: int = 0, vram: int = 0, pools: dict[str, int] | None = None) -> "Demand":
        return _demand(cls, gpus, vram, tuple(sorted((pools or {}).items())))


def check_named(demand: Demand, named: tuple[str, ...], excluded: tuple[str, ...],
                verb: str) -> None:
    """The GPUs a claim or a booking names (and excludes) agree with what it asks: each
    named once, none both wanted and excluded, one named GPU for each whole GPU or the one
    GPU of a VRAM share (``verb``: "claimed" or "booked", for the message)."""
    if len(set(named)) != len(named):
        raise InvalidArgs("a GPU is named twice")
    if set(named) & set(excluded):
        raise InvalidArgs("a GPU cannot be both wanted and excluded")
    share = demand.gpus == 0 and demand.vram > 0
    if named and (len(named) != 1 if share else demand.gpus != len(named)):
        raise InvalidArgs(f"named GPUs are {verb} whole, one each (or one named GPU holds a "
                          "share: --gpu 1 --vram 24G)")


@functools.lru_cache(maxsize=1024)
def _demand(cls, gpus: int, vram: int, pools: tuple) -> Demand:
    """One ``Demand`` for the same amounts (it is frozen): 10,000 claims of one shape
    kept 10,000 equal copies of it and of its pools' tuples, 2 MB."""
    return cls(gpus, vram, pools)


@dataclass(frozen=True)
class ClaimOptions:
    """What a ``Claim`` call asks for: the demand, and its options by their keys in
    ``protocol.records.CLAIM`` (times in microseconds), as the engine takes them before it
    pins the processes and names the session (``ClaimRequest``)."""

    demand: Demand
    mode: str = "run"
    owner_pid: int | None = None  # None: the caller's process
    member_pids: tuple[int, ...] = ()
    label: str = ""
    task_name: str = ""
    priority: int = 0
    wait: bool = False  # queue it when it cannot be granted now
    queue_timeout_usec: int | None = None  # leave the queue after this long; None: never
    reclaimable: bool = False
    duration_usec: int | None = None  # end this long after it was asked for; None: no end
    session: str | None = None  # None: the owner's Unix session
    dry_run: bool = False
    isolate: bool | None = None  # None: as the configuration says
    on: tuple[str, ...] = ()  # the GPUs it may be placed on (() : any)


@dataclass(frozen=True)
class ClaimRequest:
    """What a caller asks for. Validated on construction, so the ledger sees only sane input."""

    demand: Demand
    mode: str
    owner: ProcessRef
    uid: int
    user: str = ""
    label: str = ""
    task_name: str = ""
    members: frozenset[ProcessRef] = frozenset()
    priority: int = 0
    reclaimable: bool = False
    queue_deadline_usec: int = 0  # when waiting, leave the queue then; 0 = never
    end_usec: int = 0  # when granted, end then; 0 = no end
    session: str = ""  # the agent session it belongs to (see check_session)
    reply_to: str = ""  # who is told a queued claim's outcome (a bus name; "" = everyone)
    reply_serial: int = 0  # the serial of reply_to's call that made it (0: unknown)
    isolated: bool = False  # its processes are confined to its GPUs (systemd scope)
    on: tuple[str, ...] = ()  # the GPUs it may be placed on (named, or all but excluded)

    def __post_init__(self):
        if self.mode not in MODES:
            raise InvalidArgs(f"mode must be one of {', '.join(MODES)}, not {quoted(self.mode)}")
        for name, text in (("label", self.label), ("task name", self.task_name)):
            check_text(name, text)


MAX_TEXT = 256
"""The longest label or task name: a line of a status table, not a document."""


MAX_SESSION = 64
SESSION_CHARACTERS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._@+-")


def default_session(sid: int) -> str:
    """The session of a request that names none: its process's Unix session (``ps -o
    sid``): everything started from one terminal, one agent or one service."""
    return sys.intern(f"sid:{sid}")  # one string per session, not one per claim


def check_session(name: str) -> None:
    """A session a caller names: 1 to MAX_SESSION letters, digits and ``._@+-``, or a
    default one (``sid:N``)."""
    default = name.startswith("sid:") and name[4:].isdigit() and name[4:].isascii()
    if not 0 < len(name) <= MAX_SESSION or not (default or set(name) <= SESSION_CHARACTERS):
        raise InvalidArgs(f"session {quoted(name)} must be 1 to {MAX_SESSION} letters, digits "
                          "or . _ @ + -")


def check_text(name: str, text: str) -> None:
    """A label or task name is one short line: at most MAX_TEXT characters, no control
    characters (they would break the tables and logs that show it)."""
    if len(text) > MAX_TEXT:
        raise InvalidArgs(f"{name} is {len(text)} characters long, at most {MAX_TEXT} may be")
    if any(ord(c) < 0x20 or ord(c) == 0x7f for c in text):
        raise InvalidArgs(f"{name} must not contain control characters (newlines, tabs)")


@dataclass(slots=True)
class Claim:
    """A claim, queued or granted. Once granted, only the liveness fields, ``members`` and
    the reclaim request change.

    ``gpus`` are the GPUs it uses: whole ones, or the one GPU its ``vram`` share is on.
    ``until_usec`` is when a granted claim must give back what it holds: its own end, or
    the start of the booking that needs it next (``until_booking``).
    ``members`` are the owner's descendants seen while they lived; they stay the claim's
    even after being re-parented to init, until they exit.  ``reclaim_for`` names the
    waiter a reclaimable claim has been asked to make room for ("" when not asked).
    """

    id: str
    mode: str
    demand: Demand
    owner: ProcessRef
    uid: int
    user: str
    label: str
    task_name: str
    created_usec: int
    priority: int = 0
    reclaimable: bool = False
    state: str = GRANTED
    seq: int = 0  # arrival order, for FIFO among equal priorities
    gpus: tuple[str, ...] = ()  # UUIDs, once granted
    owner_alive: bool = True
    owner_died_usec: int = 0  # when the owner's exit was noticed; 0 while it lives
    members: frozenset[ProcessRef] = field(default_factory=frozenset)
    reclaim_for: str = ""
    queue_deadline_usec: int = 0  # a queued claim leaves the queue then; 0 = never
    end_usec: int = 0             # the end it asked for; 0 = none
    on: tuple[str, ...] = ()      # the GPUs it must be placed on; () = any
    until_usec: int = 0           # once granted: held until then (its end, or a booking's
    until_booking: str = ""       # start: that booking's id); 0 = no end
    overdue: bool = False         # past until_usec: a booking may ask it back
    session: str = ""             # the agent session it belongs to
    job: str = ""                 # the Slurm job id of a claim in mode slurm
    reply_to: str = ""            # who is told a queued claim's outcome ("" = everyone)
    reply_serial: int = 0         # the serial of reply_to's call that made it (0: unknown)
    isolated: bool = False        # its processes run confined to its GPUs (a systemd scope)

    @property
    def shared(self) -> bool:
        return self.demand.vram > 0

    def processes(self) -> frozenset[ProcessRef]:
        """The processes known to be the claim's: the owner (while alive) and the members."""
        return self.members | {self.owner} if self.owner_alive else self.members
