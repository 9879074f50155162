"""Scale: what one client sees while others hold many claims or wait in a long queue.

Starts a private session bus and a daemon on it (simulated GPUs, a ``[[pool]] slots`` big
enough for every claim, the per-user limits lifted, persistence on, a runtime directory of
its own), and measures three states of it:

* empty: nothing held;
* N granted claims: one other connection holds N claims of ``slots=1`` (mode dev, owned
  by a ``sleep`` of the benchmark), sent pipelined;
* W queued waiters: one claim holds every GPU, and one other connection queues W requests
  for 1 GPU each (``Wait``), sent pipelined without waiting for their grants.

In each: claim+release of ``slots=1`` through one ``Client`` (p50 and max; a bare Ping
alongside for reference), the ``Describe`` call (and its size), ``gpuctl status`` and
``gpuctl status --json`` as whole processes (median of 3), the daemon's VmRSS, and a
restart (SIGTERM, then a new daemon on the same runtime directory: from spawn to the first
answered Ping).  Filling reports its time and the cost of the first and the last 500
claims, to show whether enqueueing stays flat as the daemon fills.

Targets (N = 10,000, W = 2,000): claim+release p50 within 1.5x of empty; enqueue cost
flat; RSS with N claims under 60 MB; restart with N claims under 1 s; ``Describe`` and
``gpuctl status`` with N claims under 300 ms.

    python benchmarks/scale.py [--claims 10000] [--waiters 2000] [--iterations 200] [--quick]
"""

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _harness import _tmpfs, clean_env, machine_line, percentile, rss_mb, wait_ready
from jeepney.low_level import HeaderFields

from resourced.client.sync import Client
from resourced.linux.privatebus import PrivateBus

POOL = "slots"
GPUS = 4
WINDOW = 64             # calls in flight on one connection (dbus-daemon allows 128 replies)
CALL_TIMEOUT = 60.0     # one call, or one reply of a pipelined burst
CLI_TIMEOUT = 120.0     # one gpuctl process
READY_TIMEOUT = 120.0   # a (re)started daemon answers
STOP_TIMEOUT = 30.0
CHUNK = 500             # claims per enqueue-cost sample
TARGET_RATIO = 1.5      # claim+release p50, against the empty daemon
TARGET_FLAT = 1.5       # the last chunk's enqueue cost, against the first's
TARGET_RSS_MB = 60
TARGET_RESTART_S = 1.0
TARGET_STATUS_MS = 300  # Describe, and gpuctl status as a whole process


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


class Daemon:
    """The daemon on the private bus, restartable on the same runtime directory and config."""

    def __init__(self, bus: PrivateBus, workdir: Path, capacity: int):
        self.runtime_dir = workdir / "run"
        self.config = workdir / "config.toml"
        self.config.write_text("[daemon]\nmax_claims_per_user = 0\nmax_waiting_per_user = 0\n"
                               f'[[pool]]\nname = "{POOL}"\ncapacity = {capacity}\n')
        self.env = {**clean_env(bus.address), "RESOURCED_SIMULATED_GPUS": str(GPUS),
                    "RESOURCED_RUNTIME_DIR": str(self.runtime_dir),
                    "RESOURCED_STATE_DIR": str(workdir / "state")}
        self.log_path = workdir / "daemon.log"
        self.log = open(self.log_path, "a+")
        self.proc: subprocess.Popen | None = None

    def start(self) -> float:
        """Spawn the daemon; seconds from the spawn to its first answered Ping."""
        t0 = time.perf_counter()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "resourced.daemon", "--session", "--config", str(self.config)],
            env=self.env, stdout=self.log, stderr=subprocess.STDOUT)
        wait_ready(self.proc, self.log, READY_TIMEOUT)
        return time.perf_counter() - t0

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            say(f"daemon did not stop within {STOP_TIMEOUT:g} s of SIGTERM: killed")
            self.proc.kill()
            self.proc.wait(10)

    def restart(self) -> float:
        self.stop()
        return self.start()

    def fresh(self) -> None:
        """A daemon with no claims."""
        self.stop()
        shutil.rmtree(self.runtime_dir, ignore_errors=True)
        self.start()

    def rss_mb(self) -> float:
        return rss_mb(self.proc.pid)

    def problems(self) -> list[str]:
        self.log.flush()
        return [line for line in self.log_path.read_text().splitlines()
                if "Traceback" in line or "ERROR" in line or "Error" in line]

    def close(self) -> None:
        self.stop()
        self.log.close()


# -- filling ----------------------------------------------------------------------------------


def fill(client: Client, n: int, what: str, **claim) -> tuple[float, float, float]:
    """Send ``n`` identical Claim calls pipelined on ``client``'s connection; returns (total
    seconds, seconds for the first and for the last full chunk of completions)."""
    conn = client._connection()
    chunk = min(CHUNK, max(1, n // 2))
    pending: set[int] = set()
    sent = done = 0
    marks = [time.perf_counter()]  # the time of every chunk-th completion
    while done < n:
        while sent < n and len(pending) < WINDOW:
            serial = next(conn.outgoing_serial)
            conn.send(client._claim_message(**claim), serial=serial)
            pending.add(serial)
            sent += 1
        reply = conn.receive(timeout=CALL_TIMEOUT)
        serial = reply.header.fields.get(HeaderFields.reply_serial)
        if serial not in pending:
            continue  # a signal, or something else not ours
        pending.discard(serial)
        client._body(reply)  # raises on an error reply
        done += 1
        if done % chunk == 0:
            marks.append(time.perf_counter())
        if done % (chunk * 4) == 0 or done == n:
            say(f"  {what}: {done}/{n} in {time.perf_counter() - marks[0]:.1f} s")
    return time.perf_counter() - marks[0], marks[1] - marks[0], marks[-1] - marks[-2]


def fill_line(what: str, n: int, figures: tuple[float, float, float]) -> str:
    total, first, last = figures
    chunk = min(CHUNK, max(1, n // 2))
    return (f"{what}: {n} in {total:.2f} s ({n / total:.0f}/s); per {chunk}: first "
            f"{first * 1e3:.0f} ms, last {last * 1e3:.0f} ms (x{last / first:.2f})")


# -- one state ---------------------------------------------------------------------------------


def median(values: list[float]) -> float:
    return percentile(sorted(values), 50)


def timed_cli(args: list[str], env: dict[str, str], runs: int = 3) -> float:
    """Median wall seconds of ``gpuctl ARGS`` as a whole process; nan if it failed."""
    script = Path(sys.executable).with_name("gpuctl")
    cmd = [str(script)] if script.is_file() else [sys.executable, "-m", "resourced.cli"]
    samples = []
    for _ in range(runs):
        t0 = time.perf_counter()
        proc = subprocess.run(cmd + args, env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, timeout=CLI_TIMEOUT, text=True)
        samples.append(time.perf_counter() - t0)
        if proc.returncode:
            say(f"gpuctl {' '.join(args)} exited {proc.returncode}: {proc.stderr.strip()}")
            return float("nan")
    return median(samples)


def measure(daemon: Daemon, iterations: int, label: str) -> dict:
    """Everything but the restart, in the daemon's present state."""
    say(f"{label}: measuring")
    pid, clock = os.getpid(), time.perf_counter
    row = {"state": label}
    with Client(bus="session", timeout=CALL_TIMEOUT) as c:
        pings, rounds = [], []
        for i in range(iterations + iterations // 10):
            t0 = clock()
            c.ping()
            t1 = clock()
            ref = c.claim(mode="dev", gpus=0, pools={POOL: 1}, owner_pid=pid)["allocation"]["ref"]
            c.release(ref)
            if i >= iterations // 10:  # after the warm-up
                pings.append(t1 - t0)
                rounds.append(clock() - t1)
        row["p50"], row["max"], row["ping"] = median(rounds), max(rounds), median(pings)
        describes = []
        for _ in range(3):
            t0 = clock()
            text = c._send(c._call("Describe"))[0]
            describes.append(clock() - t0)
        row["describe"], row["describe_bytes"] = median(describes), len(text.encode())
    row["status"] = timed_cli(["status"], daemon.env)
    row["status_json"] = timed_cli(["status", "--json"], daemon.env)
    row["rss"] = daemon.rss_mb()
    return row


def counts() -> str:
    with Client(bus="session", timeout=CALL_TIMEOUT) as c:
        n = {p: c._send(c._get_property(p))[0][1] for p in ("NClaims", "NQueued")}
    return f"NClaims {n['NClaims']}, NQueued {n['NQueued']}"


def restart(daemon: Daemon, row: dict, notes: list[str]) -> None:
    say(f"{row['state']}: restarting")
    before = counts()
    row["restart"] = daemon.restart()
    notes.append(f"{row['state']}: before restart {before}; after {counts()}, "
                 f"RSS {daemon.rss_mb():.1f} MB")


# -- the table ---------------------------------------------------------------------------------


def table(rows: list[dict]) -> None:
    empty = rows[0]["p50"]
    print("| state | claim+release p50 (max) ms | ratio to empty | Describe ms (bytes) "
          "| gpuctl status ms | gpuctl status --json ms | daemon RSS MB "
          "| restart to first answer s |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['state']} | {r['p50'] * 1e3:.2f} ({r['max'] * 1e3:.1f}) | "
              f"{r['p50'] / empty:.2f} | {r['describe'] * 1e3:.1f} ({r['describe_bytes']:,}) | "
              f"{r['status'] * 1e3:.0f} | {r['status_json'] * 1e3:.0f} | {r['rss']:.1f} | "
              f"{r['restart']:.2f} |")


def verdicts(rows: list[dict], flat: list[tuple[str, float]]) -> list[str]:
    empty, claims, waiters = rows
    checks = [(f"{r['state']}: claim+release p50 ratio <= {TARGET_RATIO:g}",
               r["p50"] / empty["p50"] <= TARGET_RATIO, f"{r['p50'] / empty['p50']:.2f}")
              for r in (claims, waiters)]
    checks += [(f"{what}: last/first chunk <= {TARGET_FLAT:g}", x <= TARGET_FLAT, f"{x:.2f}")
               for what, x in flat]
    checks += [
        (f"{claims['state']}: RSS < {TARGET_RSS_MB} MB", claims["rss"] < TARGET_RSS_MB,
         f"{claims['rss']:.1f}"),
        (f"{claims['state']}: restart < {TARGET_RESTART_S:g} s",
         claims["restart"] < TARGET_RESTART_S, f"{claims['restart']:.2f}"),
    ]
    checks += [(f"{claims['state']}: {name} < {TARGET_STATUS_MS} ms",
                claims[key] * 1e3 < TARGET_STATUS_MS, f"{claims[key] * 1e3:.0f}")
               for name, key in (("Describe", "describe"), ("gpuctl status", "status"),
                                 ("gpuctl status --json", "status_json"))]
    return [f"  {name}: {value} ({'met' if ok else 'MISSED'})" for name, ok, value in checks]


def run(n: int, w: int, iterations: int, keep: bool = False) -> int:
    workdir = Path(tempfile.mkdtemp(prefix="resourced-scale-", dir=_tmpfs()))
    owner = subprocess.Popen(["sleep", "infinity"])
    bus = PrivateBus().start()
    saved = os.environ.get("DBUS_SESSION_BUS_ADDRESS")
    os.environ["DBUS_SESSION_BUS_ADDRESS"] = bus.address
    daemon = Daemon(bus, workdir, capacity=max(100_000, 2 * n))
    rows, notes, flat = [], [], []
    try:
        daemon.start()
        rows.append(measure(daemon, iterations, "empty"))
        restart(daemon, rows[-1], notes)

        label = f"{n:,} granted pool claims"
        say(f"{label}: filling")
        with Client(bus="session", timeout=CALL_TIMEOUT) as other:
            figures = fill(other, n, "claims", mode="dev", gpus=0, pools={POOL: 1},
                           owner_pid=owner.pid)
        notes.append(fill_line(f"filling {label}", n, figures))
        flat.append(("claims enqueue", figures[2] / figures[1]))
        rows.append(measure(daemon, iterations, label))
        restart(daemon, rows[-1], notes)

        label = f"{w:,} queued waiters"
        say(f"{label}: fresh daemon, filling")
        daemon.fresh()
        with Client(bus="session", timeout=CALL_TIMEOUT) as other:
            other.claim(mode="dev", gpus=GPUS, owner_pid=owner.pid)
            figures = fill(other, w, "waiters", mode="dev", gpus=1, owner_pid=owner.pid,
                           wait=True)
            notes.append(fill_line(f"queueing {label}", w, figures))
            flat.append(("waiters enqueue", figures[2] / figures[1]))
            rows.append(measure(daemon, iterations, label))
            restart(daemon, rows[-1], notes)
        for r in rows:
            notes.append(f"{r['state']}: Ping p50 {r['ping'] * 1e3:.3f} ms through the same client")
        problems = daemon.problems()
    finally:
        daemon.close()
        owner.kill()
        owner.wait(10)
        bus.stop()
        if saved is None:
            os.environ.pop("DBUS_SESSION_BUS_ADDRESS", None)
        else:
            os.environ["DBUS_SESSION_BUS_ADDRESS"] = saved
        if keep:
            say(f"kept {workdir} (config, runtime directory, daemon.log)")
        else:
            shutil.rmtree(workdir, ignore_errors=True)

    print()
    table(rows)
    print()
    for line in notes:
        print(line)
    print("targets:")
    for line in verdicts(rows, flat):
        print(line)
    print(f"daemon log: {len(problems)} problem line(s)")
    for line in problems[:20]:
        print(f"  {line}")
    return 1 if problems else 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--claims", type=int, default=10_000, help="granted pool claims (10000)")
    p.add_argument("--waiters", type=int, default=2_000, help="queued waiters (2000)")
    p.add_argument("--iterations", type=int, default=200,
                   help="timed claim+release rounds per state, after 10%% more as warm-up (200)")
    p.add_argument("--quick", action="store_true", help="--claims 1000 --waiters 200")
    p.add_argument("--keep", action="store_true",
                   help="keep the work folder (config, runtime directory, daemon log)")
    a = p.parse_args()
    if a.quick:
        a.claims, a.waiters = 1000, 200
    if a.claims < 2 or a.waiters < 2 or a.iterations < 1:
        p.error("--claims and --waiters must be at least 2, --iterations at least 1")
    print(f"scale: {a.claims:,} claims, {a.waiters:,} waiters, {a.iterations} claim+release "
          f"rounds per state; {GPUS} simulated GPUs on a private session bus; persistence on")
    print(machine_line(), flush=True)
    start = time.monotonic()
    code = run(a.claims, a.waiters, a.iterations, a.keep)
    print(f"total {time.monotonic() - start:.0f} s")
    return code


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so the finally blocks run
    sys.exit(main())
