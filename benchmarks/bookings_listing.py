"""``gpuctl bookings --all --json`` with 5,000 bookings against the same with 100, as whole
processes in one run.

Starts two private session buses, a daemon on each (8 simulated GPUs, a config file lifting
``max_bookings_per_user``, ``booking_horizon`` and ``longest_booking``), and fills one
calendar with --small bookings and the other with --large, through one client each:
1-hour bookings of 1 GPU, 8 an hour from the first whole hour an hour or more from now,
every 7th with a label and a task name, every 50th cancelled with a reason (ended, so
still listed).  Then times, as whole processes, interleaved round-robin (the order
rotates every round), ``gpuctl bookings --all --json`` against each daemon and
``gpuctl free`` (the floor of a command that asks the daemon something) against the small
one; each listing is checked to show all its bookings first.

Bytecode is cached under a private ``PYTHONPYCACHEPREFIX`` (filled by the warm-up), as
an installed package loads.  Prints the median and p90 of each and the ratio of the large
listing's median to the small one's.

Target: with 5,000 bookings within 1.5x of the same with 100 (median).

    python benchmarks/bookings_listing.py [--runs 21] [--small 100] [--large 5000]
"""

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _harness import clean_env, daemon_on_private_bus, machine_line, summary

from resourced import Client

TARGET_RATIO = 1.5
GPUS = 8
HOUR = 3600
CONFIG = "[daemon]\nmax_bookings_per_user = 0\nbooking_horizon = 0\nlongest_booking = 0\n"
CALL_TIMEOUT = 60.0
RUN_TIMEOUT = 120.0


def gpuctl() -> list[str]:
    """The console script next to this interpreter, else ``python -m resourced.cli``."""
    script = Path(sys.executable).with_name("gpuctl")
    if script.is_file() and os.access(script, os.X_OK):
        return [str(script)]
    return [sys.executable, "-m", "resourced.cli"]


def fill(n: int) -> float:
    """``n`` bookings in the daemon this process's environment points at; seconds taken."""
    t0 = time.perf_counter()
    first = (int(time.time()) // HOUR + 2) * HOUR
    with Client(bus="session", timeout=CALL_TIMEOUT) as c:
        for i in range(n):
            named = {"label": f"run {i}", "task_name": "sweep"} if i % 7 == 0 else {}
            ref = c.book(HOUR, gpus=1, start=first + (i // GPUS) * HOUR, **named)["booking"]["id"]
            if i % 50 == 49:
                c.cancel(ref, "moved")
    return time.perf_counter() - t0


def time_interleaved(cmds: dict[str, tuple[list[str], dict]], runs: int, warmup: int):
    names = list(cmds)
    samples: dict[str, list[float]] = {n: [] for n in names}
    for r in range(warmup + runs):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            argv, env = cmds[name]
            t0 = time.perf_counter()  # no timeout: waiting with one polls, in steps up to 50 ms
            subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, check=True)
            if r >= warmup:
                samples[name].append(time.perf_counter() - t0)
    return samples


def report(samples: dict[str, list[float]], small: str, large: str) -> None:
    width = max(len(n) for n in samples) + 2
    print(f"\n{'command':<{width}}{'runs':>5}{'median ms':>11}{'p90 ms':>9}")
    for name, values in samples.items():
        s = summary(values)
        print(f"{name:<{width}}{s['n']:>5}{s['p50'] * 1e3:>11.1f}{s['p90'] * 1e3:>9.1f}")
    ratio = summary(samples[large])["p50"] / summary(samples[small])["p50"]
    verdict = "met" if ratio <= TARGET_RATIO else "MISSED"
    print(f"target: the large listing's median within {TARGET_RATIO:g}x of the small one's: "
          f"{ratio:.2f}x ({verdict})")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=21, help="timed runs of each command (21)")
    p.add_argument("--warmup", type=int, default=2, help="untimed rounds first (2)")
    p.add_argument("--small", type=int, default=100, help="bookings in the small calendar")
    p.add_argument("--large", type=int, default=5000, help="bookings in the large calendar")
    args = p.parse_args()
    print(f"bookings_listing: {args.runs} interleaved runs of each command after "
          f"{args.warmup} warm-up rounds; two daemons with {GPUS} simulated GPUs, each on a "
          "private session bus")
    print(machine_line())
    work = Path(tempfile.mkdtemp(prefix="resourced-listing-"))
    try:
        config = work / "resourced.toml"
        config.write_text(CONFIG)
        env_extra = {"PYTHONPYCACHEPREFIX": str(work / "pycache")}
        cli = gpuctl()
        with contextlib.ExitStack() as stack:
            envs = {}
            for n in (args.small, args.large):
                rig = stack.enter_context(daemon_on_private_bus(GPUS, ("--config", str(config))))
                print(f"filled {n:,} bookings in {fill(n):.1f} s")
                env = clean_env(rig.address)
                env.pop("PYTHONDONTWRITEBYTECODE", None)
                envs[n] = {**env, **env_extra}
            for n, env in envs.items():
                out = subprocess.run([*cli, "bookings", "--all", "--json"], env=env, check=True,
                                     capture_output=True, timeout=RUN_TIMEOUT).stdout
                listed = len(json.loads(out))
                if listed != n:
                    raise RuntimeError(f"the listing shows {listed} bookings, not {n}")
                print(f"`gpuctl bookings --all --json` with {n:,}: {len(out):,} bytes")
            small = f"gpuctl bookings --all --json ({args.small:,} bookings)"
            large = f"gpuctl bookings --all --json ({args.large:,} bookings)"
            cmds = {"gpuctl free (floor)": ([*cli, "free"], envs[args.small]),
                    small: ([*cli, "bookings", "--all", "--json"], envs[args.small]),
                    large: ([*cli, "bookings", "--all", "--json"], envs[args.large])}
            samples = time_interleaved(cmds, args.runs, args.warmup)
        report(samples, small, large)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
