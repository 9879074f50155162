"""The usage history: ``usage.sqlite`` in the state directory (which the calendar's store
holds locked for the daemon's life).

Three tables: ``holds`` (one row per ended claim or booking: who, which GPUs, when, and
the time a process of its owner was seen on them), ``load`` (per GPU, the sums of
utilisation and memory samples in buckets of a minute, an hour and a day) and ``starts``
(one row per start of the daemon, for its metrics' restarts).  Old rows go
by the retention settings, so the file stays bounded: minutes go first, then hours;
holds and days last.  WAL with synchronous=NORMAL: a commit does not wait for the disk
(a crash may lose the last few samples, never the file).  The engine writes the holds
that ended within a second together (``record_holds``), so a crash of the daemon may
lose that second's too.
"""

import sqlite3
from pathlib import Path

from resourced.backends import GpuLoad
from resourced.core.usage import RESOLUTIONS, Hold, bucket
from resourced.protocol.time import USEC, usec_of_seconds

FILE_NAME = "usage.sqlite"
SCHEMA = """
CREATE TABLE IF NOT EXISTS holds (
    id TEXT PRIMARY KEY, kind TEXT NOT NULL, uid INTEGER NOT NULL, user TEXT NOT NULL,
    gpus TEXT NOT NULL, start_usec INTEGER NOT NULL, end_usec INTEGER NOT NULL,
    used_usec INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS holds_by_end ON holds (end_usec);
CREATE TABLE IF NOT EXISTS load (
    gpu TEXT NOT NULL, resolution INTEGER NOT NULL, bucket INTEGER NOT NULL,
    samples INTEGER NOT NULL, utilization_sum REAL NOT NULL, memory_sum REAL NOT NULL,
    PRIMARY KEY (resolution, bucket, gpu)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS starts (start_usec INTEGER NOT NULL, version TEXT NOT NULL);
"""


def retention(settings) -> dict[str, float]:
    """Seconds each kind of row is kept, from the [daemon] settings: ``minute``,
    ``hour``, ``day`` (and the holds)."""
    return {"minute": settings.usage_minute_retention, "hour": settings.usage_hour_retention,
            "day": settings.usage_retention}


class UsageStore:
    def __init__(self, state_dir: Path):
        self.path = Path(state_dir) / FILE_NAME
        self.db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.executescript(SCHEMA)
        self.path.chmod(0o600)

    def record_start(self, now: int, version: str) -> int:
        """Note a start of the daemon; how many starts this state directory has seen."""
        with self.db:
            self.db.execute("INSERT INTO starts VALUES (?, ?)", (now, version))
        return self.db.execute("SELECT count(*) FROM starts").fetchone()[0]

    def record_holds(self, holds: list[Hold]) -> None:
        """Several holds in one transaction."""
        with self.db:
            self.db.execute("BEGIN")
            self.db.executemany("INSERT OR REPLACE INTO holds VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                                [(h.id, h.kind, h.uid, h.user, ",".join(h.gpus), h.start_usec,
                                  h.end_usec, h.used_usec) for h in holds])

    def record_load(self, now: int, loads: dict[str, GpuLoad]) -> None:
        """Add one sample per GPU to its bucket of each resolution (one transaction)."""
        rows = [(gpu, seconds, bucket(now, seconds), load.utilization_pct,
                 load.memory_used_bytes)
                for gpu, load in loads.items() for seconds in RESOLUTIONS.values()]
        with self.db:
            self.db.execute("BEGIN")
            self.db.executemany(
                "INSERT INTO load VALUES (?, ?, ?, 1, ?, ?) ON CONFLICT DO UPDATE SET "
                "samples = samples + 1, utilization_sum = utilization_sum + "
                "excluded.utilization_sum, memory_sum = memory_sum + excluded.memory_sum",
                rows)

    def prune(self, now: int, keep: dict[str, float]) -> None:
        """Drop what is past its retention (``keep``: see ``retention``)."""
        with self.db:
            self.db.execute("BEGIN")
            for name, seconds in RESOLUTIONS.items():
                self.db.execute("DELETE FROM load WHERE resolution = ? AND bucket < ?",
                                (seconds, now - usec_of_seconds(keep[name])))
            self.db.execute("DELETE FROM holds WHERE end_usec < ?",
                            (now - usec_of_seconds(keep["day"]),))

    def holds(self, since: int, until: int, uid: int | None = None) -> list[Hold]:
        query = "SELECT * FROM holds WHERE end_usec > ? AND start_usec < ?"
        args: tuple = (since, until)
        if uid is not None:
            query, args = query + " AND uid = ?", (*args, uid)
        return [Hold(i, kind, u, user, tuple(gpus.split(",")) if gpus else (), start, end, used)
                for i, kind, u, user, gpus, start, end, used in self.db.execute(query, args)]

    def loads(self, since: int, until: int) -> list[tuple]:
        """(gpu, samples, utilisation sum, memory sum) over the whole buckets inside the
        window, each sample once: from days where whole days fit, else hours, else
        minutes (as far back as each is kept)."""
        found: dict[str, list] = {}
        covered: list[tuple[int, int]] = []  # the spans a coarser resolution gave
        for seconds in sorted(RESOLUTIONS.values(), reverse=True):
            width = seconds * USEC
            first = bucket(since + width - 1, seconds)  # the first whole bucket
            for gpu, start, samples, utilization, memory in self.db.execute(
                    "SELECT gpu, bucket, samples, utilization_sum, memory_sum FROM load "
                    "WHERE resolution = ? AND bucket >= ? AND bucket + ? <= ?",
                    (seconds, first, width, until)):
                if any(a <= start < b for a, b in covered):
                    continue
                row = found.setdefault(gpu, [gpu, 0, 0.0, 0.0])
                row[1] += samples
                row[2] += utilization
                row[3] += memory
            covered.append((first, until - until % width))
        return [tuple(row) for row in found.values()]

    def close(self) -> None:
        self.db.close()
