"""HealthMonitor with injected probes: deadlines, hung probes, failures, events per round."""

import asyncio
import threading
import time

import pytest

from resourced.config import CheckEntry
from resourced.core.health import (
    ERROR,
    NOT_MEASURED,
    OK,
    STOP,
    UNAVAILABLE,
    WARN,
    LevelChanged,
    Measurement,
)
from resourced.daemon import health_monitor
from resourced.daemon.health_monitor import HealthMonitor

GIB = 1024**3
RAM = CheckEntry("ram", "ram", warn_free_pct=15, stop_free_pct=10)
DATA = CheckEntry("data", "disk", "/data", stop_free_gib=10)
NFS = CheckEntry("nfs", "disk", "/nfs", warn_free_gib=1)
KEYS = {"name", "type", "path", "level", "reason", "free_bytes", "total_bytes", "free_pct",
        "used_pct", "limits"}


def run(coro, timeout=10):
    return asyncio.run(asyncio.wait_for(coro, timeout))


class Probes:
    """An injected ``measure``: figures per check name, a hang or an error on demand."""

    def __init__(self, **figures):
        self.figures = dict(figures)
        self.calls: list[str] = []
        self.hang = threading.Event()     # set: the nfs probe returns
        self.hung = set()                 # names that hang until ``hang`` is set
        self.lock = threading.Lock()

    def __call__(self, check: CheckEntry) -> Measurement:
        with self.lock:
            self.calls.append(check.name)
        if check.name in self.hung:
            self.hang.wait(30)
        value = self.figures[check.name]
        if isinstance(value, Exception):
            raise value
        return value


@pytest.fixture(autouse=True)
def audits(monkeypatch):
    seen = []
    monkeypatch.setattr(health_monitor.sd, "audit",
                        lambda message, priority=5, **fields: seen.append((message, fields)))
    return seen


def test_one_round_measures_every_check_and_reports_the_changes(audits):
    probes = Probes(ram=Measurement(50, 100), data=Measurement(5 * GIB, 100 * GIB))
    monitor = HealthMonitor((RAM, DATA), 30, 1, measure=probes)
    assert monitor.health == UNAVAILABLE
    assert [s["reason"] for s in monitor.states()] == [NOT_MEASURED, NOT_MEASURED]

    events = run(monitor.sample_now())

    # A first reading of OK is no news; a first reading of STOP is.
    assert [(e.check, e.old, e.new) for e in events] == [("data", UNAVAILABLE, STOP)]
    assert events[0].reason == "free 5G <= stop_free_gib 10"
    assert monitor.health == STOP
    assert monitor.levels() == {"ram": OK, "data": STOP}
    assert [fields["level"] for _, fields in audits] == [STOP]
    assert audits[0][1]["check"] == "data" and audits[0][1]["old_level"] == UNAVAILABLE


def test_states_are_plain_data_for_json():
    probes = Probes(ram=Measurement(25, 100), data=Measurement(5 * GIB, 100 * GIB))
    monitor = HealthMonitor((RAM, DATA), 30, 1, measure=probes)
    run(monitor.sample_now())
    ram, data = monitor.states()
    assert set(ram) == KEYS
    assert ram == {"name": "ram", "type": "ram", "path": None, "level": OK,
                   "reason": ram["reason"], "free_bytes": 25, "total_bytes": 100,
                   "free_pct": 25.0, "used_pct": 75.0,
                   "limits": {"warn_free_pct": 15, "stop_free_pct": 10}}
    assert data["path"] == "/data" and data["level"] == STOP
    assert monitor.describe() == {"level": STOP, "checks": [ram, data]}


def test_a_hung_probe_is_unavailable_within_the_deadline_and_blocks_nothing():
    probes = Probes(ram=Measurement(50, 100), nfs=Measurement(50 * GIB, 100 * GIB))
    probes.hung.add("nfs")
    monitor = HealthMonitor((RAM, NFS), 30, 1.0, measure=probes)  # a 1 s deadline

    async def scenario():
        t0 = time.monotonic()
        await monitor.sample_now()
        first = time.monotonic() - t0
        t0 = time.monotonic()
        await monitor.sample_now()            # nfs is still hung: no new probe, no wait
        second = time.monotonic() - t0
        return first, second

    try:
        first, second = run(scenario())
        assert 0.95 <= first < 15    # the deadline, then no longer (margin for a slow machine)
        assert second < 1.0          # the hung probe is not waited for again
        assert probes.calls.count("nfs") == 1      # nothing queued behind the hung call
        assert probes.calls.count("ram") == 2      # the other check was measured both times
        nfs = monitor.states()[1]
        assert nfs["level"] == UNAVAILABLE and nfs["limits"] == {"warn_free_gib": 1}
        assert "has not returned" in nfs["reason"]
        assert monitor.health == UNAVAILABLE
    finally:
        probes.hang.set()

    # once the call returns, the next round probes afresh
    probes.hung.clear()
    deadline = time.monotonic() + 5
    while monitor.levels()["nfs"] != OK and time.monotonic() < deadline:
        run(monitor.sample_now())
    assert monitor.levels()["nfs"] == OK
    assert monitor.health == OK


def test_the_first_timeout_names_the_deadline():
    probes = Probes(nfs=Measurement(1, 2))
    probes.hung.add("nfs")
    monitor = HealthMonitor((NFS,), 30, 0.1, measure=probes)
    try:
        events = run(monitor.sample_now())
    finally:
        probes.hang.set()
    assert events == []   # UNAVAILABLE (not measured yet) -> UNAVAILABLE is no change
    assert monitor.states()[0]["reason"] == "no answer within 0.1 s"


def test_a_failing_probe_is_an_error_with_its_reason():
    err = FileNotFoundError(2, "No such file or directory", "/data")
    probes = Probes(ram=Measurement(50, 100), data=err)
    monitor = HealthMonitor((RAM, DATA), 30, 1, measure=probes)
    run(monitor.sample_now())
    data = monitor.states()[1]
    assert data["level"] == ERROR
    assert data["reason"] == "/data: No such file or directory"
    assert data["free_bytes"] is None and data["limits"] == {"stop_free_gib": 10}
    assert monitor.health == ERROR      # never OK while a check cannot be measured


def test_a_buggy_probe_is_an_error_too():
    probes = Probes(ram=RuntimeError("boom"))
    monitor = HealthMonitor((RAM,), 30, 1, measure=probes)
    run(monitor.sample_now())
    assert monitor.states()[0]["level"] == ERROR
    assert "boom" in monitor.states()[0]["reason"]


def test_listeners_get_each_rounds_events_only_when_there_are_some():
    probes = Probes(ram=Measurement(50, 100))
    monitor = HealthMonitor((RAM,), 30, 1, measure=probes)
    rounds, samples = [], []
    monitor.subscribe(rounds.append)
    monitor.on_sample(samples.append)

    async def scenario():
        await monitor.sample_now()                      # a first OK: no event
        probes.figures["ram"] = Measurement(40, 100)
        await monitor.sample_now()                      # OK, figures moved
        probes.figures["ram"] = Measurement(12, 100)
        await monitor.sample_now()                      # OK -> WARN
        probes.figures["ram"] = Measurement(5, 100)
        await monitor.sample_now()                      # WARN -> STOP

    run(scenario())
    assert [[(e.old, e.new) for e in r] for r in rounds] == [[(OK, WARN)], [(WARN, STOP)]]
    assert len(samples) == 4
    assert [s[0]["free_bytes"] for s in samples] == [50, 40, 12, 5]


def test_a_failing_listener_does_not_stop_the_others():
    monitor = HealthMonitor((RAM,), 30, 1, measure=Probes(ram=Measurement(5, 100)))
    got = []
    monitor.subscribe(lambda events: 1 / 0)
    monitor.subscribe(got.append)
    run(monitor.sample_now())
    assert len(got) == 1


def test_run_samples_every_interval_and_apply_resamples_at_once():
    probes = Probes(ram=Measurement(50, 100), data=Measurement(5 * GIB, 100 * GIB))
    monitor = HealthMonitor((RAM,), 0.05, 1, measure=probes)
    rounds = []
    monitor.on_sample(lambda states: rounds.append([s["name"] for s in states]))

    async def scenario():
        task = asyncio.create_task(monitor.run())
        try:
            while len(rounds) < 3:
                await asyncio.sleep(0.01)
            monitor.apply((RAM, DATA), 60, 1)       # a long interval: only the wake-up counts
            t0 = time.monotonic()
            while rounds[-1] != ["ram", "data"] or monitor.levels()["data"] != STOP:
                await asyncio.sleep(0.01)
            return time.monotonic() - t0
        finally:
            task.cancel()

    assert run(scenario(), timeout=5) < 1
    assert monitor.sample_interval == 60


def test_apply_takes_down_a_removed_check():
    probes = Probes(ram=Measurement(50, 100), data=Measurement(5 * GIB, 100 * GIB))
    monitor = HealthMonitor((RAM, DATA), 30, 1, measure=probes)
    got = []
    monitor.subscribe(got.append)
    run(monitor.sample_now())
    events = monitor.apply((RAM,), 30, 1)
    assert [(e.check, e.old, e.new) for e in events] == [("data", STOP, OK)]
    assert got[-1] == events
    assert [s["name"] for s in monitor.states()] == ["ram"]
    assert monitor.health == OK


def test_a_reading_of_a_check_changed_meanwhile_is_dropped():
    slow = threading.Event()
    changed = CheckEntry("data", "disk", "/elsewhere", stop_free_gib=1)

    def measure(check):
        slow.wait(5)
        return Measurement(5 * GIB, 100 * GIB)

    monitor = HealthMonitor((DATA,), 30, 2, measure=measure)

    async def scenario():
        round_ = asyncio.create_task(monitor.sample_now())
        await asyncio.sleep(0.05)
        monitor.apply((changed,), 30, 2)
        slow.set()
        return await round_

    assert run(scenario()) == []
    assert monitor.states()[0]["level"] == UNAVAILABLE   # still waiting for its own reading


def test_with_no_checks_the_machine_is_ok():
    monitor = HealthMonitor((), 30, 1, measure=Probes())
    assert run(monitor.sample_now()) == []
    assert monitor.describe() == {"level": OK, "checks": []}


def test_the_default_probe_measures_this_machine(tmp_path):
    monitor = HealthMonitor((CheckEntry("tmp", "disk", str(tmp_path)),
                             CheckEntry("gone", "disk", str(tmp_path / "gone"))), 30, 5)
    run(monitor.sample_now())
    tmp, gone = monitor.states()
    assert tmp["level"] == OK and tmp["total_bytes"] > 0
    assert gone["level"] == ERROR and "No such file" in gone["reason"]


def test_warn_level_reason_reaches_listeners():
    monitor = HealthMonitor((RAM,), 30, 1, measure=Probes(ram=Measurement(15, 100)))
    events = run(monitor.sample_now())
    assert events == [LevelChanged("ram", UNAVAILABLE, WARN, "free 15.0% <= warn_free_pct 15")]
