"""Usage accounting: what was held and what was used, over a window of time.

A *hold* is one claim or booking over its life: its GPUs, its interval, and ``used_usec``,
the time the daemon saw a process of its owner on its GPUs (sampled each tracking sweep;
what it could not see is not counted as used).  GPU load (utilisation, memory) is kept as
sums per bucket of a minute, an hour and a day.

Pure: ``report`` takes rows and a window and adds them up; the store (SQLite, in the state
directory) and the daemon's sampling live at the edges.
"""

from dataclasses import dataclass

from resourced.protocol.time import HOUR, USEC

RESOLUTIONS = {"minute": 60, "hour": 3600, "day": 86400}
"""Load buckets, in seconds: every sample is added to one bucket of each."""


@dataclass(frozen=True)
class Hold:
    id: str
    kind: str            # claim | booking
    uid: int
    user: str
    gpus: tuple[str, ...]
    start_usec: int
    end_usec: int        # for a live hold: now
    used_usec: int


def bucket(usec: int, seconds: int) -> int:
    """The start (microseconds) of the bucket of ``seconds`` that ``usec`` falls in."""
    width = seconds * USEC
    return usec - usec % width


def report(holds: list[Hold], loads: list[tuple], since: int, until: int,
           by_gpu: bool = False, labels: dict[str, str] | None = None) -> list[dict]:
    """Per user (or per GPU): GPU-hours held, used and held-but-idle, within
    [``since``, ``until``); booked ones apart.  A hold partly in the window counts the part
    inside, and its used time in proportion.  ``loads`` are (gpu, samples, utilisation
    sum, memory sum) rows of the window, for the per-GPU means."""
    rows: dict = {}
    for h in holds:
        inside = min(h.end_usec, until) - max(h.start_usec, since)
        if inside <= 0 or not h.gpus:
            continue
        share = inside / max(h.end_usec - h.start_usec, 1)
        used = min(h.used_usec * share, inside)
        keys = [(g,) for g in h.gpus] if by_gpu else [(h.uid, h.user)]
        weight = 1 if by_gpu else len(h.gpus)
        for key in keys:
            row = rows.setdefault(key, _empty(key, by_gpu, labels or {}))
            row["held_gpu_hours"] += inside * weight / HOUR
            row["used_gpu_hours"] += used * weight / HOUR
            row["claims" if h.kind == "claim" else "bookings"] += 1
            if h.kind == "booking":
                row["booked_gpu_hours"] += inside * weight / HOUR
                row["booked_used_gpu_hours"] += used * weight / HOUR
    if by_gpu:
        for gpu, samples, utilization, memory in loads:
            row = rows.setdefault((gpu,), _empty((gpu,), True, labels or {}))
            row["samples"] += samples
            row["utilization_sum"] += utilization
            row["memory_sum"] += memory
    out = []
    for row in rows.values():
        row["idle_gpu_hours"] = row["held_gpu_hours"] - row["used_gpu_hours"]
        row["booked_idle_gpu_hours"] = row["booked_gpu_hours"] - row["booked_used_gpu_hours"]
        if by_gpu:
            samples = row.pop("samples")
            utilization, memory = row.pop("utilization_sum"), row.pop("memory_sum")
            row["mean_utilization_pct"] = round(utilization / samples, 1) if samples else None
            row["mean_memory_used_bytes"] = int(memory / samples) if samples else None
        for key, value in row.items():
            if key.endswith("_hours"):
                row[key] = round(value, 3)
        out.append(row)
    return sorted(out, key=lambda r: (r.get("gpu") or "", r.get("user") or ""))


def _empty(key: tuple, by_gpu: bool, labels: dict[str, str]) -> dict:
    head = ({"gpu": labels.get(key[0], key[0]), "uuid": key[0], "samples": 0,
             "utilization_sum": 0.0, "memory_sum": 0.0} if by_gpu
            else {"uid": key[0], "user": key[1]})
    return {**head, "claims": 0, "bookings": 0, "held_gpu_hours": 0.0, "used_gpu_hours": 0.0,
            "booked_gpu_hours": 0.0, "booked_used_gpu_hours": 0.0}
