"""resourced against reslock 0.2.0 and 0.12.3 (its predecessor), in the same run on the same
machine.

reslock coordinates through one JSON state file under a file lock: a waiter polls it
every 250 ms (``poll_interval``), and a dead holder's lease is dropped only when some
process next opens the file (``kill(pid, 0)``, which a zombie passes).  resourced is a
daemon on D-Bus: a release serves the queue at once, and a waiter's Claim call is answered
at its grant (``ReplyWhenGranted``); holders are watched through pidfds.

Both get the same setup: a pool of 2 units (resourced: a ``[[pool]] slots`` of capacity
2 from a config file the daemon finds through ``$XDG_CONFIG_HOME``; reslock: the resource
``gpu_slots`` set to 2 in a state file in a temporary folder), and the same worker
script, driven through a small adapter over each library's documented API
(``Client.acquire/try_acquire``, ``ResourcePool.acquire/try_acquire``).  Measured:

(a) wake-up latency: a holder releases the whole pool while one waiter is queued; from
    just before the release call (holder's clock) to just after the waiter's acquire
    returns (waiter's clock; CLOCK_MONOTONIC is system-wide).  The release comes at a
    random moment 0..250 ms after the waiter queued, so reslock's polling phase is
    sampled fairly.  Target for resourced: median < 10 ms.
(b) throughput and fairness: 8 processes loop acquire(1 unit) + release (no hold) for a
    fixed wall time; grants per second in all, and grants per process (min, max); for
    resourced also the CPU its daemon and its bus used per grant (on 2 CPUs, the eight
    clients, the bus and the daemon share what a grant may cost in all).  The libraries
    take turns, in --blocks blocks each (resourced, reslock 0.2.0, ..., then the other
    way round), so that a machine whose speed drifts from minute to minute favours none:
    the figures are over all of a library's blocks, and each block's rate is shown too.
(c) try_acquire + release latency, one process, nothing contending.
(d) a SIGKILLed holder (reaped by its parent at once): from the kill to the grant of a
    process already waiting for the whole pool; then whether the pool shows as free
    1 s after such a kill when no other process calls at all; then a zombie holder
    (killed, never reaped by its parent) against a waiter, capped at --zombie-cap s.

Each reslock version is installed (``pip install reslock==VERSION``, from PyPI) into a
virtualenv of its own kept in the temporary folder across runs; ``--reslock VERSION``
(repeatable) picks the versions, both by default.  Both take the same adapter: 0.12.3
still has ``ResourcePool(path).acquire/try_acquire(**counts)``, ``status().available``
and ``reslock.state.transact``.

    python benchmarks/vs_reslock.py [--seconds 10] [--rounds 30] [--try-n 1000] [--reslock 0.2.0]
"""

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from _harness import clean_env, daemon_on_private_bus, machine_line, summary

RESLOCK_VERSIONS = ("0.2.0", "0.12.3")
POOL_CONFIG = '[[pool]]\nname = "slots"\ncapacity = 2\n'
CAPACITY = 2

# The one worker, run by either interpreter: ``python -c WORKER LIB STATE MODE [ARGS]``.
WORKER = r'''
import json, os, subprocess, sys, time
lib, state, mode, args = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
now = time.monotonic

class Resourced:
    def __init__(self):
        from resourced.client.sync import Client
        self.c = Client(timeout=60)
        self.errors = 0
    def take(self, n):
        """acquire() entered; returns (lease, how to give it back)."""
        lease = self.c.acquire(pools={"slots": n}).__enter__()
        return lease, lambda: lease.__exit__(None, None, None)
    def try_acquire(self, n):
        return self.c.try_acquire(pools={"slots": n})

class Reslock:
    """reslock 0.2.0 writes its state file after dropping the lock (portalocker unlocks,
    then closes, which flushes), so a process that takes the lock meanwhile can read it
    empty or torn and fail with a pydantic ValidationError.  Such failures are counted in
    ``errors`` and retried, so the figures are reslock's as it would be used with retries;
    a failed release is retried too, else its units would stay taken for good.  reslock
    0.12.3 instead gives up on its file lock after 5 s under contention
    (portalocker's AlreadyLocked): counted and retried the same way."""
    def __init__(self):
        from portalocker.exceptions import LockException
        from reslock import ResourcePool
        self.p = ResourcePool(state)
        self.errors = 0
        self.failures = (ValueError, LockException)
    def _retry(self, fn):
        for _ in range(1000):
            try:
                return fn()
            except self.failures:               # a torn read, or a lock given up on
                self.errors += 1
                time.sleep(0.001)
        raise RuntimeError("reslock state file unreadable 1000 times in a row")
    def take(self, n):
        def enter():
            cm = self.p.acquire(gpu_slots=n)    # a context manager, as documented
            return cm, cm.__enter__()
        cm, lease = self._retry(enter)
        def give():
            try:
                cm.__exit__(None, None, None)
            except self.failures:
                self.errors += 1
                lease._released = False         # the release did not happen: again
                self._retry(lease.release)
        return lease, give
    def try_acquire(self, n):
        return self._retry(lambda: self.p.try_acquire(gpu_slots=n))

lib = Resourced() if lib == "resourced" else Reslock()
take = lib.take

def say(*words):
    print(*words, flush=True)

if mode == "holder":                    # (a): takes/gives back the pool when told
    give = None
    for line in sys.stdin:
        cmd = line.strip()
        if cmd == "take":
            _, give = take(2)
            say("held")
        elif cmd == "give":
            t = now()
            give()
            say(repr(t))
elif mode == "waiter":                  # (a): waits for the pool when told
    give = None
    for line in sys.stdin:
        cmd = line.strip()
        if cmd == "wait":
            _, give = take(2)
            say(repr(now()))
        elif cmd == "give":
            give()
            say("ok")
elif mode == "contend":                 # (b)
    seconds = float(args[0])
    say("ready")
    sys.stdin.readline()
    count, end = 0, now() + seconds
    while now() < end:
        _, give = take(1)
        give()
        count += 1
    say(count, lib.errors)
elif mode == "try":                     # (c)
    n, samples, misses = int(args[0]), [], 0
    for _ in range(n // 10):            # warm-up
        lease = lib.try_acquire(1)
        if lease is not None:
            lease.release()
    for _ in range(n):
        t0 = now()
        lease = lib.try_acquire(1)
        if lease is None:
            misses += 1
        else:
            lease.release()
        samples.append(now() - t0)
    say(json.dumps({"samples": samples, "misses": misses}))
elif mode == "hold":                    # (d): holds the pool until killed
    held = take(2)                      # (kept: reslock's lease ends when its cm is collected)
    say("held")
    time.sleep(120)
elif mode == "neglect":                 # (d): a parent that never reaps its holder
    child = subprocess.Popen([sys.executable, "-c", os.environ["BENCH_WORKER"],
                              sys.argv[1], state, "hold"])
    say(child.pid)
    sys.stdin.readline()                # until told to reap it at last
    child.wait()
    say("reaped")
elif mode == "probe":                   # (d): waits for the whole pool
    _, give = take(2)
    say(repr(now()))
    give()
elif mode == "free":                    # (d): a read-only look, cleaning nothing
    if isinstance(lib, Resourced):
        say(next(p["free"] for p in lib.c.status()["pools"] if p["name"] == "slots"))
    else:
        say(lib._retry(lib.p.status).available.get("gpu_slots", 0))
'''


class Side:
    """One library under test: how to start its workers."""

    def __init__(self, name: str, python: str, env: dict[str, str], state: str = "",
                 servers: dict[str, int] | None = None):
        self.name, self.python, self.env, self.state = name, python, env, state
        self.servers = servers or {}  # long-lived processes serving it: name -> pid

    def spawn(self, mode: str, *args: str, stdin=subprocess.PIPE) -> subprocess.Popen:
        lib = "resourced" if self.name == "resourced" else "reslock"
        return subprocess.Popen(
            [self.python, "-c", WORKER, lib, self.state, mode, *args],
            stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**self.env, "BENCH_WORKER": WORKER})

    def queued(self) -> int:
        """How many wait in the queue (read from here, without taking part)."""
        if self.name == "resourced":
            from resourced import Client

            with Client(bus="session") as c:
                return len(c.status()["queue"])
        for _ in range(100):  # reslock rewrites the file in place: retry a torn read
            try:
                return len(json.loads(Path(self.state).read_text())["queue"])
            except (ValueError, KeyError):
                time.sleep(0.001)
        raise RuntimeError("cannot read the reslock state file")


def line(proc: subprocess.Popen, timeout: float = 30.0) -> str:
    out: list[str] = []
    reader = threading.Thread(target=lambda: out.append(proc.stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout)
    if not out or not out[0]:
        proc.kill()
        raise RuntimeError(f"worker {proc.args[3:6]} said nothing within {timeout} s: "
                           f"{proc.stderr.read() if proc.poll() is not None else ''}")
    return out[0].strip()


def tell(proc: subprocess.Popen, cmd: str, timeout: float = 30.0) -> str:
    proc.stdin.write(cmd + "\n")
    proc.stdin.flush()
    return line(proc, timeout)


def stop(*procs: subprocess.Popen) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait(10)


def wait_queued(side: Side, n: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while side.queued() < n:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{side.name}: nobody queued within {timeout} s")
        time.sleep(0.002)


# -- the measurements ----------------------------------------------------------------------
def wake_up(side: Side, rounds: int) -> list[float]:
    """(a) seconds from a release to the queued waiter's grant, per round."""
    holder, waiter = side.spawn("holder"), side.spawn("waiter")
    samples = []
    try:
        for _ in range(rounds):
            assert tell(holder, "take") == "held"
            waiter.stdin.write("wait\n")
            waiter.stdin.flush()
            wait_queued(side, 1)
            time.sleep(random.uniform(0, 0.25))
            released = float(tell(holder, "give"))
            granted = float(line(waiter))
            samples.append(granted - released)
            assert tell(waiter, "give") == "ok"
    finally:
        stop(holder, waiter)
    return samples


def contention(side: Side, seconds: float, procs: int = 8
               ) -> tuple[list[tuple[int, int]], dict[str, float]]:
    """(b) (grants, failed state-file reads) per process in ``seconds`` of contention, and
    the CPU seconds each of the side's servers (resourced: the daemon, the bus) used."""
    workers = [side.spawn("contend", str(seconds)) for _ in range(procs)]
    try:
        for w in workers:
            assert line(w) == "ready"
        before = {name: cpu_seconds(pid) for name, pid in side.servers.items()}
        for w in workers:
            w.stdin.write("go\n")
            w.stdin.flush()
        counts = [tuple(int(x) for x in line(w, seconds + 60).split()) for w in workers]
        return counts, {name: cpu_seconds(pid) - before[name]
                        for name, pid in side.servers.items()}
    finally:
        stop(*workers)


def cpu_seconds(pid: int) -> float:
    """CPU time a process (all its threads) has used so far."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{task}/schedstat") as f:
            total += int(f.read().split()[0])
    return total / 1e9


def try_latency(side: Side, n: int) -> tuple[list[float], int]:
    """(c) seconds per try_acquire+release, and how many found the pool full."""
    w = side.spawn("try", str(n))
    try:
        data = json.loads(line(w, 120))
    finally:
        stop(w)
    return data["samples"], data["misses"]


def killed_holder(side: Side, rounds: int) -> list[float]:
    """(d) seconds from SIGKILL of a (reaped) holder to a waiting process's grant."""
    samples = []
    for _ in range(rounds):
        holder = side.spawn("hold")
        probe = None
        try:
            assert line(holder) == "held"
            probe = side.spawn("probe")
            wait_queued(side, 1)
            killed = time.monotonic()
            holder.kill()
            holder.wait(10)
            samples.append(float(line(probe, 30)) - killed)
            probe.wait(10)
        finally:
            stop(holder, *([probe] if probe else []))
    return samples


def free_without_callers(side: Side, idle: float = 1.0) -> int:
    """(d) units free, by a read-only look, ``idle`` s after a holder was SIGKILLed with
    nobody else calling meanwhile."""
    holder = side.spawn("hold")
    try:
        assert line(holder) == "held"
        holder.kill()
        holder.wait(10)
        time.sleep(idle)
        look = side.spawn("free")
        free = int(line(look))
        look.wait(10)
    finally:
        stop(holder)
    if side.name != "resourced":  # leave the file clean for the next measurement
        cleanup = side.spawn("try", "10")
        line(cleanup, 30)
        cleanup.wait(10)
    return free


def zombie_holder(side: Side, cap: float) -> float | None:
    """(d) seconds from SIGKILL of a holder its parent never reaps to a waiter's grant;
    None if not within ``cap`` seconds."""
    parent = side.spawn("neglect")
    probe = None
    try:
        child = int(line(parent))
        wait_held(side, child)
        probe = side.spawn("probe")
        wait_queued(side, 1)
        killed = time.monotonic()
        os.kill(child, signal.SIGKILL)
        try:
            return float(line(probe, cap)) - killed
        except RuntimeError:
            return None
    finally:
        stop(*([probe] if probe else []))
        if parent.poll() is None:
            tell(parent, "reap")
        stop(parent)
        if side.name != "resourced":
            cleanup = side.spawn("try", "10")
            line(cleanup, 30)
            cleanup.wait(10)


def wait_held(side: Side, pid: int, timeout: float = 15.0) -> None:
    """Until ``pid`` holds the pool (its worker prints "held" to a stdout we do not read)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if side.name == "resourced":
            from resourced import Client

            with Client(bus="session") as c:
                if any(cl["owner_pid"] == pid and cl["state"] == "granted"
                       for cl in c.status()["claims"]):
                    return
        else:
            try:
                if any(lease["pid"] == pid for lease in json.loads(Path(side.state).read_text())["leases"]):
                    return
            except ValueError:
                pass
        time.sleep(0.01)
    raise RuntimeError(f"{side.name}: pid {pid} did not get the pool within {timeout} s")


# -- setting up --------------------------------------------------------------------------------
def reslock_python(version: str) -> str:
    """An interpreter with reslock ``version``: a virtualenv cached across runs."""
    venv = Path(tempfile.gettempdir()) / f"resourced-bench-reslock-{version}"
    python = venv / "bin" / "python"
    check = [str(python), "-c", "import importlib.metadata as m; print(m.version('reslock'))"]
    if python.exists():
        found = subprocess.run(check, capture_output=True, text=True, check=False).stdout
        if found.strip() == version:
            return str(python)
    print(f"installing reslock=={version} into {venv} ...", file=sys.stderr)
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", f"reslock=={version}"],
                   check=True)
    return str(python)


def reslock_side(version: str, folder: str) -> Side:
    python = reslock_python(version)
    state = os.path.join(folder, "state.json")
    os.makedirs(folder, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RESOURCED_", "DBUS_"))}
    subprocess.run([python, "-c", (
        "import sys; from pathlib import Path; from reslock.state import ensure_state_file, "
        "transact; p = Path(sys.argv[1]); ensure_state_file(p); "
        f"transact(p, lambda s: s.resources.update(gpu_slots={CAPACITY}))"), state],
        check=True, env=env)
    return Side(f"reslock {version}", python, env, state)


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms" if seconds < 10 else f"{seconds:.1f} s"


def alternating_contention(sides: list[Side], args) -> dict[str, dict]:
    """(b) for every side, in ``args.blocks`` blocks each, the sides taking turns."""
    block = args.seconds / args.blocks
    totals = {s.name: {"counts": [0] * 8, "errors": 0, "cpu": {}, "rates": []} for s in sides}
    for i in range(args.blocks):
        for side in sides if i % 2 == 0 else sides[::-1]:
            print(f"(b) {side.name}, block {i + 1} of {args.blocks} ...", file=sys.stderr)
            per_process, server_cpu = contention(side, block)
            t = totals[side.name]
            t["counts"] = [a + grants for a, (grants, _) in zip(t["counts"], per_process)]
            t["errors"] += sum(errors for _, errors in per_process)
            t["rates"].append(sum(grants for grants, _ in per_process) / block)
            for name, used in server_cpu.items():
                t["cpu"][name] = t["cpu"].get(name, 0.0) + used
    results = {}
    for name, t in totals.items():
        counts = t["counts"]
        results[name] = {
            "server cpu": ", ".join(f"{server} {used / max(sum(counts), 1) * 1e6:.0f} us"
                                    for server, used in t["cpu"].items()) or "(no server)",
            "errors": str(t["errors"]),
            "throughput": f"{sum(counts) / args.seconds:.0f} grants/s",
            "blocks": " ".join(f"{rate:.0f}" for rate in t["rates"]),
            "per process": f"{min(counts)} / {max(counts)}",
            "spread": f"{max(counts) / min(counts):.2f}x" if min(counts) else "inf (one got none)",
            "counts": " ".join(str(c) for c in sorted(counts)),
        }
    return results


def run(side: Side, args) -> dict:
    """(a), (c) and (d) for one side."""
    print(f"measuring {side.name} ...", file=sys.stderr)
    r = {}
    wake = summary(wake_up(side, args.rounds))
    r["wake p50"], r["wake p99"] = ms(wake["p50"]), ms(wake["p99"])
    samples, misses = try_latency(side, args.try_n)
    tries = summary(samples)
    r["try p50"], r["try p99"] = ms(tries["p50"]), ms(tries["p99"])
    if misses:
        r["try p99"] += f" ({misses} misses)"
    kills = killed_holder(side, args.kill_rounds)
    r["kill p50"], r["kill max"] = ms(summary(kills)["p50"]), ms(max(kills))
    free = free_without_callers(side)
    r["idle free"] = f"{free} of {CAPACITY}" + ("" if free == CAPACITY else " (still held)")
    zombie = zombie_holder(side, args.zombie_cap)
    r["zombie"] = ms(zombie) if zombie is not None else f"not freed in {args.zombie_cap:g} s"
    return r


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=12.0, help="(b) wall time per library (12)")
    p.add_argument("--blocks", type=int, default=3, help="(b) blocks per library, taking turns (3)")
    p.add_argument("--rounds", type=int, default=30, help="(a) rounds per library (30)")
    p.add_argument("--try-n", type=int, default=1000, help="(c) calls per library (1000)")
    p.add_argument("--kill-rounds", type=int, default=10, help="(d) kills per library (10)")
    p.add_argument("--zombie-cap", type=float, default=3.0, help="(d) zombie wait cap, s (3)")
    p.add_argument("--reslock", action="append", choices=RESLOCK_VERSIONS,
                   help="a reslock version to measure (repeatable; default: all)")
    args = p.parse_args()
    versions = args.reslock or list(RESLOCK_VERSIONS)

    folder = tempfile.mkdtemp(prefix="resourced-vs-reslock-")
    config_home = os.path.join(folder, "config")
    os.makedirs(os.path.join(config_home, "resourced"))
    Path(config_home, "resourced", "config.toml").write_text(POOL_CONFIG)
    saved = os.environ.get("XDG_CONFIG_HOME")
    os.environ["XDG_CONFIG_HOME"] = config_home  # the daemon finds the pool config there
    try:
        with daemon_on_private_bus(gpus=1) as bus:
            sides = [Side("resourced", sys.executable, clean_env(bus.address),
                          servers={"daemon": bus.daemon.pid, "bus": bus.bus.pid})]
            sides += [reslock_side(version, os.path.join(folder, f"reslock-{version}"))
                      for version in versions]
            results = alternating_contention(sides, args)
            for side in sides:
                results[side.name].update(run(side, args))
    finally:
        if saved is None:
            os.environ.pop("XDG_CONFIG_HOME", None)
        else:
            os.environ["XDG_CONFIG_HOME"] = saved
        shutil.rmtree(folder, ignore_errors=True)
    report(results, args)


ROWS = [
    ("(a) wake-up, release -> waiter's grant", "p50", "wake p50"),
    ("", "p99", "wake p99"),
    ("(b) 8 processes, pool of 2, acquire+release", "throughput", "throughput"),
    ("", "each block, grants/s", "blocks"),
    ("", "grants/process min / max", "per process"),
    ("", "spread max/min", "spread"),
    ("", "grants per process", "counts"),
    ("", "torn reads or lock time-outs, retried", "errors"),
    ("", "CPU per grant of the servers", "server cpu"),
    ("(c) try_acquire+release, uncontended", "p50", "try p50"),
    ("", "p99", "try p99"),
    ("(d) SIGKILLed holder -> waiter's grant", "p50", "kill p50"),
    ("", "max", "kill max"),
    ("    1 s after the kill, nobody calling", "pool free", "idle free"),
    ("    zombie holder -> waiter's grant", "", "zombie"),
]


def report(results: dict[str, dict], args) -> None:
    names = list(results)
    print(f"\nresourced vs {', '.join(names[1:])}: pool of {CAPACITY}, same machine, same run; "
          f"(a) {args.rounds} rounds, (b) {args.seconds:g} s each in {args.blocks} blocks, "
          f"(c) {args.try_n} calls, "
          f"(d) {args.kill_rounds} kills")
    print(machine_line())
    table = [["measure", ""] + names]
    table += [[title, what] + [str(results[n][key]) for n in names] for title, what, key in ROWS]
    widths = [max(len(row[i]) for row in table) + 2 for i in range(len(table[0]))]
    for i, row in enumerate(table):
        print("".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
        if i == 0:
            print("-" * (sum(widths) - 2))
    p50 = results["resourced"]["wake p50"]
    value = float(p50.split()[0]) / (1 if p50.endswith(" ms") else 1e-3)
    print(f"\ntarget: resourced wake-up median < 10 ms: {'met' if value < 10 else 'MISSED'} ({p50})")
    ours = float(results["resourced"]["throughput"].split()[0])
    for name in names[1:]:
        ratio = ours / max(float(results[name]["throughput"].split()[0]), 1e-9)
        print(f"target: (b) throughput at least 2x {name}'s: "
              f"{'met' if ratio >= 2 else 'MISSED'} ({ratio:.2f}x)")


if __name__ == "__main__":
    main()
