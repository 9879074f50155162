"""The daemon's metrics: what ``Metrics`` answers and ``[metrics] textfile`` holds.

Read from the same engine and health monitor that ``Describe`` reads, so the figures
agree with ``gpuctl status --json``: ``resourced_gpus_free`` is ``gpuctl free``.  GPU-hours
per user come from the usage history (windows of a day and a week), read again at most
once a ``sample_interval`` for the file; the bus call reads it fresh.

The file is for node_exporter's textfile collector (no HTTP port of our own): written
whole and renamed into place (mode 0644: the collector runs as another account), a
quarter of a second after a change (the changes of a burst make one write), and at
every health sample, so at least every ``sample_interval``.
"""

import asyncio
import contextlib
import errno
import logging
import os
import time
from collections import Counter
from pathlib import Path

from resourced import __version__
from resourced.core.exposition import COUNTER, GAUGE, Family, render
from resourced.core.health import LEVELS
from resourced.core.lifecycle import ACTIVE, GRANTED, SCHEDULED
from resourced.linux.atomic_file import write_atomically
from resourced.protocol.time import seconds_of_usec, usec_of_seconds

from .bus.errors import ANSWERED

log = logging.getLogger("resourced")

GPU_STATES = ("free", "claimed", "shared", "busy", "slurm")
WINDOWS = {"24h": 86400, "7d": 7 * 86400}
"""The usage windows of the GPU-hours gauges: label -> seconds back from now."""
WRITE_DELAY = 0.25
"""Seconds from a change to the file's write: a burst of changes makes one write."""


class Metrics:
    def __init__(self, engine, health, mode: str, starts: int, refresh: float):
        self.engine = engine
        self.health = health
        self.mode = mode
        self.starts = starts
        self.started = time.time()
        self.refresh = refresh  # seconds the usage read for the file is kept
        self._usage: tuple[float, dict] = (float("-inf"), {})

    def text(self, fresh: bool = True) -> str:
        """The exposition text; ``fresh=False`` may reuse a usage read of late."""
        return render(self.families(fresh))

    def families(self, fresh: bool = True) -> list[Family]:
        return [*self._daemon(), *self._gpus(), *self._claims(), *self._queue(),
                *self._bookings(), *self._pools(), *self._health(), *self._usage_hours(fresh),
                *self._requests()]

    def _daemon(self) -> list[Family]:
        return [
            Family("resourced_info", GAUGE, "The daemon: version, bus and GPU backend.").add(
                1, version=__version__, mode=self.mode, backend=self.engine.backend.name),
            Family("resourced_daemon_starts_total", COUNTER,
                   "Starts of the daemon on this state directory.").add(self.starts),
            Family("resourced_daemon_start_time_seconds", GAUGE,
                   "When this daemon started (Unix time).").add(self.started),
            Family("resourced_daemon_resident_memory_bytes", GAUGE,
                   "The daemon's resident memory.").add(_rss()),
        ]

    def _gpus(self) -> list[Family]:
        engine = self.engine
        states = Counter(engine.tracker.gpu_state(g) for g in engine.ledger.gpus.values())
        by_state = Family("resourced_gpus", GAUGE, "GPUs by state: free, claimed (held "
                          "whole), shared (VRAM shares on it), busy (processes nobody "
                          "claimed run on it), slurm (Slurm's to schedule).")
        for state in (*GPU_STATES, *sorted(states.keys() - set(GPU_STATES))):
            by_state.add(states[state], state=state)
        free = Family("resourced_gpus_free", GAUGE, "GPUs free now, as gpuctl free says.")
        return [by_state, free.add(engine.tracker.free_count())]

    def _claims(self) -> list[Family]:
        claims, gpus, vram = Counter(), Counter(), Counter()
        for c in self.engine.ledger.claims.values():
            key = (_user(c.user, c.uid), c.mode)
            claims[key + (c.state,)] += 1
            if c.state == GRANTED and c.shared:
                vram[key] += c.demand.vram
            elif c.state == GRANTED:
                gpus[key] += len(c.gpus)
        count = Family("resourced_claims", GAUGE, "Claims by user, mode and state.")
        for (user, mode, state), n in sorted(claims.items()):
            count.add(n, user=user, mode=mode, state=state)
        held = Family("resourced_claimed_gpus", GAUGE, "GPUs held whole, by user and mode.")
        for (user, mode), n in sorted(gpus.items()):
            held.add(n, user=user, mode=mode)
        shares = Family("resourced_claimed_vram_bytes", GAUGE,
                        "VRAM held in shares of a GPU, by user and mode.")
        for (user, mode), n in sorted(vram.items()):
            shares.add(n, user=user, mode=mode)
        return [count, held, shares]

    def _queue(self) -> list[Family]:
        queue = list(self.engine.ledger.waiting)
        now = self.engine.clock()
        oldest = max((seconds_of_usec(now - c.created_usec) for c in queue), default=0.0)
        return [Family("resourced_queue_length", GAUGE, "Claims waiting.").add(len(queue)),
                Family("resourced_queue_oldest_wait_seconds", GAUGE,
                       "How long the longest waiter has waited (0: nobody waits).").add(
                           max(oldest, 0.0))]

    def _bookings(self) -> list[Family]:
        states = Counter(b.state for b in self.engine.calendar.bookings.values())
        family = Family("resourced_bookings", GAUGE,
                        "Bookings ahead (scheduled) and running (active).")
        for state in (SCHEDULED, ACTIVE):
            family.add(states[state], state=state)
        return [family]

    def _pools(self) -> list[Family]:
        ledger = self.engine.ledger
        capacity = Family("resourced_pool_capacity", GAUGE, "A host pool's capacity.")
        free = Family("resourced_pool_free", GAUGE, "What is left of a host pool.")
        for p in ledger.pools.values():
            capacity.add(p.capacity, pool=p.name, unit=p.unit)
            free.add(ledger.pool_free(p.name), pool=p.name, unit=p.unit)
        return [capacity, free]

    def _health(self) -> list[Family]:
        level = Family("resourced_health_level", GAUGE,
                       "1 for each check's level (OK, WARN, STOP), 0 for the others.")
        free = Family("resourced_health_free_bytes", GAUGE, "What a check measured free.")
        for s in self.health.states():
            for name in LEVELS:
                level.add(int(s["level"] == name), check=s["name"], level=name)
            if s["free_bytes"] is not None:
                free.add(s["free_bytes"], check=s["name"], type=s["type"])
        overall = Family("resourced_health", GAUGE,
                         "1 for the machine's level (the worst check's), 0 for the others.")
        for name in LEVELS:
            overall.add(int(self.health.health == name), level=name)
        return [overall, level, free]

    def _usage_hours(self, fresh: bool) -> list[Family]:
        read_at, rows = self._usage
        if fresh or time.monotonic() - read_at >= self.refresh:
            now = self.engine.clock()
            rows = {window: self.engine.history.usage(now - usec_of_seconds(seconds), now)
                    for window, seconds in WINDOWS.items()}
            self._usage = (time.monotonic(), rows)
        held = Family("resourced_gpu_hours_held", GAUGE,
                      "GPU-hours held by a user within the window (claims and bookings).")
        used = Family("resourced_gpu_hours_used", GAUGE, "GPU-hours of those a process of "
                      "the holder was seen on the GPUs.")
        for window, found in rows.items():
            for row in sorted(found, key=lambda r: r["user"]):
                user = _user(row["user"], row["uid"])
                held.add(row["held_gpu_hours"], user=user, window=window)
                used.add(row["used_gpu_hours"], user=user, window=window)
        return [held, used]

    def _requests(self) -> list[Family]:
        calls = Family("resourced_requests_total", COUNTER, "Bus calls answered, by method.")
        errors = Family("resourced_request_errors_total", COUNTER,
                        "Bus calls answered with an error, by method and error.")
        answered = Counter()
        for (method, error), n in sorted(ANSWERED.items()):
            answered[method] += n
            if error:
                errors.add(n, method=method, error=error)
        for method, n in sorted(answered.items()):
            calls.add(n, method=method)
        return [calls, errors]


class Textfile:
    """Keeps ``path`` holding the metrics (``[metrics] textfile``; "" for none)."""

    def __init__(self, metrics: Metrics, path: str):
        self.metrics = metrics
        self.path = path
        self._pending: asyncio.TimerHandle | None = None
        self._failed = ""  # the last failure logged, said once until it changes

    def changed(self, *_) -> None:
        """Something changed: write within ``WRITE_DELAY``."""
        if self.path and self._pending is None:
            self._pending = asyncio.get_running_loop().call_later(WRITE_DELAY, self.write)

    def write(self, *_) -> None:
        """Write now (a health sample, the start, a reload)."""
        if self._pending is not None:
            self._pending.cancel()
            self._pending = None
        if not self.path:
            return
        try:
            write_atomically(Path(self.path), self.metrics.text(fresh=False), mode=0o644)
        except OSError as exc:
            why = f"cannot write the metrics to {self.path}: {exc.strerror or exc}"
            if exc.errno in (errno.EROFS, errno.EACCES):
                why += (" (the system service writes only its own directories: allow this "
                        "one with ReadWritePaths= in a drop-in, systemctl edit resourced)")
            if why != self._failed:
                log.error("%s", why)
            self._failed = why
        else:
            self._failed = ""

    def move(self, path: str) -> None:
        """The configuration names another file (a reload): write there from now on."""
        if path != self.path:
            self.path = path
            self.write()

    def close(self) -> None:
        if self._pending is not None:
            self._pending.cancel()
            self._pending = None


def _user(name: str, uid: int) -> str:
    return name or f"uid {uid}"


def _rss() -> int:
    with contextlib.suppress(OSError, ValueError, IndexError):
        with open("/proc/self/statm", encoding="ascii") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    return 0
