"""Claims per second with persistence on, against the same with persistence off.

Every grant and release is appended to the runtime directory's claims log before the
daemon replies (``[daemon] persist = true``, the default); ``persist = false`` keeps
claims in memory only (for this comparison; a restart then forgets them).  One client
runs claim+release pairs back to back for a fixed time against each daemon, in
alternating rounds; the log lives on tmpfs (as /run and $XDG_RUNTIME_DIR are), and once
more on a disk-backed directory.

Target: persistence costs little (a write per change, no fsync but at compaction).

    python benchmarks/persistence.py [--seconds 3] [--rounds 3]
"""

import argparse
import os
import tempfile
import time

from _harness import daemon_on_private_bus, machine_line

from resourced.client.sync import Client


def rate(seconds: float) -> float:
    """claim+release pairs per second through one connection."""
    with Client(bus="session") as c:
        for _ in range(50):  # warm-up
            c.release(c.claim(mode="dev", gpus=1, owner_pid=os.getpid())["allocation"]["ref"])
        n, deadline = 0, time.perf_counter() + seconds
        start = time.perf_counter()
        while time.perf_counter() < deadline:
            c.release(c.claim(mode="dev", gpus=1, owner_pid=os.getpid())["allocation"]["ref"])
            n += 1
        return n / (time.perf_counter() - start)


def measure(persist: bool, seconds: float, parent: str | None) -> float:
    with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as f:
        f.write(f"[daemon]\npersist = {'true' if persist else 'false'}\n")
    try:
        with daemon_on_private_bus(args=("--config", f.name), runtime_parent=parent):
            return rate(seconds)
    finally:
        os.unlink(f.name)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    print(f"persistence: {a.rounds} alternating rounds of {a.seconds:g} s of claim+release per setting")
    print(machine_line())
    disk = tempfile.mkdtemp(prefix="resourced-bench-disk-", dir="/var/tmp")
    settings = [("persist off", False, None), ("persist on (tmpfs)", True, None),
                ("persist on (disk)", True, disk)]
    results: dict[str, list[float]] = {name: [] for name, _, _ in settings}
    for _ in range(a.rounds):
        for name, persist, parent in settings:
            results[name].append(measure(persist, a.seconds, parent))
    os.rmdir(disk)
    base = sorted(results["persist off"])[len(results["persist off"]) // 2]
    print(f"{'':22}{'claims/s (median)':>18}{'vs off':>10}")
    for name, values in results.items():
        median = sorted(values)[len(values) // 2]
        print(f"{name:22}{median:18.0f}{median / base:10.2f}")


if __name__ == "__main__":
    main()
