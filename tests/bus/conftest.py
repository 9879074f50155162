"""Fixtures of the bus tests: a process to own claims, and the simulated clock for the
calendar's tests (a file that is *now* for the daemon, for gpuctl and for this process's
clients)."""

import os
import subprocess
from datetime import datetime, timedelta
from pathlib import Path

import pytest

NOW = "2026-12-01T09:00:00Z"
CLOCK_TIMEOUT = 5.0  # the daemon acts on a new instant at once (and looks each second)


def at(text: str) -> int:
    """An ISO instant as microseconds since the epoch."""
    moment = datetime.fromisoformat(text)
    return int(moment.timestamp()) * 1_000_000 + moment.microsecond


class SimClock:
    """The simulated clock file; ``set`` moves *now* (replaced whole, never half written)."""

    def __init__(self, path: Path):
        self.path = path
        self.set(NOW)

    def set(self, text: str) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(text + "\n")
        os.replace(tmp, self.path)
        self.now = datetime.fromisoformat(text)

    def advance(self, seconds: float) -> None:
        self.set((self.now + timedelta(seconds=seconds)).isoformat().replace("+00:00", "Z"))


@pytest.fixture
def clock(tmp_path, monkeypatch) -> SimClock:
    """The clock file, at 09:00, in UTC; gpuctl and this process's clients read it too."""
    sim = SimClock(tmp_path / "clock")
    monkeypatch.setenv("RESOURCED_SIMULATED_CLOCK", str(sim.path))
    monkeypatch.setenv("RESOURCED_SIMULATED_GPUS", "4")
    monkeypatch.setenv("TZ", "UTC")
    return sim


@pytest.fixture
def clocked_daemon(start_daemon, clock, monkeypatch):
    """Start a daemon on ``gpus`` simulated 80G GPUs, on the simulated clock."""
    def start(gpus: int = 4, runtime_dir=None):
        monkeypatch.setenv("RESOURCED_SIMULATED_GPUS", str(gpus))
        return start_daemon(gpus=str(gpus), env={"RESOURCED_SIMULATED_CLOCK": str(clock.path)},
                            runtime_dir=runtime_dir)
    return start


@pytest.fixture
def owner():
    """A process of ours to own claims, alive for the longest test (the fuzzer's);
    killed afterwards."""
    proc = subprocess.Popen(["sleep", "600"])
    yield proc
    proc.kill()
    proc.wait(timeout=10)
