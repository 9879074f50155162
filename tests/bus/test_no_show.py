"""No-show and idle reclamation end to end: the simulated driver (a JSON file), the
simulated clock, real processes listed on the GPUs.  A booking nobody of its owner used
for no_show_after is released and its owner told; a process of the owner at any
utilisation, or evidence the daemon cannot trust, keeps it."""

import json
import subprocess

import pytest

from resourced.client.sync import Client

from ..conftest import eventually, gpuctl
from .conftest import CLOCK_TIMEOUT
from .test_evidence import Simulation, settings, swept

WINDOW = 600  # no_show_after, seconds of the simulated clock


@pytest.fixture
def sim(tmp_path) -> Simulation:
    return Simulation(tmp_path / "gpus.json")


@pytest.fixture
def booked(start_daemon, sim, clock, tmp_path):
    """A daemon with no_show_after = WINDOW (idle_after = WINDOW too) and a booking of GPU 0
    from 10:00 to 13:00, started; returns its record."""
    start_daemon(gpus=sim.path, env={"RESOURCED_SIMULATED_CLOCK": str(clock.path)},
                 args=settings(tmp_path, no_show_after=WINDOW, idle_after=WINDOW))
    with Client() as c:
        ref = c.book(3 * 3600, gpu_names=["gpu0"], start="2026-12-01T10:00:00Z")["booking"]["id"]
    clock.set("2026-12-01T10:00:00Z")
    eventually(lambda: booking(ref)["claim_state"] == "granted", CLOCK_TIMEOUT)
    swept(sim, clock)  # the window opens at the first look after the start
    return ref


def booking(ref: str) -> dict:
    with Client() as c:
        return c.booking(ref)


def test_a_booking_nobody_used_is_released_as_a_no_show(booked, clock, sim):
    clock.set("2026-12-01T10:05:00Z")  # half the window: kept
    swept(sim, clock)
    assert booking(booked)["state"] == "active"
    clock.set("2026-12-01T10:11:00Z")

    ended = eventually(lambda: (b := booking(booked))["state"] == "ended" and b, CLOCK_TIMEOUT)

    assert ended["ended"] == "no-show" and "used its GPUs" in ended["reason"]
    listed = json.loads(gpuctl("bookings", "--json", "--since", "2026-12-01T09:00:00Z").stdout)
    assert [b["ended"] for b in listed if b["id"] == booked] == ["no-show"]
    [row] = [line for line in gpuctl("bookings", "--since", "2026-12-01T09:00:00Z").stdout
             .splitlines() if line.startswith(booked)]
    assert "released as a no-show: no process of " in row and "uid -1" not in row
    assert int(gpuctl("free").stdout) == 4  # its GPU is back


def test_a_process_of_the_owner_keeps_it_even_idle(booked, clock, sim):
    own = subprocess.Popen(["sleep", "60"])  # on GPU 0 at 0 %: still use
    try:
        sim.put(0, own.pid)
        clock.set("2026-12-01T10:01:00Z")
        eventually(lambda: booking(booked)["state"] == "active", CLOCK_TIMEOUT)
        swept(sim, clock)
        sim.put(0)  # gone again: once used, never a no-show
        clock.set("2026-12-01T11:00:00Z")
        swept(sim, clock)
        assert booking(booked)["state"] == "active"
    finally:
        own.kill()
        own.wait()


def test_evidence_the_daemon_cannot_trust_keeps_it(booked, clock, sim):
    sim.drop(0)  # the driver no longer reports GPU 0: nothing known about it
    clock.set("2026-12-01T10:20:00Z")
    swept(sim, clock)
    assert booking(booked)["state"] == "active"
    sim.put(0)  # reported again, idle: the window starts again from here
    swept(sim, clock)
    clock.set("2026-12-01T10:25:00Z")
    swept(sim, clock)
    assert booking(booked)["state"] == "active"


def test_an_idle_claim_is_released_when_configured(start_daemon, sim, clock, tmp_path):
    start_daemon(gpus=sim.path, env={"RESOURCED_SIMULATED_CLOCK": str(clock.path)},
                 args=settings(tmp_path, idle_after=WINDOW))
    owner = subprocess.Popen(["sleep", "60"])
    try:
        with Client() as c:
            ref = c.claim(gpus=1, owner_pid=owner.pid)["allocation"]["ref"]
            swept(sim, clock)
            clock.set("2026-12-01T09:11:00Z")
            eventually(lambda: ref not in {k["id"] for k in c.status()["claims"]},
                       CLOCK_TIMEOUT)
        assert owner.poll() is None  # released, never killed
    finally:
        owner.kill()
        owner.wait()
