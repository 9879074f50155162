"""Pools, the fair priority queue, VRAM shares and reclaim, end to end.

A real daemon on the private bus with a pool ``slots`` of capacity 2 (and a ``cpu`` pool of
8, so the figures do not depend on the machine); clients are real processes (``gpuctl``,
Python workers) or threads of this one.  Every wait is bounded: waiters carry a queue
timeout, subprocesses a ``wait(timeout)``, conditions ``eventually``.
"""

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import deque

import pytest
from jeepney import DBusAddress, MatchRule, new_method_call
from jeepney.bus_messages import message_bus
from jeepney.io.blocking import open_dbus_connection
from jeepney.low_level import HeaderFields

from resourced.client.aio import AsyncClient
from resourced.client.sync import Client
from resourced.errors import NoSuchClaim, QueueTimeout

from ..conftest import eventually, gpuctl
from .forgery import forge

NAME = "org.resourced"
SLOTS_PATH = "/org/resourced/pool/slots"
CLAIM_IFACE = "org.resourced.Claim"
POOL_IFACE = "org.resourced.Pool"
GPU_IFACE = "org.resourced.GPU"
PROPERTIES = "org.freedesktop.DBus.Properties"
PEER = DBusAddress("/org/resourced", bus_name=NAME, interface="org.freedesktop.DBus.Peer")
G = 1024**3

CONFIG = """
[[pool]]
name = "slots"
capacity = 2

[[pool]]
name = "cpu"
capacity = 8
"""

# A worker for the contention test: says "ready", waits for a line on stdin, then for
# SECONDS takes one slot, holds it HOLD seconds, gives it back; prints its hold spans
# (monotonic, system-wide on Linux) as JSON.  A span is measured inside the daemon's
# grant: after acquire() returned, before release() was sent.
WORKER = r"""
import json, sys, time
from resourced.client.sync import Client
hold, seconds = float(sys.argv[1]), float(sys.argv[2])
spans = []
with Client(timeout=10) as c:
    c.ping()
    print("ready", flush=True)
    sys.stdin.readline()
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        with c.acquire(pools={"slots": 1}, timeout=20):
            t0 = time.monotonic()
            time.sleep(hold)
            t1 = time.monotonic()
        spans.append((t0, t1))
print(json.dumps(spans), flush=True)
"""

# Takes SLOTS slots as a lease (waiting up to 10 s), prints the lease's reference, sleeps.
HOLDER = r"""
import sys, time
from resourced.client.sync import Client
c = Client()
lease = c.acquire(pools={"slots": int(sys.argv[1])}, priority=int(sys.argv[2]), timeout=10)
print(lease.ref, flush=True)
time.sleep(60)
"""

# Starts HOLDER as its child and never reaps it: once killed, the child stays a zombie.
NEGLECTFUL_PARENT = r"""
import subprocess, sys, time
subprocess.Popen([sys.executable, "-c", sys.argv[1], "1", "0"])
time.sleep(60)
"""

# Traps SIGUSR1 (writes DIR/reclaimed, exits 0); DIR/pid says the handler is in place.
RECLAIM_TRAP = r"""
import os, pathlib, signal, sys, time
d = pathlib.Path(sys.argv[1])
def asked_back(*_):
    (d / "reclaimed").write_text(str(time.monotonic()))
    sys.exit(0)
signal.signal(signal.SIGUSR1, asked_back)
(d / "pid.tmp").write_text(str(os.getpid()))
os.replace(d / "pid.tmp", d / "pid")
deadline = time.monotonic() + 20
while time.monotonic() < deadline:
    time.sleep(0.01)
sys.exit(1)
"""


# -- helpers -----------------------------------------------------------------------------
@pytest.fixture
def pools_daemon(start_daemon, tmp_path):
    """A daemon on 3 idle simulated 80G GPUs with the pools slots=2 and cpu=8."""
    config = tmp_path / "config.toml"
    config.write_text(CONFIG)
    return start_daemon(gpus="3", args=["--config", str(config)])


def status() -> dict:
    with Client() as c:
        return c.status()


def pool(name: str = "slots") -> dict:
    return next(p for p in status()["pools"] if p["name"] == name)


def queue() -> list[dict]:
    """The waiting claims, in the order they will be served."""
    data = status()
    claims = {c["id"]: c for c in data["claims"]}
    return [claims[ref] for ref in data["queue"]]


def claim_state(ref: str) -> str | None:
    return next((c["state"] for c in status()["claims"] if c["id"] == ref), None)


def queued_labels() -> list[str]:
    return [c["label"] for c in queue()]


def gpuctl_queue_labels() -> list[str]:
    r = gpuctl("queue", "--json")
    assert r.returncode == 0, r.stderr
    return [c["label"] for c in json.loads(r.stdout)]


def get_property(path: str, interface: str, name: str):
    conn = open_dbus_connection("SESSION")
    try:
        props = DBusAddress(path, bus_name=NAME, interface=PROPERTIES)
        reply = conn.send_and_get_reply(new_method_call(props, "Get", "ss", (interface, name)),
                                        timeout=5)
        return reply.body[0][1]
    finally:
        conn.close()


def hold_slots(client: Client, n: int = 2, **kwargs) -> str:
    """A development claim of ``n`` slots owned by this (long-lived) test process."""
    return client.claim(mode="dev", gpus=0, pools={"slots": n}, owner_pid=os.getpid(),
                        **kwargs)["allocation"]["ref"]


def spawn(*argv: str, **kwargs) -> subprocess.Popen:
    return subprocess.Popen(list(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, **kwargs)


def spawn_gpuctl(*args: str, **kwargs) -> subprocess.Popen:
    return spawn(sys.executable, "-m", "resourced.cli", *args, **kwargs)


def read_line(proc: subprocess.Popen, timeout: float = 10.0) -> str:
    """One line of ``proc``'s stdout, or fail after ``timeout`` seconds."""
    out: list[str] = []
    reader = threading.Thread(target=lambda: out.append(proc.stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout)
    if not out or not out[0]:
        proc.kill()
        raise AssertionError(f"no line from {proc.args[:3]} within {timeout}s: "
                             f"{proc.stderr.read() if proc.poll() is not None else ''}")
    return out[0].strip()


def kill_all(*procs: subprocess.Popen) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait(10)


def proc_state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0].decode()
    except FileNotFoundError:
        return "gone"


class BusWatch:
    """Records every signal the daemon emits on one object path, from a thread."""

    def __init__(self, path: str):
        self.path = path
        self.conn = open_dbus_connection("SESSION")
        self._handle = self.conn.filter(MatchRule(type="signal", path=path), bufsize=100_000)
        self.conn.filter(MatchRule(type="method_return"), queue=self._handle.queue)
        self.conn.send_and_get_reply(
            message_bus.AddMatch(MatchRule(type="signal", sender=NAME, path=path)), timeout=5)
        self.signals: list[tuple[float, str, str, tuple]] = []  # (when, interface, member, body)
        self._answered: set[int] = set()  # serials of our pings the daemon answered
        self._pings = 1 << 20
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        queue: deque = self._handle.queue
        while not self._stop.is_set():
            try:
                msg = self.conn.recv_until_filtered(queue, timeout=0.05)
            except TimeoutError:
                continue
            except OSError:
                return
            fields = msg.header.fields
            if HeaderFields.reply_serial in fields:
                self._answered.add(fields[HeaderFields.reply_serial])
                continue
            self.signals.append((time.monotonic(), fields.get(HeaderFields.interface),
                                 fields.get(HeaderFields.member), msg.body))

    def settled(self) -> None:
        """Wait until every signal the daemon sent before now is recorded: the daemon
        answers a ping on this connection after them."""
        self._pings += 1
        serial = self._pings
        self.conn.send(new_method_call(PEER, "Ping"), serial=serial)
        eventually(lambda: serial in self._answered, what="the daemon's answer to a ping")

    def members(self, interface: str = CLAIM_IFACE) -> list[tuple]:
        return [(member, body) for _, iface, member, body in self.signals if iface == interface]

    def changed(self, name: str) -> list[tuple[float, object]]:
        """(when, value) of every PropertiesChanged of ``name``."""
        return [(when, body[1][name][1]) for when, iface, member, body in list(self.signals)
                if iface == PROPERTIES and member == "PropertiesChanged" and name in body[1]]

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.conn.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Waiter(threading.Thread):
    """A request that waits (a development claim of this process), served in a thread."""

    def __init__(self, slots: int = 1, priority: int = 0, label: str = "", timeout: float = 15):
        super().__init__(daemon=True)
        self.kwargs = {"mode": "dev", "gpus": 0, "pools": {"slots": slots},
                       "priority": priority, "label": label, "wait": True,
                       "timeout": timeout, "owner_pid": os.getpid()}
        self.result: dict | None = None
        self.error: BaseException | None = None
        self.start()

    def run(self):
        try:
            with Client() as c:
                self.result = c.claim(**self.kwargs)
        except BaseException as exc:  # noqa: BLE001 - the test looks at it
            self.error = exc

    @property
    def granted(self) -> bool:
        return self.result is not None

    @property
    def ref(self) -> str:
        return self.result["allocation"]["ref"]

    def outcome(self, timeout: float = 15) -> "Waiter":
        self.join(timeout)
        assert not self.is_alive(), "the waiter is still waiting"
        return self


def max_overlap(spans: list[tuple[float, float]]) -> int:
    """The most spans open at any one instant (an end before a start at the same time)."""
    events = sorted([(t0, 1) for t0, _ in spans] + [(t1, -1) for _, t1 in spans])
    now = most = 0
    for _, step in events:
        now += step
        most = max(most, now)
    return most


# -- contention ----------------------------------------------------------------------------
def test_eight_processes_contending_for_two_slots(pools_daemon):
    """Never more than 2 held at once, Free never out of [0, 2], everyone finishes, fairly."""
    workers = [spawn(sys.executable, "-c", WORKER, "0.01", "3", stdin=subprocess.PIPE)
               for _ in range(8)]
    try:
        with BusWatch(SLOTS_PATH) as watch:
            for w in workers:
                assert read_line(w, 15) == "ready"
            for w in workers:
                w.stdin.write("go\n")
                w.stdin.flush()
            outputs = [w.communicate(timeout=30) for w in workers]
            eventually(lambda: watch.changed("Free") and watch.changed("Free")[-1][1] == 2)
            frees = [v for _, v in watch.changed("Free")]
    finally:
        kill_all(*workers)

    assert [w.returncode for w in workers] == [0] * 8, [err for _, err in outputs]
    spans = [json.loads(out) for out, _ in outputs]
    counts = sorted(len(s) for s in spans)
    every = [span for s in spans for span in s]
    print(f"grants per process: {counts}, {len(every)} in all")
    assert max_overlap(every) == 2  # contended, and never beyond the capacity
    assert frees and set(frees) <= {0, 1, 2}, frees
    assert 0 in frees
    assert counts[0] >= 5, counts
    assert counts[-1] <= 2 * counts[0], f"unfair: grants per process {counts}"
    assert pool()["free"] == 2 and status()["queue"] == []


# -- the queue's order -----------------------------------------------------------------------
def test_priority_first_then_fifo_among_equals(pools_daemon, tmp_path):
    log = tmp_path / "order"
    with Client() as c:
        holder = hold_slots(c, 2)
    waiters = []
    try:
        for label, priority in (("a", 5), ("b", 1), ("c", 5), ("d", 3)):
            waiters.append(spawn_gpuctl(
                "run", "--pool", "slots=2", "--priority", str(priority), "--wait",
                "--timeout", "20s", "--label", label, "--",
                "sh", "-c", f"echo {label} >> {log}"))
            eventually(lambda label=label: label in gpuctl_queue_labels(), timeout=10)

        r = gpuctl("queue", "--json")
        assert r.returncode == 0, r.stderr
        listed = json.loads(r.stdout)
        assert [(c["label"], c["priority"]) for c in listed] == [
            ("a", 5), ("c", 5), ("d", 3), ("b", 1)]
        for c in listed:
            assert (c["state"], c["pools"], c["gpus_requested"], c["vram_bytes"]) == (
                "queued", {"slots": 2}, 0, 0)
        text = gpuctl("queue")
        assert text.returncode == 0 and "slots 2" in text.stdout, text

        r = gpuctl("status", "--json")
        assert r.returncode == 0, r.stderr
        slots = next(p for p in json.loads(r.stdout)["pools"] if p["name"] == "slots")
        assert (slots["capacity"], slots["free"], slots["unit"]) == (2, 0, "count")

        with Client() as c:
            c.release(holder)
        codes = [w.wait(30) for w in waiters]
    finally:
        kill_all(*waiters)

    assert codes == [0, 0, 0, 0], [w.stderr.read() for w in waiters]
    assert log.read_text().split() == ["a", "c", "d", "b"]
    assert status()["queue"] == [] and pool()["free"] == 2


def test_a_large_waiter_is_not_starved_by_small_ones(pools_daemon):
    with Client() as c:
        first, second = hold_slots(c, 1), hold_slots(c, 1)
        large = Waiter(slots=2, label="large")
        eventually(lambda: queued_labels() == ["large"])
        small = [Waiter(slots=1, label="small1")]
        eventually(lambda: queued_labels() == ["large", "small1"])
        small.append(Waiter(slots=1, label="small2"))
        eventually(lambda: queued_labels() == ["large", "small1", "small2"])

        c.release(first)  # one slot frees: it is the large waiter's, not the small ones'
        assert queued_labels() == ["large", "small1", "small2"]
        assert pool()["free"] == 1
        assert c.try_acquire(pools={"slots": 1}) is None  # nor can a newcomer take it

        c.release(second)  # both free: the large one goes first
        assert large.outcome().granted, large.error
        assert queued_labels() == ["small1", "small2"]  # (the release served the queue)
        assert not any(w.granted for w in small)

        c.release(large.ref)
        for w in small:
            assert w.outcome().granted, w.error
        for w in small:
            c.release(w.ref)
    assert pool()["free"] == 2


# -- holders that die ------------------------------------------------------------------------
def wait_free(watch: BusWatch, value: int, timeout: float) -> float:
    """When the pool's Free was first announced as ``value``; fail after ``timeout``."""
    def announced():
        return next((when for when, v in watch.changed("Free") if v == value), None)
    return eventually(announced, timeout=timeout, interval=0.005)


def test_a_sigkilled_holder_is_freed_within_a_second(pools_daemon):
    holder = spawn(sys.executable, "-c", HOLDER, "1", "0")
    try:
        ref = read_line(holder)
        assert claim_state(ref) == "granted" and pool()["free"] == 1
        with BusWatch(SLOTS_PATH) as watch:  # passive: no call reaches the daemon meanwhile
            killed = time.monotonic()
            holder.kill()
            holder.wait(5)
            freed = wait_free(watch, 2, timeout=5)
    finally:
        kill_all(holder)
    print(f"SIGKILLed holder freed after {(freed - killed) * 1e3:.1f} ms")
    assert freed - killed < 1.0
    assert claim_state(ref) is None


def test_a_zombie_holder_is_freed_too(pools_daemon):
    parent = spawn(sys.executable, "-c", NEGLECTFUL_PARENT, HOLDER)
    try:
        ref = read_line(parent)
        [claim] = status()["claims"]
        assert claim["id"] == ref
        child = claim["owner_pid"]
        assert child != parent.pid
        with BusWatch(SLOTS_PATH) as watch:
            killed = time.monotonic()
            os.kill(child, signal.SIGKILL)
            freed = wait_free(watch, 2, timeout=5)
        assert proc_state(child) == "Z"  # not reaped: its parent neglects it
    finally:
        kill_all(parent)
    print(f"zombie holder freed after {(freed - killed) * 1e3:.1f} ms")
    assert freed - killed < 1.0
    assert claim_state(ref) is None


# -- leaving the queue -------------------------------------------------------------------------
def test_a_queue_timeout_exits_11_and_leaves_no_entry(pools_daemon, tmp_path):
    marker = tmp_path / "ran"
    with Client() as c:
        hold_slots(c, 2)
    started = time.monotonic()
    r = gpuctl("run", "--pool", "slots=1", "--wait", "--timeout", "1s", "--",
               "touch", str(marker), timeout=15)
    elapsed = time.monotonic() - started
    assert r.returncode == 11, r.stderr
    assert r.stderr.startswith("gpuctl: ") and "Traceback" not in r.stderr
    assert 1.0 <= elapsed < 10
    assert not marker.exists()
    assert status()["queue"] == []
    assert len(status()["claims"]) == 1


def test_ctrl_c_while_waiting_exits_130_and_leaves_no_entry(pools_daemon, tmp_path):
    marker = tmp_path / "ran"
    with Client() as c:
        hold_slots(c, 2)
    waiter = spawn_gpuctl("run", "--pool", "slots=1", "--wait", "--timeout", "20s", "--",
                          "touch", str(marker))
    try:
        eventually(lambda: len(queue()) == 1, timeout=10)
        waiter.send_signal(signal.SIGINT)
        try:
            code = waiter.wait(3)
        except subprocess.TimeoutExpired:
            code = "still waiting 3 s after SIGINT"
    finally:
        kill_all(waiter)
    assert code == 130, waiter.stderr.read()
    eventually(lambda: status()["queue"] == [], timeout=2)
    assert not marker.exists()


def test_keyboard_interrupt_in_acquire_leaves_no_entry(pools_daemon):
    with Client() as c:
        hold_slots(c, 2)
    waiter = spawn(sys.executable, "-c", HOLDER, "1", "0")
    try:
        eventually(lambda: len(queue()) == 1, timeout=10)
        waiter.send_signal(signal.SIGINT)
        waiter.wait(5)
    finally:
        kill_all(waiter)
    assert "KeyboardInterrupt" in waiter.stderr.read()
    eventually(lambda: status()["queue"] == [], timeout=2)


@pytest.mark.parametrize("how", ["gpuctl run --wait", "Client.acquire"])
def test_a_sigkilled_waiter_leaves_no_entry(pools_daemon, tmp_path, how):
    with Client() as c:
        hold_slots(c, 2)
    if how == "Client.acquire":
        waiter = spawn(sys.executable, "-c", HOLDER, "1", "0")
    else:
        waiter = spawn_gpuctl("run", "--pool", "slots=1", "--wait", "--timeout", "20s", "--",
                              "touch", str(tmp_path / "ran"))
    try:
        eventually(lambda: len(queue()) == 1, timeout=10)
        waiter.kill()
        waiter.wait(5)
        eventually(lambda: status()["queue"] == [], timeout=2)
    finally:
        kill_all(waiter)
    assert not (tmp_path / "ran").exists()
    assert len(status()["claims"]) == 1


@pytest.mark.parametrize("pool_arg, code, words", [
    ("nosuch=1", 2, "no pool 'nosuch'"),
    ("slots=3", 3, "the pool holds 2"),
], ids=["unknown-pool", "over-capacity"])
@pytest.mark.parametrize("command", ["run", "claim"])
def test_impossible_requests_fail_at_once_even_with_wait(pools_daemon, tmp_path, pool_arg,
                                                         code, words, command):
    args = (["run", "--pool", pool_arg, "--wait", "--", "touch", str(tmp_path / "ran")]
            if command == "run" else
            ["claim", "--pool", pool_arg, "--wait", "--owner-pid", str(os.getpid())])
    started = time.monotonic()
    r = gpuctl(*args, timeout=10)  # a request that waited would time out here
    assert r.returncode == code, r.stderr
    assert time.monotonic() - started < 5
    assert words in r.stderr and "Traceback" not in r.stderr
    assert status()["claims"] == [] and status()["queue"] == []


# -- VRAM shares and the environment ------------------------------------------------------------
def claim_vram(amount: str) -> dict:
    r = gpuctl("claim", "--vram", amount, "--owner-pid", str(os.getpid()), "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["allocation"]


def test_vram_shares_pack_one_gpu_and_whole_claims_avoid_shared_gpus(pools_daemon):
    first, second = claim_vram("30G"), claim_vram("30G")
    assert first["gpu_uuids"] == second["gpu_uuids"] and len(first["gpu_uuids"]) == 1
    [shared] = first["gpu_uuids"]
    gpus = {g["uuid"]: g for g in status()["gpus"]}
    assert gpus[shared]["state"] == "shared"
    assert gpus[shared]["vram_used_bytes"] == 60 * G
    assert sorted(gpus[shared]["shared_by"]) == sorted([first["ref"], second["ref"]])
    path = f"/org/resourced/gpu/{gpus[shared]['index']}"
    assert get_property(path, GPU_IFACE, "VRAMUsedBytes") == 60 * G
    assert get_property(path, GPU_IFACE, "State") == "shared"

    third = claim_vram("30G")  # 20G left there: another GPU
    assert third["gpu_uuids"] != [shared]
    [other] = third["gpu_uuids"]

    r = gpuctl("claim", "--gpus", "1", "--owner-pid", str(os.getpid()), "--json")
    assert r.returncode == 0, r.stderr
    whole = json.loads(r.stdout)["allocation"]["gpu_uuids"]
    assert whole and set(whole).isdisjoint({shared, other})

    r = gpuctl("claim", "--gpus", "1", "--owner-pid", str(os.getpid()))
    assert r.returncode == 3, r.stderr  # only shared GPUs are left
    assert status()["gpus"][gpus[shared]["index"]]["vram_used_bytes"] == 60 * G


def env_of(*options: str) -> dict[str, str]:
    r = gpuctl("run", *options, "--", "env")
    assert r.returncode == 0, r.stderr
    return dict(line.split("=", 1) for line in r.stdout.splitlines() if "=" in line)


def test_the_commands_environment_says_what_it_was_granted(pools_daemon):
    env = env_of("--vram", "20G")
    assert env["RESOURCED_VRAM_BYTES"] == str(20 * G)
    assert env["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.25"  # of an 80G GPU
    assert env["TF_FORCE_GPU_ALLOW_GROWTH"] == "true"
    assert len(env["CUDA_VISIBLE_DEVICES"].split(",")) == 1
    assert env["CUDA_VISIBLE_DEVICES"] == env["RESOURCED_GPU_UUIDS"]

    env = env_of("--pool", "slots=1", "--cpu", "2")
    assert env["CUDA_VISIBLE_DEVICES"] == ""
    assert env["RESOURCED_POOLS"] == "cpu=2,slots=1"
    assert env["OMP_NUM_THREADS"] == env["MKL_NUM_THREADS"] == "2"
    assert "RESOURCED_VRAM_BYTES" not in env
    eventually(lambda: status()["claims"] == [])


# -- reclaim --------------------------------------------------------------------------------------
def claim_watch(ref: str) -> BusWatch:
    return BusWatch(f"/org/resourced/claim/{ref}")


def test_a_higher_priority_waiter_asks_a_reclaimable_lease_back(pools_daemon):
    with Client() as c:
        lease = c.acquire(pools={"slots": 2}, reclaimable=True)  # priority 0
        with claim_watch(lease.ref) as watch:
            assert lease.reclaim_requested is False
            waiter = Waiter(slots=2, priority=5, label="urgent")
            eventually(lambda: lease.reclaim_requested)
            [waiting] = queue()
            eventually(lambda: ("ReclaimRequested", (waiting["id"], 5)) in watch.members())
            assert [v for _, v in watch.changed("ReclaimRequested")] == [True]
            assert [c_["reclaim_requested"] for c_ in status()["claims"]
                    if c_["id"] == lease.ref] == [True]

            # Others arriving meanwhile: neither a newcomer nor an equal waiter behind it
            # gets what the lease gives back.
            assert c.try_acquire(pools={"slots": 1}, priority=5) is None
            third = Waiter(slots=1, priority=5, label="third")
            eventually(lambda: queued_labels() == ["urgent", "third"])

            lease.release()
            assert waiter.outcome().granted, waiter.error
            assert queued_labels() == ["third"] and not third.granted
            watch.settled()
            assert ("ReclaimWithdrawn", ()) not in watch.members()
        c.release(waiter.ref)
        assert third.outcome().granted, third.error
        c.release(third.ref)


def test_an_equal_priority_waiter_does_not_ask_back(pools_daemon):
    with Client() as c:
        lease = c.acquire(pools={"slots": 2}, priority=3, reclaimable=True)
        with claim_watch(lease.ref) as watch:
            waiter = Waiter(slots=1, priority=3, timeout=10)
            eventually(lambda: len(queue()) == 1)
            watch.settled()  # what queueing the waiter signalled, if anything
            assert lease.reclaim_requested is False
            assert watch.members() == [] and watch.changed("ReclaimRequested") == []
            lease.release()
            assert waiter.outcome().granted, waiter.error
        c.release(waiter.ref)


def test_a_waiters_outcome_is_sent_to_the_connection_that_asked_alone(pools_daemon):
    """No match rule, no second call: the waiter's ``Granted`` is addressed to it, so a
    stranger watching the claim's path sees its state change but not the grant."""
    with Client() as c:
        held = hold_slots(c, 2)
        waiter = Waiter(slots=1)
        [waiting] = eventually(queue)
        with claim_watch(waiting["id"]) as watch:
            c.release(held)
            assert waiter.outcome().granted, waiter.error
            eventually(lambda: watch.changed("State"), what="the stranger's PropertiesChanged")
            assert [m for m, _ in watch.members()] == []
        assert waiter.ref == waiting["id"]
        c.release(waiter.ref)


def test_a_waiter_is_granted_and_cancelled_by_the_daemon_alone(daemon, owner):
    """A Granted or Cancelled that another connection sends the waiter (anyone may) is not
    its outcome: it goes on waiting, with its place reported, for the daemon's grant."""
    places, found = [], {}
    with Client() as holder:
        held = holder.claim(gpus=4, owner_pid=owner.pid)["allocation"]["ref"]

        def wait():
            with Client() as c:
                found["client"] = c
                try:
                    found["lease"] = c.claim(gpus=1, owner_pid=owner.pid, wait=True,
                                             timeout=60, progress=places.append)
                except Exception as exc:  # noqa: BLE001 - reported below
                    found["error"] = exc

        waiter = threading.Thread(target=wait)
        waiter.start()
        [waiting] = eventually(lambda: places and holder.status()["queue"])
        path = f"/org/resourced/claim/{waiting}"
        victim = [found["client"]._conn.unique_name]
        forged = {"State": ("s", "granted"), "Mode": ("s", "dev"),
                  "GPUUUIDs": ("as", ["GPU-not-granted"]), "GPUIndices": ("au", [9]),
                  "PCIIndices": ("au", [9]), "GPUMemoryBytes": ("at", [1]),
                  "VRAMBytes": ("t", 0), "Pools": ("a{st}", {}), "Warnings": ("as", [])}
        forge(victim, path, "org.resourced.Claim", "Granted", "a{sv}", (forged,))
        forge(victim, path, "org.resourced.Claim", "Cancelled", "s", ("forged",))
        # The daemon's next ClaimNew reaches the waiter after the forgeries (the bus routed
        # them first): once it has reported its place again, it has read them too.
        reported = len(places)
        marker = holder.claim(gpus=0, cpu=1, owner_pid=owner.pid)["allocation"]["ref"]
        eventually(lambda: len(places) > reported, what="the waiter's report of ClaimNew")
        assert waiter.is_alive() and not found.get("error"), found
        assert holder.status()["queue"] == [waiting]

        holder.release(marker)
        holder.release(held)
        waiter.join(10)
    assert "error" not in found, found["error"]
    gpu = found["lease"]["env"]["CUDA_VISIBLE_DEVICES"]
    assert gpu.startswith("GPU-") and gpu != "GPU-not-granted"
    with Client() as c:
        c.release(found["lease"]["allocation"]["ref"])


def test_a_waiter_hears_of_its_grant_across_a_restart_of_the_daemon(pools_daemon, start_daemon,
                                                                     tmp_path):
    with Client() as c:
        held = hold_slots(c, 2)
    waiter = Waiter(slots=1, timeout=30)
    [waiting] = eventually(queue)
    pools_daemon.proc.kill()
    pools_daemon.proc.wait(5)
    start_daemon(gpus="3", args=["--config", str(tmp_path / "config.toml")],
                 runtime_dir=pools_daemon.runtime_dir)
    with Client() as c:
        c.release(held)
        assert waiter.outcome().granted, waiter.error
        assert waiter.ref == waiting["id"]
        c.release(waiter.ref)


@pytest.mark.parametrize("how", ["cancelled", "timed out", "served otherwise"])
def test_a_waiter_that_goes_away_withdraws_its_request(pools_daemon, how):
    with Client() as c:
        lease = c.acquire(pools={"slots": 1}, reclaimable=True)  # priority 0
        other = hold_slots(c, 1)  # not reclaimable
        with claim_watch(lease.ref) as watch:
            waiter = Waiter(slots=1, priority=5, timeout=1 if how == "timed out" else 15)
            eventually(lambda: lease.reclaim_requested)
            [waiting] = queue()

            if how == "cancelled":
                c.release(waiting["id"])
                assert isinstance(waiter.outcome().error, NoSuchClaim), waiter.error
            elif how == "timed out":
                assert isinstance(waiter.outcome(5).error, QueueTimeout), waiter.error
            else:
                c.release(other)
                assert waiter.outcome().granted, waiter.error

            eventually(lambda: ("ReclaimWithdrawn", ()) in watch.members())
            assert lease.reclaim_requested is False
            assert [v for _, v in watch.changed("ReclaimRequested")] == [True, False]
            assert [m for m, _ in watch.members()] == ["ReclaimRequested", "ReclaimWithdrawn"]
        assert status()["queue"] == []
        lease.release()


def test_reclaim_requested_of_a_lease_that_is_gone(pools_daemon):
    with Client() as c:
        lease = c.acquire(pools={"slots": 1}, reclaimable=True)
        r = gpuctl("release", "--force", "--allocation", lease.ref)
        assert r.returncode == 0, r.stderr
        with pytest.raises(NoSuchClaim):
            lease.reclaim_requested  # noqa: B018 - the property asks the daemon
        lease.release()  # and releasing it again is harmless


def test_gpuctl_run_forwards_a_reclaim_request_as_a_signal(pools_daemon, tmp_path):
    run = spawn_gpuctl("run", "--pool", "slots=2", "--reclaimable", "--reclaim-signal",
                       "SIGUSR1", "--", sys.executable, "-c", RECLAIM_TRAP, str(tmp_path))
    try:
        eventually(lambda: (tmp_path / "pid").exists(), timeout=10)
        waiter = Waiter(slots=2, priority=5, timeout=15)
        code = run.wait(10)
        assert waiter.outcome().granted, waiter.error
    finally:
        kill_all(run)
    assert code == 0, run.stderr.read()
    assert (tmp_path / "reclaimed").exists()
    with Client() as c:
        c.release(waiter.ref)


# -- the Python API -------------------------------------------------------------------------------
def test_blocking_leases(pools_daemon):
    with Client() as c:
        with c.acquire(pools={"slots": 1}, cpu=2, label="api", timeout=5) as lease:
            assert lease.env["RESOURCED_POOLS"] == "cpu=2,slots=1"
            assert lease.env["CUDA_VISIBLE_DEVICES"] == ""
            assert lease.allocation["pools"] == {"cpu": 2, "slots": 1}
            assert (pool()["free"], pool("cpu")["free"]) == (1, 6)
            assert lease.reclaim_requested is False
            assert c.try_acquire(pools={"slots": 2}) is None
            more = c.try_acquire(pools={"slots": 1})
            assert more is not None and pool()["free"] == 0
            more.release()
            more.release()  # twice is fine
            assert pool()["free"] == 1
        assert lease.released and pool()["free"] == 2
        lease = c.try_acquire(pools={"slots": 2})
        assert lease is not None
        lease.release()
    assert status()["claims"] == []


def test_async_leases(pools_daemon):
    async def main():
        client = AsyncClient()
        try:
            async with client.acquire(pools={"slots": 2}, timeout=5) as lease:
                assert lease.env["RESOURCED_POOLS"] == "slots=2"
                assert await lease.reclaim_requested() is False
                assert await client.try_acquire(pools={"slots": 1}) is None
                assert [p["free"] for p in (await client.status())["pools"]
                        if p["name"] == "slots"] == [0]
            assert lease.released
            held = await client.try_acquire(pools={"slots": 2})
            with pytest.raises(TimeoutError):  # a cancelled wait leaves the queue
                await asyncio.wait_for(client.acquire(pools={"slots": 1}), 0.3)
            assert (await client.status())["queue"] == []
            assert held is not None
            async with AsyncClient() as other:
                waiting = asyncio.ensure_future(other.acquire(pools={"slots": 2}, timeout=5))
                while not (await client.status())["queue"]:
                    await asyncio.sleep(0.01)
                assert not waiting.done()
                await held.release()
                second = await asyncio.wait_for(waiting, 5)
                await second.release()
        finally:
            await client.close()

    asyncio.run(asyncio.wait_for(main(), 20))
    assert status()["claims"] == [] and pool()["free"] == 2


# -- a reply that waits for the grant (ReplyWhenGranted) -----------------------------------
MANAGER = DBusAddress("/org/resourced", bus_name=NAME, interface="org.resourced.Manager")

# Waits for one slot with Client.acquire, catches the KeyboardInterrupt, says so, and lives on.
INTERRUPTED_BUT_ALIVE = r"""
import time
from resourced.client.sync import Client
c = Client()
try:
    c.acquire(pools={"slots": 1}, timeout=20)
except KeyboardInterrupt as exc:
    print("interrupted" if exc.__cause__ is None else f"caused by {exc.__cause__!r}", flush=True)
time.sleep(60)
"""


class HeldCall:
    """A Claim for one slot with ReplyWhenGranted, sent on a connection of its own; its
    serial and every message the connection received, by a thread.  Closed on leaving
    ``with``."""

    SERIAL = 1 << 20

    def __init__(self, then: tuple = (), **options):
        """``then``: (method, signature, body) of a Manager call sent right behind."""
        self.conn = open_dbus_connection("SESSION")
        opts = {"Mode": ("s", "dev"), "OwnerPID": ("u", os.getpid()),
                "Pools": ("a{st}", {"slots": 1}), "ReplyWhenGranted": ("b", True), **options}
        self.serial = self.SERIAL
        self.conn.send(new_method_call(MANAGER, "Claim", "ua{sv}", (0, opts)), serial=self.serial)
        if then:
            self.conn.send(new_method_call(MANAGER, *then), serial=self.serial + 1)
        self.received: list = []
        self._pings = 1  # serials after the Claim's: the call behind it, then pings
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.received.append(self.conn.receive(timeout=0.05))
            except TimeoutError:
                continue
            except OSError:
                return

    def reply(self, to: int = 0):
        """The reply to the Claim (``to`` 1: to the call behind it), or None yet."""
        replies = [m for m in self.received
                   if m.header.fields.get(HeaderFields.reply_serial) == self.serial + to]
        return replies[0] if replies else None

    def members(self) -> list[str]:
        return [m.header.fields.get(HeaderFields.member) for m in self.received]

    def settled(self) -> None:
        """Wait until every message the daemon sent this connection before now is
        received: it answers a ping after them."""
        self._pings += 1
        serial = self.serial + self._pings
        self.conn.send(new_method_call(PEER, "Ping"), serial=serial)
        eventually(lambda: self.reply(serial - self.serial), what="the answer to a ping")

    def stop_reading(self) -> None:
        """Leave the connection to calls made on it (``call_manager``)."""
        self._stop.set()
        self._thread.join(5)

    def close(self) -> None:
        self.stop_reading()
        self.conn.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def call_manager(method: str, signature: str, body: tuple, conn=None):
    """A Manager call's reply message (errors included), on ``conn`` or a new connection."""
    own = conn is None
    conn = conn or open_dbus_connection("SESSION")
    try:
        return conn.send_and_get_reply(new_method_call(MANAGER, method, signature, body),
                                       timeout=10)
    finally:
        if own:
            conn.close()


def test_a_held_claim_is_answered_at_its_grant_and_signalled_to_nobody(pools_daemon):
    with Client() as c:
        held = hold_slots(c, 2)
        with HeldCall() as call:
            [waiting] = eventually(queue)
            call.settled()
            assert call.reply() is None  # it waits, and so does its reply
            c.release(held)
            reply = eventually(call.reply, what="the Claim's reply")
            claim_id, path, grant = reply.body
            assert (claim_id, grant["State"][1], grant["Pools"][1]) == (
                waiting["id"], "granted", {"slots": 1})
            assert path == f"/org/resourced/claim/{claim_id}"
            call.settled()
            assert "Granted" not in call.members()
        c.release(claim_id)


@pytest.mark.parametrize("how", ["timed out", "released by its owner"])
def test_a_held_claim_that_leaves_the_queue_is_answered_with_an_error(pools_daemon, how):
    with Client() as c:
        held = hold_slots(c, 2)
        options = {"QueueTimeoutUSec": ("t", 300_000)} if how == "timed out" else {}
        with HeldCall(**options) as call:
            [waiting] = eventually(queue)
            if how != "timed out":
                c.release(waiting["id"])
            reply = eventually(call.reply, what="the Claim's reply")
            error = reply.header.fields[HeaderFields.error_name]
            if how == "timed out":
                assert error == "org.resourced.Error.QueueTimeout"
                assert reply.body[0] == f"claim {waiting['id']} was not granted in time; it left the queue"
            else:
                assert error == "org.resourced.Error.NoSuchClaim"
                assert reply.body[0] == f"claim {waiting['id']} left the queue: cancelled"
            assert "Cancelled" not in call.members()
        assert queue() == []
        c.release(held)


def test_get_claim_by_call_finds_a_waiting_claim_for_the_caller_alone(pools_daemon):
    with Client() as c:
        held = hold_slots(c, 2)
        with HeldCall() as call:
            [waiting] = eventually(queue)
            call.stop_reading()  # the calls below read the connection themselves
            mine = call_manager("GetClaimByCall", "u", (call.serial,), call.conn)
            assert mine.body[0] == waiting["id"] and mine.body[2]["State"][1] == "queued"
            other = call_manager("GetClaimByCall", "u", (call.serial,))
            assert other.header.fields[HeaderFields.error_name] == "org.resourced.Error.NoSuchClaim"
            unknown = call_manager("GetClaimByCall", "u", (call.serial + 1,), call.conn)
            assert unknown.header.fields[HeaderFields.error_name] == "org.resourced.Error.NoSuchClaim"
        c.release(held)


def test_get_claim_by_call_waits_for_a_claim_still_being_decided(pools_daemon):
    """On a new connection the Claim first waits for the caller's credentials; a lookup
    sent right behind it (a client interrupted at once) must still find the claim."""
    with Client() as c:
        held = hold_slots(c, 2)
        with HeldCall(then=("GetClaimByCall", "u", (HeldCall.SERIAL,))) as call:
            found = eventually(lambda: call.reply(to=1), what="GetClaimByCall's reply")
            assert found.header.fields.get(HeaderFields.error_name) is None, found.body
            [waiting] = queue()
            assert found.body[0] == waiting["id"] and found.body[2]["State"][1] == "queued"
        c.release(held)


def test_a_held_claim_whose_caller_leaves_the_bus_leaves_the_queue(pools_daemon):
    """Nobody could be told of its grant: it would hold what it was granted for nobody."""
    with Client() as c:
        held = hold_slots(c, 2)
        call = HeldCall()
        [waiting] = eventually(queue)
        call.close()
        eventually(lambda: queue() == [], what="the claim out of the queue")
        c.release(held)
    assert (f"cancelled release of {waiting['id']} by resourced: the caller waiting on it "
            "left the bus") in pools_daemon.log()


def test_cancelling_one_of_two_first_async_waits_leaves_the_other(pools_daemon):
    """Two waits that start together on a new AsyncClient share its one connection, so
    the cancelled one finds its claim (by its call) there and takes it out."""
    async def main():
        with Client() as c:
            held = hold_slots(c, 2)
        async with AsyncClient() as client:
            first, second = (asyncio.ensure_future(client.claim(
                mode="dev", gpus=0, pools={"slots": 1}, owner_pid=os.getpid(), wait=True,
                timeout=20)) for _ in range(2))
            while len((await client.status())["queue"]) < 2:
                await asyncio.sleep(0.02)
            first.cancel()
            await asyncio.gather(first, return_exceptions=True)
            assert len((await client.status())["queue"]) == 1
            await client.release(held)
            granted = await asyncio.wait_for(second, 10)
            await client.release(granted["allocation"]["ref"])

    asyncio.run(asyncio.wait_for(main(), 30))
    assert status()["claims"] == []


def test_a_daemon_without_reply_when_granted_is_waited_on_the_older_way(start_daemon,
                                                                        tmp_path):
    """A client newer than the daemon (a shared or system daemon, a venv client) asks
    again with Wait alone when the daemon does not know the option, and hears of its
    grant by the signal."""
    older = tmp_path / "older"
    older.mkdir()
    (older / "sitecustomize.py").write_text(
        "import resourced.daemon.bus.manager as m\ndel m.CLAIM_OPTIONS['ReplyWhenGranted']\n")
    config = tmp_path / "config.toml"
    config.write_text(CONFIG)
    start_daemon(gpus="3", args=["--config", str(config)], env={
        "PYTHONPATH": os.pathsep.join(filter(None, [str(older), os.environ.get("PYTHONPATH")]))})
    with Client() as c:
        held = hold_slots(c, 2)
        waiter = Waiter(slots=1)
        [waiting] = eventually(queue)
        c.release(held)
        assert waiter.outcome().granted, waiter.error
        assert waiter.ref == waiting["id"]
        c.release(waiter.ref)


def test_an_interrupted_wait_leaves_the_queue_though_the_process_lives_on(pools_daemon):
    with Client() as c:
        held = hold_slots(c, 2)
    waiter = spawn(sys.executable, "-c", INTERRUPTED_BUT_ALIVE)
    try:
        eventually(lambda: len(queue()) == 1, timeout=10)
        waiter.send_signal(signal.SIGINT)
        assert read_line(waiter) == "interrupted"
        eventually(lambda: queue() == [], timeout=3)
        assert waiter.poll() is None  # gone from the queue by the client's doing, not by exiting
    finally:
        kill_all(waiter)
    with Client() as c:
        c.release(held)
