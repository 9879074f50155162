"""Quantity pools: host CPU cores and RAM, and any named pool the config defines."""

from dataclasses import dataclass

BYTES = "bytes"
COUNT = "count"

HOST_POOLS = {"cpu": COUNT, "ram": BYTES}
"""Pools every daemon has, sized from the machine unless the config sets them."""


@dataclass(frozen=True)
class Pool:
    name: str
    capacity: int
    unit: str = COUNT  # bytes | count


def format_amount(amount: int, unit: str) -> str:
    """``32G`` for bytes, ``8`` for counts."""
    if unit != BYTES:
        return str(amount)
    from resourced.protocol.amounts import format_bytes

    return format_bytes(amount)
