"""Host measurements for the health checks: free RAM and free disk space.

These calls block (``statvfs`` on a dead network mount can hang for minutes), so callers
run them off the event loop with a deadline (``daemon/health_monitor.py``).  Each returns a
``Measurement`` or raises ``OSError`` / ``ValueError`` with a message fit for the user;
nothing is guessed: a missing path is an error, not an empty disk.
"""

import os

from resourced.core.health import CheckEntry, Measurement

__all__ = ["measure", "measure_disk", "measure_ram"]

MEMINFO = "/proc/meminfo"


def measure_ram(meminfo_path: str = MEMINFO) -> Measurement:
    """MemAvailable (the kernel's estimate of what can be had without swapping) of MemTotal."""
    with open(meminfo_path, encoding="ascii", errors="replace") as f:
        text = f.read()
    fields: dict[str, int] = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if key in ("MemTotal", "MemAvailable") and parts:
            try:
                value = int(parts[0])
            except ValueError:
                raise ValueError(
                    f"{meminfo_path}: {key} is not a number: {rest.strip()!r}") from None
            unit = parts[1] if len(parts) > 1 else ""
            if unit not in ("kB", ""):
                raise ValueError(f"{meminfo_path}: {key} has an unknown unit {unit!r}")
            fields[key] = value * 1024 if unit == "kB" else value
    for key in ("MemTotal", "MemAvailable"):
        if key not in fields:
            raise ValueError(f"{meminfo_path} has no {key} line")
    return Measurement(fields["MemAvailable"], fields["MemTotal"])


def measure_disk(path: str) -> Measurement:
    """Space free to unprivileged users (f_bavail) of the filesystem holding ``path``."""
    st = os.statvfs(path)  # FileNotFoundError for a missing path: an ERROR, not a guess
    total = st.f_blocks * st.f_frsize
    if total <= 0:
        raise ValueError(f"{path}: the filesystem reports no size (a pseudo filesystem?)")
    return Measurement(st.f_bavail * st.f_frsize, total)


def measure(check: CheckEntry) -> Measurement:
    """Measure one configured check."""
    if check.type == "ram":
        return measure_ram()
    if check.type == "disk":
        if not check.path:
            raise ValueError(f"check {check.name!r}: no path to measure")
        return measure_disk(check.path)
    raise ValueError(f"check {check.name!r}: unknown type {check.type!r}")


def host_pools(configured) -> tuple:
    """The pools: ``cpu`` (cores) and ``ram`` (bytes) sized from this machine, then the
    config's ``[[pool]]`` entries (one named cpu or ram sets that pool's capacity)."""
    from resourced.core.pools import HOST_POOLS, Pool

    pools = {
        "cpu": Pool("cpu", os.cpu_count() or 1, HOST_POOLS["cpu"]),
        "ram": Pool("ram", measure_ram().total_bytes, HOST_POOLS["ram"]),
    }
    for entry in configured:
        unit = HOST_POOLS.get(entry.name, entry.unit)
        pools[entry.name] = Pool(entry.name, entry.capacity, unit)
    return tuple(pools.values())
