"""Claim+release round-trip latency through one client connection, against a bare ping.

Starts its own private session bus and a daemon on it (8 simulated GPUs), then through
ONE connection times, alternating blocks so both see the same machine state:

* baseline: ``client.ping()``, an ``org.freedesktop.DBus.Peer.Ping`` to the daemon
  (client -> dbus-daemon -> resourced and back, with no resourced code in the path);
* ``client.claim(mode="dev", gpus=1, owner_pid=os.getpid())`` then
  ``client.release(ref)``, timed as one unit (two method calls), and each half on its own.

Both through ``resourced.Client`` (blocking, jeepney) and ``resourced.AsyncClient``
(asyncio, jeepney's router).  Prints p50, p99 and mean of each, and the ratio of the
claim+release p50 to the ping p50; and the daemon's own CPU time per call of each kind
(from ``/proc/PID/schedstat``, over each block: signals, audit lines and other work done
after the reply count too), which other processes' load disturbs far less.

Targets: ratio <= 4 (two round trips plus the daemon's work should cost at most twice
what two bare round trips do); claim+release p99 < 5 ms.

    python benchmarks/claim_roundtrip.py [--n 2000] [--warmup 200] [--block 100]
"""

import argparse
import asyncio
import json
import os
import tempfile
import time

from _harness import daemon_on_private_bus, machine_line, summary

from resourced import AsyncClient, Client
from resourced.backends.simulated import simulated_uuid

TARGET_RATIO = 4.0
TARGET_P99_MS = 5.0

OPS = ("ping", "claim+release", "  claim", "  release")


def _new_samples() -> dict[str, list[float]]:
    return {op: [] for op in OPS}


def _schedule(n: int, block: int) -> list[str]:
    """Blocks of ``block`` calls, alternating which kind goes first in each pair."""
    order = []
    rounds = -(-n // block)
    for r in range(rounds):
        size = min(block, n - r * block)
        pair = ("ping", "claim") if r % 2 == 0 else ("claim", "ping")
        order.extend([pair[0]] * size + [pair[1]] * size)
    return order


def _cpu_ns(daemon: int) -> int:
    """Nanoseconds the daemon has run on a CPU so far."""
    with open(f"/proc/{daemon}/schedstat") as f:
        return int(f.read().split()[0])


class _DaemonCpu:
    """The daemon's CPU time per kind of call, block by block (a block's last calls may
    leave work behind that the next block pays for: blocks alternate, so it evens out)."""

    def __init__(self, daemon: int):
        self.daemon, self.kind, self.mark = daemon, None, 0
        self.ns = {"ping": 0, "claim": 0}
        self.calls = {"ping": 0, "claim": 0}

    def call(self, kind: str, counting: bool) -> None:
        if kind != self.kind:
            now = _cpu_ns(self.daemon)
            if self.kind is not None and counting:
                self.ns[self.kind] += now - self.mark
            self.kind, self.mark = kind, now
        if counting:
            self.calls[kind] += 1

    def per_call_us(self) -> dict[str, float]:
        """Microseconds per call of each kind, the last block closed now."""
        self.ns[self.kind] += _cpu_ns(self.daemon) - self.mark
        return {k: self.ns[k] / max(self.calls[k], 1) / 1e3 for k in self.ns}


def run_blocking(n: int, warmup: int, block: int, daemon: int) -> dict[str, list[float]]:
    pid = os.getpid()
    clock = time.perf_counter_ns
    cpu = _DaemonCpu(daemon)
    with Client(bus="session") as client:
        samples = _new_samples()
        for i, kind in enumerate(_schedule(warmup, block) + _schedule(n, block)):
            if i == 2 * warmup:
                samples = _new_samples()  # the warm-up is over: start counting
            cpu.call(kind, i >= 2 * warmup)
            if kind == "ping":
                t0 = clock()
                client.ping()
                samples["ping"].append(clock() - t0)
            else:
                t0 = clock()
                ref = client.claim(mode="dev", gpus=1, owner_pid=pid)["allocation"]["ref"]
                t1 = clock()
                client.release(ref)
                t2 = clock()
                samples["claim+release"].append(t2 - t0)
                samples["  claim"].append(t1 - t0)
                samples["  release"].append(t2 - t1)
    samples["cpu"] = cpu.per_call_us()
    return samples


async def run_async(n: int, warmup: int, block: int, daemon: int) -> dict[str, list[float]]:
    pid = os.getpid()
    clock = time.perf_counter_ns
    cpu = _DaemonCpu(daemon)
    async with AsyncClient(bus="session") as client:
        samples = _new_samples()
        for i, kind in enumerate(_schedule(warmup, block) + _schedule(n, block)):
            if i == 2 * warmup:
                samples = _new_samples()
            cpu.call(kind, i >= 2 * warmup)
            if kind == "ping":
                t0 = clock()
                await client.ping()
                samples["ping"].append(clock() - t0)
            else:
                t0 = clock()
                ref = (await client.claim(mode="dev", gpus=1, owner_pid=pid))["allocation"]["ref"]
                t1 = clock()
                await client.release(ref)
                t2 = clock()
                samples["claim+release"].append(t2 - t0)
                samples["  claim"].append(t1 - t0)
                samples["  release"].append(t2 - t1)
    samples["cpu"] = cpu.per_call_us()
    return samples


def report(title: str, samples: dict[str, list[float]]) -> None:
    stats = {op: summary([ns / 1e6 for ns in samples[op]]) for op in OPS}
    print(f"\n{title}")
    print(f"  {'':<20}{'n':>6}{'p50 ms':>10}{'p99 ms':>10}{'mean ms':>10}")
    for op in OPS:
        s = stats[op]
        label = f"{op} (baseline)" if op == "ping" else op
        print(f"  {label:<20}{s['n']:>6}{s['p50']:>10.3f}{s['p99']:>10.3f}{s['mean']:>10.3f}")
    ratio = stats["claim+release"]["p50"] / stats["ping"]["p50"]
    p99 = stats["claim+release"]["p99"]
    print(f"  ratio claim+release p50 / ping p50: {ratio:.2f}   "
          f"(target <= {TARGET_RATIO:g}: {'met' if ratio <= TARGET_RATIO else 'MISSED'})")
    print(f"  claim+release p99: {p99:.3f} ms   "
          f"(target < {TARGET_P99_MS:g} ms: {'met' if p99 < TARGET_P99_MS else 'MISSED'})")
    cpu = samples["cpu"]
    print(f"  daemon CPU per call: ping {cpu['ping']:.0f} us, claim+release {cpu['claim']:.0f} us")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=2000, help="timed calls of each kind (2000)")
    p.add_argument("--warmup", type=int, default=200, help="untimed calls of each kind first (200)")
    p.add_argument("--block", type=int, default=100, help="calls per block before switching (100)")
    p.add_argument("--gpus", type=int, default=8, help="simulated GPUs in the daemon (8)")
    p.add_argument("--no-async", action="store_true", help="skip the AsyncClient row")
    p.add_argument("--json-simulation", action="store_true",
                   help="simulate the GPUs from a JSON file (read at every look, in a thread, "
                   "as the evidence look at claim time reads the driver) instead of a count")
    args = p.parse_args()

    print(f"claim_roundtrip: {args.n} timed calls of each kind after {args.warmup} warm-up, "
          f"alternating blocks of {args.block}; daemon with {args.gpus} simulated GPUs "
          f"({'a JSON file' if args.json_simulation else 'a count'}) on a private session bus")
    print(machine_line())
    with tempfile.TemporaryDirectory() as tmp:
        gpus: int | str = args.gpus
        if args.json_simulation:
            gpus = os.path.join(tmp, "gpus.json")
            with open(gpus, "w") as f:
                json.dump({"gpus": [{"index": i, "uuid": simulated_uuid(i)}
                                    for i in range(args.gpus)]}, f)
        measure(gpus, args)


def measure(gpus: int | str, args) -> None:
    with daemon_on_private_bus(gpus) as rig:
        report("Client (blocking, one jeepney connection)",
               run_blocking(args.n, args.warmup, args.block, rig.daemon.pid))
        if not args.no_async:
            report("AsyncClient (asyncio, one jeepney router)",
                   asyncio.run(run_async(args.n, args.warmup, args.block, rig.daemon.pid)))


if __name__ == "__main__":
    main()
