"""The usage history after a simulated month on 8 GPUs: the database's size, and
``gpuctl usage`` over that month as a whole process.

Fills a state directory the way the daemon would over 30 days: a load sample of every
GPU each --interval seconds (default 30, the default sample_interval), added to its
minute, hour and day buckets, pruned once a simulated hour with the default retention
(minutes 2 days, hours 90 days, days and holds 400 days); and --holds-per-day ended
claims and bookings (default 60) of 12 users, 1 to 4 GPUs, 10 minutes to 8 hours each,
some used and some not.  The fill writes a day of samples per transaction (the daemon
writes one sample per transaction; the rows and the file are the same).  Then it starts a
daemon on that state directory (a private bus, 8 simulated GPUs) and times
``gpuctl usage --json --since <a month ago>`` and the same ``--by gpu``: median and p90 of
--runs runs after 2 untimed, beside ``gpuctl free`` as the floor of a whole process.

    python benchmarks/usage_month.py [--days 30] [--interval 30] [--runs 11]
"""

import argparse
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _harness import clean_env, daemon_on_private_bus, machine_line, summary

from resourced.backends.simulated import simulated_uuid
from resourced.config import DaemonConfig
from resourced.core.usage import RESOLUTIONS, Hold, bucket
from resourced.daemon.store.usage import FILE_NAME, UsageStore, retention

GPUS = 8
DAY = 86400 * 1_000_000
HOUR = 3600 * 1_000_000
AIM_MS = 300


def fill(state: Path, days: int, interval: int, holds_per_day: int, end: int) -> None:
    store = UsageStore(state)
    keep = retention(DaemonConfig())
    rng = random.Random(7)
    gpus = [simulated_uuid(i) for i in range(GPUS)]
    start = bucket(end - days * DAY, 86400)
    sql = ("INSERT INTO load VALUES (?, ?, ?, 1, ?, ?) ON CONFLICT DO UPDATE SET "
           "samples = samples + 1, utilization_sum = utilization_sum + excluded.utilization_sum, "
           "memory_sum = memory_sum + excluded.memory_sum")
    for day in range(days):
        t0 = start + day * DAY
        rows = [(g, seconds, bucket(t, seconds), rng.randrange(101), rng.randrange(80 << 30))
                for t in range(t0, t0 + DAY, interval * 1_000_000) for g in gpus
                for seconds in RESOLUTIONS.values()]
        with store.db:
            store.db.execute("BEGIN")
            store.db.executemany(sql, rows)
        holds = []
        for i in range(holds_per_day):
            begin = t0 + rng.randrange(DAY)
            length = rng.randrange(600, 8 * 3600) * 1_000_000
            held = tuple(rng.sample(gpus, rng.randint(1, 4)))
            holds.append(Hold(f"d{day}h{i}", rng.choice(["claim", "booking"]),
                              2000 + rng.randrange(12), f"user{rng.randrange(12)}", held,
                              begin, begin + length, int(length * rng.random())))
        store.record_holds(holds)
        for hour in range(24):  # the daemon prunes once an hour
            store.prune(t0 + (hour + 1) * HOUR, keep)
    store.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    store.close()


def line(what: str, ms: list[float]) -> str:
    figures = summary(ms)
    return f"{what}: p50 {figures['p50']:.1f} ms, p90 {figures['p90']:.1f} ms"


def timed(argv: list[str], env: dict, runs: int) -> list[float]:
    for _ in range(2):
        subprocess.run(argv, env=env, check=True, capture_output=True)
    out = []
    for _ in range(runs):
        t = time.perf_counter()
        subprocess.run(argv, env=env, check=True, capture_output=True)
        out.append((time.perf_counter() - t) * 1e3)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--interval", type=int, default=30)
    parser.add_argument("--holds-per-day", type=int, default=60)
    parser.add_argument("--runs", type=int, default=11)
    args = parser.parse_args()
    print(machine_line())
    state = Path(tempfile.mkdtemp(prefix="resourced-usage-"))
    try:
        now = int(time.time()) * 1_000_000
        t = time.perf_counter()
        fill(state, args.days, args.interval, args.holds_per_day, now)
        size = sum(p.stat().st_size for p in state.glob(FILE_NAME + "*"))
        print(f"filled {args.days} days x {GPUS} GPUs (a sample each {args.interval} s, "
              f"{args.holds_per_day} holds a day) in {time.perf_counter() - t:.1f} s")
        print(f"usage.sqlite: {size / 2**20:.2f} MiB")
        gpuctl = str(Path(sys.executable).with_name("gpuctl"))
        since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now / 1e6 - args.days * 86400))
        with daemon_on_private_bus(GPUS, state_dir=str(state)) as rig:
            env = clean_env(rig.address)
            env.pop("PYTHONDONTWRITEBYTECODE", None)  # as an installed package would load
            env["PYTHONPYCACHEPREFIX"] = os.path.join(state, "pycache")
            floor = timed([gpuctl, "free"], env, args.runs)
            print(line("gpuctl free (floor)", floor))
            for extra in ([], ["--by", "gpu"]):
                ms = timed([gpuctl, "usage", "--json", "--since", since, *extra], env, args.runs)
                print(line(f"gpuctl usage --json {' '.join(extra)}".rstrip(), ms)
                      + f"  (aim: under {AIM_MS} ms)")
    finally:
        shutil.rmtree(state, ignore_errors=True)


if __name__ == "__main__":
    main()
