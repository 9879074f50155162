"""The records the daemon sends as ``a{sv}`` and the clients give as dicts, and the
options the methods take as ``a{sv}``: for each kind, every field's key on the bus, its
key in Python and JSON, and its D-Bus type.

One table per kind, read both ways: the daemon writes a record by it, a client reads one
by it; a client writes a method's options by it, the daemon reads them by it.  Fields are
added, never renamed or removed, within one ``JSON_SCHEMA``; a client keeps a field its
table does not know yet (from a newer daemon) under the bus's key.  Times are integer
microseconds (``...USec``, ``..._usec``).
"""

import functools
from typing import NamedTuple


class Field(NamedTuple):
    wire: str       # the a{sv} key: ``StartUSec``
    key: str        # the dict and JSON key: ``start_usec``
    signature: str  # its D-Bus type: ``t``


def fields(*rows: tuple[str, str, str]) -> tuple[Field, ...]:
    return tuple(Field(*row) for row in rows)


BOOKING = fields(
    ("Id", "id", "s"), ("UID", "uid", "u"), ("User", "user", "s"), ("State", "state", "s"),
    ("StartUSec", "start_usec", "t"), ("EndUSec", "end_usec", "t"),
    ("CreatedUSec", "created_usec", "t"), ("GPUUUIDs", "gpu_uuids", "as"),
    ("GPUIndices", "gpu_indices", "au"), ("GPUs", "gpus_requested", "u"),
    ("GPUAliases", "gpus", "as"),
    ("VRAMBytes", "vram_bytes", "t"), ("Shared", "shared", "b"),
    ("Exclusive", "exclusive", "b"), ("Pools", "pools", "a{st}"), ("Label", "label", "s"),
    ("TaskName", "task_name", "s"), ("OpID", "op_id", "s"), ("Ended", "ended", "s"),
    ("EndedBy", "ended_by", "i"), ("EndedUSec", "ended_usec", "t"),
    ("Reason", "reason", "s"), ("ClaimState", "claim_state", "s"),
    ("WaitingFor", "waiting_for", "as"), ("Session", "session", "s"), ("Job", "job", "s"),
    ("JobExit", "job_exit", "i"), ("JobDetail", "job_detail", "s"),
    ("Isolated", "isolated", "b"), ("Start", "start", "s"), ("End", "end", "s"),
)
BLACKOUT = fields(("Id", "id", "s"), ("StartUSec", "start_usec", "t"),
                  ("EndUSec", "end_usec", "t"), ("Reason", "reason", "s"))
NOTICE = fields(("Id", "id", "s"), ("Text", "text", "s"), ("CreatedUSec", "created_usec", "t"),
                ("UntilUSec", "until_usec", "t"), ("By", "by", "u"))
SLOT = fields(("StartUSec", "start_usec", "t"), ("EndUSec", "end_usec", "t"),
              ("GPUUUIDs", "gpu_uuids", "as"), ("GPUIndices", "gpu_indices", "au"))
PROCESS = fields(("Pid", "pid", "u"), ("UsedMemoryBytes", "used_memory_bytes", "t"),
                 ("UID", "uid", "i"), ("User", "user", "s"), ("Command", "command", "s"),
                 ("Claim", "claim", "s"), ("Ambiguous", "ambiguous", "s"),
                 ("Container", "container", "s"))
"""A process on a GPU, in a verify report."""
REPORT = fields(("UUID", "uuid", "s"), ("Alias", "alias", "s"), ("Index", "index", "i"),
                ("Status", "status", "s"), ("Claim", "claim", "s"),
                ("Isolated", "isolated", "b"), ("Detail", "detail", "s"),
                ("Processes", "processes", "aa{sv}"))
"""One GPU's verify report; its processes are PROCESS records."""
CLAIM = fields(
    ("Id", "id", "s"), ("Mode", "mode", "s"), ("State", "state", "s"), ("UID", "uid", "u"),
    ("User", "user", "s"), ("OwnerPID", "owner_pid", "u"), ("OwnerAlive", "owner_alive", "b"),
    ("OwnerStartTime", "owner_start_time", "t"), ("MemberPIDs", "member_pids", "au"),
    ("Label", "label", "s"), ("TaskName", "task_name", "s"), ("Session", "session", "s"),
    ("Priority", "priority", "i"), ("Reclaimable", "reclaimable", "b"),
    ("ReclaimRequested", "reclaim_requested", "b"), ("VRAMBytes", "vram_bytes", "t"),
    ("Pools", "pools", "a{st}"), ("GPUs", "gpus_requested", "u"),
    ("GPUUUIDs", "gpu_uuids", "as"), ("GPUAliases", "gpus", "as"),
    ("GPUIndices", "gpu_indices", "au"), ("PCIIndices", "pci_indices", "au"),
    ("Isolated", "isolated", "b"), ("CreatedUSec", "created_usec", "t"),
    ("UntilUSec", "until_usec", "t"), ("UntilBooking", "until_booking", "s"))
"""A claim: its object's properties (``org.resourced.Claim``) by their bus names, and
each claim of ``Describe`` (``gpuctl status --json``) by its JSON keys.  Some fields are
only on one side: OwnerStartTime and MemberPIDs only on the object, the counts and
indices (GPUs, GPUAliases, GPUIndices, PCIIndices) only in the JSON."""
CLAIM_OBJECT_ONLY = frozenset({"owner_start_time", "member_pids"})
CLAIM_JSON_ONLY = frozenset({"gpus_requested", "gpus", "gpu_indices", "pci_indices"})
GRANT = fields(("DryRun", "dry_run", "b"), ("State", "state", "s"), ("Mode", "mode", "s"),
               ("GPUUUIDs", "gpu_uuids", "as"), ("GPUIndices", "gpu_indices", "au"),
               ("PCIIndices", "pci_indices", "au"), ("GPUMemoryBytes", "gpu_memory_bytes", "at"),
               ("VRAMBytes", "vram_bytes", "t"), ("Pools", "pools", "a{st}"),
               ("Warnings", "warnings", "as"), ("UntilUSec", "until_usec", "t"),
               ("UntilBooking", "until_booking", "s"), ("Session", "session", "s"),
               ("Isolated", "isolated", "b"))
"""What ``Claim``, ``GetGrant`` and a queued claim's ``Granted`` answer (``DryRun`` only
on a claim that was not made)."""

# -- methods' options ------------------------------------------------------------------
SESSION_OPTION = fields(("Session", "session", "s"))
"""The agent session a claim or booking belongs to (``Book`` takes it beside BOOK_OPTIONS)."""
CLAIM_OPTIONS = fields(
    ("Mode", "mode", "s"), ("OwnerPID", "owner_pid", "u"), ("MemberPIDs", "member_pids", "au"),
    ("Label", "label", "s"), ("TaskName", "task_name", "s"), ("VRAMBytes", "vram_bytes", "t"),
    ("Pools", "pools", "a{st}"), ("Priority", "priority", "i"), ("Wait", "wait", "b"),
    ("QueueTimeoutUSec", "queue_timeout_usec", "t"), ("Reclaimable", "reclaimable", "b"),
    ("DurationUSec", "duration_usec", "t"), *SESSION_OPTION, ("DryRun", "dry_run", "b"),
    ("ReplyWhenGranted", "reply_when_granted", "b"), ("Isolate", "isolate", "b"),
    ("GPUNames", "gpu_names", "as"), ("Exclude", "exclude", "as"))
"""``Claim``'s options."""
BOOK_OPTIONS = fields(
    ("GPUs", "gpus", "u"), ("GPUNames", "gpu_names", "as"), ("Exclude", "exclude", "as"),
    ("VRAMBytes", "vram_bytes", "t"), ("Pools", "pools", "a{st}"),
    ("DurationUSec", "duration_usec", "t"), ("StartUSec", "start_usec", "t"),
    ("Earliest", "earliest", "b"), ("Exclusive", "exclusive", "b"), ("OpID", "op_id", "s"),
    ("Label", "label", "s"), ("TaskName", "task_name", "s"), ("DryRun", "dry_run", "b"),
    ("Isolate", "isolate", "b"))
"""``Book``, ``EditBooking`` and ``FindSlots`` options.  No ``StartUSec`` (or
``Earliest``): the earliest start that fits."""
CHANGE_OPTIONS = fields(("OpID", "op_id", "s"), ("DryRun", "dry_run", "b"))
"""``CancelBooking`` options: OpID makes it retry-safe too."""
END_OPTIONS = fields(("OpID", "op_id", "s"), ("ByUSec", "by_usec", "t"),
                     ("DryRun", "dry_run", "b"))
"""``SetBookingEnd`` options: ByUSec extends by that much past the end it has."""
LIST_OPTIONS = fields(("All", "all", "b"), ("SinceUSec", "since_usec", "t"),
                      ("UntilUSec", "until_usec", "t"), ("Offset", "offset", "u"),
                      ("Limit", "limit", "u"))
"""``ListBookings`` options."""
JOB_OPTIONS = fields(("UID", "uid", "u"), ("Name", "name", "s"))
"""``ClaimJob`` options."""
STOP_OPTIONS = fields(*SESSION_OPTION, ("UID", "uid", "u"), ("Reason", "reason", "s"),
                      ("DryRun", "dry_run", "b"))
"""``Stop`` options."""
USAGE_OPTIONS = fields(("SinceUSec", "since_usec", "t"), ("UntilUSec", "until_usec", "t"),
                       ("UID", "uid", "u"), ("ByGPU", "by_gpu", "b"))
"""``Usage`` options."""
OPTIONS = {"Claim": CLAIM_OPTIONS, "Book": BOOK_OPTIONS + SESSION_OPTION,
           "EditBooking": BOOK_OPTIONS, "FindSlots": BOOK_OPTIONS,
           "CancelBooking": CHANGE_OPTIONS, "SetBookingEnd": END_OPTIONS,
           "ListBookings": LIST_OPTIONS, "ClaimJob": JOB_OPTIONS, "Stop": STOP_OPTIONS,
           "Usage": USAGE_OPTIONS}
"""Each Manager method that takes ``a{sv}`` options: the table they are read by."""


@functools.cache
def keys_of(kind: tuple[Field, ...]) -> dict[str, str]:
    """Bus key -> dict key, for reading a record of ``kind``."""
    return {f.wire: f.key for f in kind}


def wire(kind: tuple[Field, ...], key: str) -> str:
    """The bus key of ``kind``'s field ``key``."""
    return next(f.wire for f in kind if f.key == key)


def options(kind: tuple[Field, ...], **values) -> dict:
    """A method's options of ``kind`` as jeepney writes an a{sv} (``{key: (signature,
    value)}``), from the values by dict key; None leaves a key out."""
    given = {f.key: f for f in kind}
    unknown = set(values) - set(given)
    if unknown:
        raise TypeError(f"not an option of this method: {', '.join(sorted(unknown))}")
    return {given[k].wire: (given[k].signature, v) for k, v in values.items() if v is not None}


def read(kind: tuple[Field, ...], data: dict) -> dict:
    """A record of ``kind`` as jeepney reads an a{sv} (``{key: (signature, value)}``), as
    a dict: its keys by the table (one it does not know kept as the bus has it), arrays as
    lists, dicts as dicts (an array of records stays a list of a{sv}: read each by its
    own kind)."""
    keys = keys_of(kind)
    return {keys.get(wire, wire): (dict(value) if signature.startswith("a{")
                                   else list(value) if signature.startswith("a") else value)
            for wire, (signature, value) in data.items()}
