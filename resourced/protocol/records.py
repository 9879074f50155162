"""The records the daemon sends as ``a{sv}`` and the clients give as dicts: for each kind,
every field's key on the bus, its key in Python and JSON, and its D-Bus type.

One table per kind, read both ways: the daemon writes a record by it, a client reads one
by it.  Fields are added, never renamed or removed, within one ``JSON_SCHEMA``; a client
keeps a field its table does not know yet (from a newer daemon) under the bus's key.
"""

import functools
import time
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


@functools.cache
def keys_of(kind: tuple[Field, ...]) -> dict[str, str]:
    """Bus key -> dict key, for reading a record of ``kind``."""
    return {f.wire: f.key for f in kind}


def iso_utc(usec: int) -> str:
    """ISO 8601 in UTC, to the second, as JSON records give ``start`` and ``end``
    (time.strftime: 10 times datetime's speed, which shows with thousands of records)."""
    return _iso_second(usec // 1_000_000)


@functools.lru_cache(maxsize=4096)
def _iso_second(second: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(second))


def read(kind: tuple[Field, ...], data: dict) -> dict:
    """A record of ``kind`` as jeepney reads an a{sv} (``{key: (signature, value)}``), as
    a dict: its keys by the table (one it does not know kept as the bus has it), arrays as
    lists, dicts as dicts (an array of records stays a list of a{sv}: read each by its
    own kind)."""
    keys = keys_of(kind)
    return {keys.get(wire, wire): (dict(value) if signature.startswith("a{")
                                   else list(value) if signature.startswith("a") else value)
            for wire, (signature, value) in data.items()}
