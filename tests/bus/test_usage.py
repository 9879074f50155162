"""Usage history end to end: the simulated driver and clock, a real daemon writing
usage.sqlite in its state directory, `gpuctl usage` reading it back through the bus."""

import json
import os
import subprocess

import pytest

from resourced.client.sync import Client
from resourced.protocol.amounts import format_bytes

from ..conftest import eventually, gpuctl
from .conftest import CLOCK_TIMEOUT
from .test_evidence import Simulation, settings, swept

HOUR = 3600


class LoadedSimulation(Simulation):
    """The simulated driver, with a utilisation for every GPU (in the same one rename:
    a file rewritten in place can be read half written, and a look that finds no answer
    counts no use)."""

    utilization = 0

    def data(self) -> dict:
        data = super().data()
        for gpu in data["gpus"]:
            gpu["utilization_pct"] = self.utilization
        return data


@pytest.fixture
def sim(tmp_path) -> LoadedSimulation:
    return LoadedSimulation(tmp_path / "gpus.json")


@pytest.fixture
def daemon_on(start_daemon, sim, clock, tmp_path):
    def start(runtime_dir=None):
        return start_daemon(gpus=sim.path, env={"RESOURCED_SIMULATED_CLOCK": str(clock.path)},
                            args=settings(tmp_path, sample_interval=0.2, no_show_after=0),
                            runtime_dir=runtime_dir)
    return start


def usage(*args) -> list[dict]:
    r = gpuctl("usage", "--json", "--since", "2026-12-01T00:00:00Z", *args)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_held_used_and_idle_hours_per_user_and_per_gpu_outlive_a_restart(daemon_on, sim, clock):
    first = daemon_on()
    owner = subprocess.Popen(["sleep", "120"])
    try:
        sim.utilization = 50
        with Client() as c:
            used = c.claim(gpus=1, owner_pid=owner.pid)["allocation"]
            idle = c.claim(gpus=1, owner_pid=owner.pid)["allocation"]
        sim.put(used["gpu_indices"][0], owner.pid)  # a process of the holder on one of them
        swept(sim, clock)
        eventually(lambda: {r["mean_utilization_pct"] for r in usage(
            "--by", "gpu", "--until", "2026-12-01T09:01:00Z")} == {50},
            what="a load sample of every GPU in the minute from 09:00")
        clock.set("2026-12-01T10:00:00Z")  # an hour later
        swept(sim, clock)
        with Client() as c:
            c.release(idle["ref"])
        sim.put(used["gpu_indices"][0])
        with Client() as c:
            c.release(used["ref"])
    finally:
        owner.kill()
        owner.wait()

    [me] = usage()
    assert me["claims"] == 2 and me["bookings"] == 0
    assert me["held_gpu_hours"] == pytest.approx(2, abs=0.01)
    assert me["used_gpu_hours"] == pytest.approx(1, abs=0.01)
    assert me["idle_gpu_hours"] == pytest.approx(1, abs=0.01)

    first.stop()
    daemon_on(runtime_dir=first.runtime_dir)  # the same state directory: the history stays
    assert usage() == [me]
    by_gpu = {r["gpu"]: r for r in usage("--by", "gpu")}
    held = {g: r["held_gpu_hours"] for g, r in by_gpu.items() if r["held_gpu_hours"]}
    assert sorted(held.values()) == pytest.approx([1, 1], abs=0.01)
    assert {r["mean_utilization_pct"] for r in by_gpu.values()} == {50}
    text = gpuctl("usage", "--by", "gpu", "--since", "2026-12-01T00:00:00Z").stdout.splitlines()
    assert text[0].split()[-3:] == ["UTIL", "%", "MEM"]
    shown = {line.split()[0]: line.split()[-2:] for line in text[1:]}
    assert shown == {gpu: ["50", format_bytes(r["mean_memory_used_bytes"])]
                     for gpu, r in by_gpu.items()}
    assert any(r["mean_memory_used_bytes"] for r in by_gpu.values())  # the process's 512M


def test_an_unused_booking_is_booked_and_idle(daemon_on, sim, clock):
    daemon_on()
    with Client() as c:
        ref = c.book(HOUR, gpus=1, start="2026-12-01T10:00:00Z")["booking"]["id"]
        clock.set("2026-12-01T10:00:00Z")
        eventually(lambda: c.booking(ref)["state"] == "active", CLOCK_TIMEOUT)
        swept(sim, clock)
        clock.set("2026-12-01T11:00:00Z")
        eventually(lambda: c.booking(ref)["state"] == "ended", CLOCK_TIMEOUT)

    [me] = usage()
    assert (me["bookings"], me["booked_gpu_hours"], me["booked_idle_gpu_hours"]) == (
        1, pytest.approx(1, abs=0.01), pytest.approx(1, abs=0.01))
    text = gpuctl("usage", "--since", "2026-12-01T00:00:00Z")
    assert text.returncode == 0 and text.stdout.splitlines()[0].split()[:2] == ["USER", "HELD"]


def test_the_history_file_is_private_to_the_daemon(daemon_on):
    d = daemon_on()
    state = os.environ.get("RESOURCED_STATE_DIR") or d.env.get("RESOURCED_STATE_DIR")
    path = os.path.join(state, "usage.sqlite")
    assert os.stat(path).st_mode & 0o777 == 0o600


def test_a_bad_window_is_a_usage_error(daemon_on):
    daemon_on()
    r = gpuctl("usage", "--since", "2026-12-02T00:00:00Z", "--until", "2026-12-01T00:00:00Z")
    assert r.returncode == 2 and "before" in r.stderr


@pytest.mark.parametrize("args, says", [
    (["--since", "tomorrow"], "--since must be before now"),
    (["--since", "10:00", "--until", "09:30"], "--since must be before --until"),
])
def test_a_span_that_ends_before_it_starts_is_refused_in_gpuctls_words(clocked_daemon,
                                                                         args, says):
    """It said 'SinceUSec must be before UntilUSec', the bus option's names."""
    clocked_daemon(gpus=1)
    r = gpuctl("usage", *args)
    assert r.returncode == 2 and says in r.stderr and "USec" not in r.stderr, r.stderr
