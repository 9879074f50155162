"""resourced's booking calendar against GPUBK 0.2.8 (PyPI ``gpubk``, command ``bk``), in the
same run on the same machine, with simulated GPUs, as whole processes.

Measured:

(1) booking one more booking, and listing all bookings, as whole processes (wall time
    from spawn to exit, stdout read through a pipe), with 100, 1,000 and 5,000 future
    bookings already in the calendar; median of --runs runs per point, after one untimed
    warm-up.  Ours: ``python -m resourced.cli book --gpus 1 --for 1h --at ISO`` and
    ``python -m resourced.cli bookings --all --json``.  GPUBK's: ``bk x 1 1h --start ISO``
    (an exclusive booking: the whole GPU, as ``--gpus 1`` is ours; plain ``bk 1 1h`` is a
    shared slot) and ``bk l --json`` (all of this user's active and future reservations;
    the only user here, so everyone's).  Each timed booking goes at a start of its own
    after the last filled hour (GPUBK answers a same-user request for the same window as
    a duplicate without writing), so admission takes the ordinary path, and the list is
    timed before any of them is added.  Aims: ours at 5,000 within 1.2x of ours at 100,
    and at least 5x faster than GPUBK's at 5,000.
(2) ``Book`` through one ``resourced.client.sync.Client`` with 10,000 bookings in the
    calendar: p50 and p90 of --book-n calls (after 20 untimed), each at a free place after
    the last.  Aim: p50 under 5 ms.
(3) the daemon's VmRSS with 0 bookings (after a ping and a listing) and with 10,000
    (after (2)).  Aim: under 80 MB.

The calendars hold one user's 1-hour, 1-GPU bookings over 8 simulated GPUs, 8 per hour
from the first whole hour an hour or more after *now*, so N bookings span N/8 hours; a
fresh calendar per size.

Ours: a private dbus-daemon and the daemon on it (``RESOURCED_SIMULATED_GPUS=8``), with a
config file lifting ``max_bookings_per_user``, ``booking_horizon`` and
``longest_booking``, and the simulated clock at 2026-12-01T09:00:00Z
(``RESOURCED_SIMULATED_CLOCK``, in the daemon's environment and gpuctl's).  Filled through
one ``Client`` (``Book`` with an exact start, sequentially).

GPUBK: its documented quick-evaluation mode, no root, no broker and no GPU: ``BK_DATA_DIR``
(a 0700 folder) holds its ledger, which each ``bk`` process locks, reads, and rewrites
(with a backup copy and an audit line) under ``flock``; ``BK_GPU_COUNT=8`` and
``BK_GPU_SIM_FILE`` (its simulation file: 8 idle 80 GB GPUs, so no NVML or nvidia-smi
probe); ``BK_BOOKING_HORIZON_DAYS=3650``.  Its clock is the wall clock.  Its shared-server
mode (a root-installed broker) routes writes through a socket to a process that runs the
same ledger transaction, and reads the ledger file in the client as here, so this mode is
the cheaper one for it.  GPUBK goes in a virtualenv of its own, named by ``--gpubk`` (its
bin folder or its ``bk``); without it, only ours is measured:

    python3 -m venv /tmp/gpubk-venv && /tmp/gpubk-venv/bin/pip install gpubk==0.2.8

Both sides' processes run with bytecode caching on, in a folder of the run's own
(``PYTHONPYCACHEPREFIX``; ``PYTHONDONTWRITEBYTECODE`` dropped): each compiles its modules
in its warm-up run and loads them cached after, as an installed tool would.

Filling GPUBK: its own code, through its API, is quadratic here (``submit_booking`` scans
and re-checks the whole ledger for each booking: about 5 minutes for 5,000 even in memory),
so the fill writes its ledger directly, in its own format as its own code writes it.  In
one process of its interpreter, ``bk.service.submit_booking`` (what ``bk x 1 1h -g G
--start ISO`` calls) books the first two hours, GPUs 0..7, against a ledger held in memory;
the second hour's records and audit lines are checked to differ from the first's only in
ids, start and end (and when they were written), and the later hours are copies of them
shifted by whole hours with fresh uuid4 ids; the result is checked by its
``validate_ledger_document`` and ``validate_ledger_policy``, and to hold no two bookings
of one GPU at once (its ``find_policy_violations`` takes half a minute at 5,000), and
committed through its ``LedgerStore.transaction`` (journal, ledger, backup, audit log):
one transaction in all, so its audit lines share one transaction id where booking by
booking would have given each its own.  ``bk l --json`` then shows the expected total
before anything is timed.

    python benchmarks/vs_gpubk.py [--gpubk /tmp/gpubk-venv/bin] [--runs 7] [--quick]
"""

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from _harness import _tmpfs, clean_env, machine_line, rss_mb, stop_process, summary, wait_ready

from resourced.client.sync import Client
from resourced.linux.privatebus import PrivateBus

GPUBK_VERSION = "0.2.8"
INSTALL = (f"python3 -m venv /tmp/gpubk-venv && "
           f"/tmp/gpubk-venv/bin/pip install gpubk=={GPUBK_VERSION}")
GPUS = 8
HOUR = 3600
SIM_NOW = "2026-12-01T09:00:00Z"
SIZES = (100, 1000, 5000)
CALENDAR = 10_000
CONFIG = "[daemon]\nmax_bookings_per_user = 0\nbooking_horizon = 0\nlongest_booking = 0\n"
CALL_TIMEOUT = 60.0
CLI_TIMEOUT = 300.0
READY_TIMEOUT = 60.0
WARM_UP_CALLS = 20
AIM_FLAT = 1.2          # ours at the largest size against ours at the smallest
AIM_FASTER = 5.0        # GPUBK's time against ours at the largest size
AIM_BOOK_MS = 5.0
AIM_RSS_MB = 80.0

# Run by GPUBK's interpreter: ``python -c FILL_GPUBK N GPUS FIRST_START``; prints the count.
FILL_GPUBK = r'''
import sys, uuid
from datetime import timedelta
from bk.broker import ledger_store_for_config
from bk.config import load_config
from bk.identity import current_actor
from bk.ledger_schema import validate_ledger_document
from bk.models import MODE_EXCLUSIVE
from bk.policy import validate_ledger_policy
from bk.service import build_gpu_advice, submit_booking
from bk.storage import LedgerStore
from bk.timeparse import parse_iso, to_iso

n, gpus, first = int(sys.argv[1]), int(sys.argv[2]), parse_iso(sys.argv[3])
config = load_config()
store = ledger_store_for_config(config)


class Draft(LedgerStore):
    """GPUBK's own booking code against a ledger in memory: transactions apply, unwritten."""

    def __init__(self):
        super().__init__(config.data_dir)
        self.ledger, self.logs = store.load(), []

    def load(self):
        return self.ledger

    load_read_only = load

    def transaction(self, mutator):
        self.ledger, result, logs, _ = mutator(self.ledger)
        self.logs.extend(logs)
        return result


draft, actor, advice = Draft(), current_actor(), build_gpu_advice(config)
own = min(n, 2 * gpus)
for i in range(own):
    submission = submit_booking(
        config, draft, actor, count=1, duration_seconds=3600, mode=MODE_EXCLUSIVE,
        start_at=first + timedelta(hours=i // gpus), preferred_gpus=[i % gpus],
        allow_queue=False, advice=advice)
    assert submission.result.created, submission.result
records, logs = draft.ledger["reservations"], draft.logs
assert len(records) == len(logs) == own, (len(records), len(logs))
VARIES = {"id", "reservation_id", "op_id", "start_at", "end_at",  # and when written:
          "created_at", "updated_at", "ts"}


def shifted(item, hours, ids):
    out = dict(item)
    for key in ("start_at", "end_at"):
        out[key] = to_iso(parse_iso(item[key]) + timedelta(hours=hours))
    for key in ("id", "reservation_id", "op_id"):
        if key in out:
            out[key] = ids.setdefault(item[key], str(uuid.uuid4()))
    return out


if own == 2 * gpus:  # the second hour is the first shifted by an hour, ids aside
    for items in (records, logs):
        for x, y in zip(items[:gpus], items[gpus:]):
            same = {k for k in x.keys() | y.keys() if x.get(k) != y.get(k)} - VARIES
            assert not same, f"fields besides ids and times differ: {sorted(same)}"
            assert shifted(x, 1, {})["start_at"] == y["start_at"]
for i in range(own, n):
    hours, ids = i // gpus - 1, {}
    records.append(shifted(records[gpus + i % gpus], hours, ids))
    logs.append(shifted(logs[gpus + i % gpus], hours, ids))
validate_ledger_document(draft.ledger)
validate_ledger_policy(draft.ledger, config)
# No overlap (its find_policy_violations says the same, but in quadratic time): each is
# exclusive, one GPU, a whole hour from a whole hour, and no two share a GPU and a start.
places = {(r["mode"], tuple(r["gpus"]), r["start_at"], r["end_at"]) for r in records}
assert len(places) == n and all(
    m == MODE_EXCLUSIVE and len(g) == 1 and parse_iso(e) - parse_iso(s) == timedelta(hours=1)
    and parse_iso(s).minute == parse_iso(s).second == 0 for m, g, s, e in places)
store.transaction(lambda ledger: (draft.ledger, None, draft.logs, True))
print(len(store.load()["reservations"]))
'''


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def iso(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def bytecode_env(env: dict[str, str], workdir: Path) -> dict[str, str]:
    """``env`` with bytecode caching on, in a folder of the run's own: both sides compile
    their modules once (in the warm-up) and load them cached after, as installed, and no
    source tree is written to."""
    env = {k: v for k, v in env.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = str(workdir / "pycache")
    return env


def median(values: list[float]) -> float:
    return summary(values)["p50"]


def timed(cmd: list[str], env: dict[str, str]) -> tuple[float, str]:
    """Wall seconds of one whole process, and its stdout; raises if it failed."""
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=CLI_TIMEOUT,
                          check=False)
    took = time.perf_counter() - t0
    if proc.returncode:
        raise RuntimeError(f"{' '.join(cmd[:4])} ... exited {proc.returncode}: "
                           f"{proc.stderr.strip()[-2000:]}")
    return took, proc.stdout


def whole_process(book, lister, n: int, runs: int, count) -> dict[str, float]:
    """(1) at one size: (median, min, max) seconds of ``lister()`` (timed first) and of
    ``book(k)``, k = 0 the warm-up; the listing is checked (``count(stdout)``) to show ``n`` bookings
    before, and each one booked after."""
    lists, books = [], []
    for k in range(runs + 1):
        took, out = timed(*lister())
        if k == 0:
            check(n, count(out))
        lists.append(took)
    for k in range(runs + 1):
        books.append(timed(*book(k))[0])
    check(n + runs + 1, count(timed(*lister())[1]))
    return {what: (median(times[1:]), min(times[1:]), max(times[1:]))
            for what, times in (("book", books), ("list", lists))}


def check(expected: int, listed: int) -> None:
    if listed != expected:
        raise RuntimeError(f"the listing shows {listed} bookings, not {expected}")


def first_free_hour(n: int) -> int:
    """Hours after the first filled one where the timed bookings start: past the last."""
    return -(-n // GPUS) + 1


# -- ours --------------------------------------------------------------------------------------


class Ours:
    """The daemon on a private bus, a fresh calendar for each ``start()``."""

    def __init__(self, bus: PrivateBus, workdir: Path):
        self.workdir, self.runtime_parent = workdir, _tmpfs()
        self.config = workdir / "resourced.toml"
        self.config.write_text(CONFIG)
        clock = workdir / "clock"
        clock.write_text(SIM_NOW + "\n")
        self.now = datetime.fromisoformat(SIM_NOW)
        self.base_env = {**bytecode_env(clean_env(bus.address), workdir),
                         "RESOURCED_SIMULATED_GPUS": str(GPUS),
                         "RESOURCED_SIMULATED_CLOCK": str(clock)}
        self.env: dict[str, str] = {}
        self.log = open(workdir / "daemon.log", "a+")  # noqa: SIM115 - closed by close()
        self.proc: subprocess.Popen | None = None
        self.runtime_dir: str | None = None
        self.starts = 0

    def start(self) -> None:
        self.stop()
        self.starts += 1
        self.runtime_dir = tempfile.mkdtemp(prefix="resourced-vs-gpubk-", dir=self.runtime_parent)
        state = self.workdir / f"state-{self.starts}"
        self.env = {**self.base_env, "RESOURCED_RUNTIME_DIR": self.runtime_dir,
                    "RESOURCED_STATE_DIR": str(state)}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "resourced.daemon", "--session", "--config", str(self.config)],
            env=self.env, stdout=self.log, stderr=subprocess.STDOUT)
        wait_ready(self.proc, self.log, READY_TIMEOUT)

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc, grace=30)
        if self.runtime_dir:
            shutil.rmtree(self.runtime_dir, ignore_errors=True)
            self.runtime_dir = None

    def close(self) -> None:
        self.stop()
        self.log.close()

    def start_at(self, hour: int) -> datetime:
        return self.now + timedelta(hours=1 + hour)

    def fill(self, client: Client, n: int) -> float:
        """``n`` bookings, 8 an hour; seconds taken."""
        t0 = time.perf_counter()
        base = self.start_at(0).timestamp()
        for i in range(n):
            client.book(HOUR, gpus=1, start=base + (i // GPUS) * HOUR)
        return time.perf_counter() - t0

    def rss_mb(self) -> float:
        return rss_mb(self.proc.pid)

    def problems(self) -> list[str]:
        self.log.flush()
        self.log.seek(0)
        return [line.rstrip() for line in self.log
                if "Traceback" in line or "ERROR" in line or "Error" in line]

    def cli(self, *args: str) -> tuple[list[str], dict[str, str]]:
        return [sys.executable, "-m", "resourced.cli", *args], self.env

    def sizes(self, sizes: list[int], runs: int) -> dict[int, dict[str, float]]:
        out = {}
        for n in sizes:
            self.start()
            with Client(bus="session", timeout=CALL_TIMEOUT) as c:
                say(f"ours: filling {n:,} ({self.fill(c, n):.1f} s); timing")
            free = first_free_hour(n)
            out[n] = whole_process(
                lambda k, free=free: self.cli("book", "--gpus", "1", "--for", "1h",
                                              "--at", iso(self.start_at(free + k))),
                lambda: self.cli("bookings", "--all", "--json"),
                n, runs, lambda text: len(json.loads(text)))
        return out

    def calendar(self, n: int, calls: int) -> dict:
        """(2) and (3)."""
        self.start()
        row: dict = {}
        with Client(bus="session", timeout=CALL_TIMEOUT) as c:
            c.ping()
            c.bookings(all_users=True)
            row["rss0"] = self.rss_mb()
            say(f"ours: filling {n:,} for Book through a Client")
            row["fill"] = self.fill(c, n)
            base = self.start_at(first_free_hour(n)).timestamp()
            samples = []
            for i in range(WARM_UP_CALLS + calls):
                start = base + (i // GPUS) * HOUR
                t0 = time.perf_counter()
                answer = c.book(HOUR, gpus=1, start=start)
                took = time.perf_counter() - t0
                if answer["status"] != "created":
                    raise RuntimeError(f"Book answered {answer['status']}")
                if i >= WARM_UP_CALLS:
                    samples.append(took)
            row["book"] = summary(samples)
            row["count"] = len(c.bookings(all_users=True))
        row["rss"] = self.rss_mb()
        return row


# -- GPUBK -------------------------------------------------------------------------------------


class Gpubk:
    """``bk`` in its quick-evaluation mode: a ledger in a data folder, no broker."""

    def __init__(self, bk: Path, workdir: Path):
        self.bk, self.workdir = bk, workdir
        self.python = gpubk_python(bk)
        sim = workdir / "gpubk-gpus.json"
        sim.write_text(json.dumps({"gpus": [
            {"index": i, "name": "simulated", "memory_total_mb": 81920, "memory_used_mb": 0,
             "utilization_percent": 0} for i in range(GPUS)]}))
        self.base_env = bytecode_env({k: v for k, v in os.environ.items()
                                      if not k.startswith(("BK_", "RESOURCED_", "DBUS_"))},
                                     workdir)
        self.base_env.update(BK_GPU_COUNT=str(GPUS), BK_GPU_SIM_FILE=str(sim),
                             BK_BOOKING_HORIZON_DAYS="3650")
        self.env: dict[str, str] = {}
        now = datetime.now(UTC)  # its clock is the wall clock
        self.first = now.replace(minute=0, second=0, microsecond=0) + timedelta(hours=2)

    def start_at(self, hour: int) -> datetime:
        return self.first + timedelta(hours=hour)

    def fill(self, n: int) -> float:
        data = self.workdir / f"gpubk-{n}"
        data.mkdir(mode=0o700)
        self.env = {**self.base_env, "BK_DATA_DIR": str(data)}
        t0 = time.perf_counter()
        proc = subprocess.run([self.python, "-c", FILL_GPUBK, str(n), str(GPUS),
                               iso(self.first)],
                              env=self.env, capture_output=True, text=True, timeout=CLI_TIMEOUT,
                              check=False)
        if proc.returncode or proc.stdout.strip() != str(n):
            raise RuntimeError(f"filling GPUBK's ledger failed ({proc.returncode}): "
                               f"{proc.stdout.strip()} {proc.stderr.strip()[-2000:]}")
        return time.perf_counter() - t0

    def cmd(self, *args: str) -> tuple[list[str], dict[str, str]]:
        return [str(self.bk), *args], self.env

    def sizes(self, sizes: list[int], runs: int) -> dict[int, dict[str, float]]:
        out = {}
        for n in sizes:
            say(f"GPUBK: filling {n:,} ({self.fill(n):.1f} s); timing")
            free = first_free_hour(n)
            out[n] = whole_process(
                lambda k, free=free: self.cmd("x", "1", "1h", "--start",
                                              iso(self.start_at(free + k))),
                lambda: self.cmd("l", "--json"),
                n, runs, lambda text: json.loads(text)["total"])
        return out


def gpubk_python(bk: Path) -> str:
    """The interpreter of GPUBK's virtualenv: next to ``bk``, else its ``#!`` line."""
    beside = bk.with_name("python")
    if beside.exists():
        return str(beside)
    first = bk.read_text(errors="replace").splitlines()[0]
    if first.startswith("#!"):
        return first[2:].strip().split()[0]
    raise RuntimeError(f"cannot tell which interpreter runs {bk}")


def find_gpubk(given: str) -> Path:
    """``bk`` from ``--gpubk``: its virtualenv's bin folder, or itself."""
    path = Path(given)
    bk = path / "bk" if path.is_dir() else path
    if not bk.is_file():
        raise RuntimeError(f"no bk at {bk}")
    version = subprocess.run([str(bk), "--version"], capture_output=True, text=True,
                             timeout=60, check=False).stdout.strip()
    if version != f"bk {GPUBK_VERSION}":
        say(f"warning: {bk} says {version!r}, not bk {GPUBK_VERSION}")
    return bk


# -- the report --------------------------------------------------------------------------------


def startup_ms(python: str, env: dict[str, str]) -> float:
    """Median wall ms of ``python -c pass``: what any whole process pays first."""
    return median([timed([python, "-c", "pass"], env)[0] for _ in range(8)][1:]) * 1e3


def cell(figures: tuple[float, float, float]) -> str:
    middle, low, high = (x * 1e3 for x in figures)
    return f"{middle:.0f} ({low:.0f}-{high:.0f})"


def report(args, ours: dict, theirs: dict | None, why: str, cal: dict, notes: list[str]) -> None:
    small, big = args.sizes[0], args.sizes[-1]
    print(f"\n(1) whole process, ms: median (min-max) of {args.runs} runs; {GPUS} simulated "
          f"GPUs, 1-hour 1-GPU bookings, 8 an hour")
    head = ["bookings", "ours: book", "ours: list"]
    if theirs:
        head += ["GPUBK: book", "GPUBK: list", "GPUBK/ours: book", "GPUBK/ours: list"]
    rows = [head]
    for n in args.sizes:
        row = [f"{n:,}", cell(ours[n]["book"]), cell(ours[n]["list"])]
        if theirs:
            row += [cell(theirs[n]["book"]), cell(theirs[n]["list"]),
                    f"{theirs[n]['book'][0] / ours[n]['book'][0]:.1f}x",
                    f"{theirs[n]['list'][0] / ours[n]['list'][0]:.1f}x"]
        rows.append(row)
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    print("| " + " | ".join(c.ljust(w) for c, w in zip(head, widths)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for row in rows[1:]:
        print("| " + " | ".join(c.rjust(w) for c, w in zip(row, widths)) + " |")
    if not theirs:
        print(f"GPUBK's figures are missing: {why}")

    checks = []
    for what in ("book", "list"):
        ratio = ours[big][what][0] / ours[small][what][0]
        checks.append((f"ours {what} at {big:,} / ours at {small:,} <= {AIM_FLAT:g}",
                       ratio <= AIM_FLAT, f"{ratio:.2f}x"))
    for what in ("book", "list"):
        name = f"GPUBK {what} / ours at {big:,} >= {AIM_FASTER:g}"
        if not theirs:
            checks.append((name, None, "-"))
            continue
        ratio = theirs[big][what][0] / ours[big][what][0]
        checks.append((name, ratio >= AIM_FASTER, f"{ratio:.1f}x"))
    book = cal["book"]
    print(f"\n(2) Book through one Client with {args.calendar:,} bookings in the calendar "
          f"({book['n']} calls after {WARM_UP_CALLS}): p50 {book['p50'] * 1e3:.2f} ms, "
          f"p90 {book['p90'] * 1e3:.2f} ms, p99 {book['p99'] * 1e3:.2f} ms; filling took "
          f"{cal['fill']:.1f} s "
          f"({args.calendar / cal['fill']:.0f}/s)")
    print(f"(3) daemon VmRSS: {cal['rss0']:.1f} MB with 0 bookings, {cal['rss']:.1f} MB with "
          f"{cal['count']:,}")
    checks.append((f"Book p50 at {args.calendar:,} < {AIM_BOOK_MS:g} ms",
                   book["p50"] * 1e3 < AIM_BOOK_MS, f"{book['p50'] * 1e3:.2f} ms"))
    checks.append((f"daemon RSS at {args.calendar:,} < {AIM_RSS_MB:g} MB",
                   cal["rss"] < AIM_RSS_MB, f"{cal['rss']:.1f} MB"))
    print("\naims:")
    for name, ok, value in checks:
        verdict = "not measured" if ok is None else "met" if ok else "MISSED"
        print(f"  {name}: {value} ({verdict})")
    for line in notes:
        print(line)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gpubk", metavar="PATH",
                   help="GPUBK's virtualenv bin folder or its bk (without: ours only)")
    p.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")],
                   default=list(SIZES), help="calendar sizes for (1) (100,1000,5000)")
    p.add_argument("--runs", type=int, default=7, help="timed runs per point in (1) (7)")
    p.add_argument("--calendar", type=int, default=CALENDAR,
                   help="bookings in the calendar for (2) and (3) (10000)")
    p.add_argument("--book-n", type=int, default=200, help="timed Book calls in (2) (200)")
    p.add_argument("--quick", action="store_true",
                   help="--sizes 100,1000 --runs 3 --calendar 2000 --book-n 50")
    p.add_argument("--keep", action="store_true", help="keep the work folder")
    args = p.parse_args()
    if args.quick:
        args.sizes, args.runs, args.calendar, args.book_n = [100, 1000], 3, 2000, 50
    if len(args.sizes) < 2 or min(args.sizes) < 1 or args.runs < 1 or args.book_n < 1:
        p.error("--sizes needs two sizes or more, each at least 1; --runs and --book-n >= 1")
    args.sizes.sort()

    print(f"resourced vs GPUBK {GPUBK_VERSION}: calendar sizes {args.sizes}, {args.runs} runs "
          f"per point; Book at {args.calendar:,}")
    print(machine_line(), flush=True)
    started = time.monotonic()
    workdir = Path(tempfile.mkdtemp(prefix="resourced-vs-gpubk-"))
    bus = PrivateBus().start()
    saved = os.environ.get("DBUS_SESSION_BUS_ADDRESS")
    os.environ["DBUS_SESSION_BUS_ADDRESS"] = bus.address
    os.environ.pop("RESOURCED_BUS", None)
    ours_daemon = Ours(bus, workdir)
    theirs, why, notes = None, f"no --gpubk given ({INSTALL})", []
    try:
        ours = ours_daemon.sizes(args.sizes, args.runs)
        cal = ours_daemon.calendar(args.calendar, args.book_n)
        ours_daemon.stop()
        problems = ours_daemon.problems()
        notes.append(f"\ninterpreter start alone (python -c pass): ours "
                     f"{startup_ms(sys.executable, ours_daemon.base_env):.0f} ms")
        if args.gpubk:
            try:
                side = Gpubk(find_gpubk(args.gpubk), workdir)
                theirs = side.sizes(args.sizes, args.runs)
                notes[-1] += f", GPUBK's {startup_ms(side.python, side.base_env):.0f} ms"
                notes.append(f"GPUBK: {side.bk}, BK_DATA_DIR under {workdir} "
                             f"({fs_type(workdir)}), the wall clock")
            except (OSError, RuntimeError, subprocess.SubprocessError, ValueError,
                    KeyError) as exc:
                why = f"{type(exc).__name__}: {exc}"
                theirs = None
        notes.append(f"ours: state directory under {workdir} ({fs_type(workdir)}), runtime "
                     f"directory under {ours_daemon.runtime_parent or tempfile.gettempdir()}, "
                     f"simulated clock {SIM_NOW}")
    finally:
        ours_daemon.close()
        bus.stop()
        if saved is None:
            os.environ.pop("DBUS_SESSION_BUS_ADDRESS", None)
        else:
            os.environ["DBUS_SESSION_BUS_ADDRESS"] = saved
        if args.keep:
            say(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    report(args, ours, theirs, why, cal, notes)
    print(f"daemon log: {len(problems)} problem line(s)")
    for line in problems[:20]:
        print(f"  {line}")
    print(f"total {time.monotonic() - started:.0f} s")
    return 1 if problems else 0


def fs_type(path: Path) -> str:
    """The type of the filesystem holding ``path`` (from /proc/mounts), e.g. ext4, tmpfs."""
    best, kind = "", "unknown"
    try:
        mounts = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return kind
    real = os.path.realpath(path)
    for line in mounts:
        fields = line.split()
        if len(fields) < 3 or len(fields[1]) < len(best):
            continue
        if real == fields[1] or real.startswith(fields[1].rstrip("/") + "/"):
            best, kind = fields[1], fields[2]
    return kind


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so the finally blocks run
    sys.exit(main())
