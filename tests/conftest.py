"""Shared test fixtures: a private session bus per test session, and daemons on it."""

import asyncio
import inspect
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from resourced.linux.privatebus import PrivateBus

ROOT = Path(__file__).resolve().parent.parent


def documentation() -> str:
    """What a user reads: the README, then each page docs/index.md links to, in its order
    (the reference, generated from the code, shows no examples to type)."""
    index = ROOT / "docs" / "index.md"
    pages = [p for p in re.findall(r"\]\(([\w/.-]+\.md)\)", index.read_text())
             if not p.startswith("reference/")]
    return "\n".join([(ROOT / "README.md").read_text(),
                      *((index.parent / p).read_text() for p in pages)])


ROOT_TIERS = ("tests/system/", "tests/systemd/")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """Under pytest-xdist (``-n``), the tiers that change the machine as root (test users, a
    system bus, systemd in namespaces) are one unit of work, run by one worker in their
    order, as without it; every other test is a unit of its own, spread over the workers.

    (xdist's ``--dist loadgroup`` would do this from a mark, but it writes the group into
    a node's id in a way pytest 9 no longer reads: the root tiers were spread over both
    workers, their set-ups racing.)"""
    from xdist.scheduler import LoadScopeScheduling

    class RootTiersTogether(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return "root tiers" if nodeid.replace("\\", "/").startswith(ROOT_TIERS) else nodeid

    return RootTiersTogether(config, log)


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch):
    """No test sees the developer's real buses or resourced settings."""
    for name in list(os.environ):
        if name.startswith("RESOURCED_") or name.startswith("DBUS_"):
            monkeypatch.delenv(name)


@pytest.fixture(scope="session")
def private_bus():
    with PrivateBus() as bus:
        yield bus


def stop_process(proc: subprocess.Popen) -> int:
    """SIGTERM, then SIGKILL after 10 s; the exit status."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
    return proc.returncode


def assert_systemd_accepts(tmp_path, name: str, content: str) -> None:
    """`systemd-analyze --user verify` passes the user unit ``content`` (written as
    ``name``), with nothing to say about it, its Documentation=man:... pages found among
    the generated ones (docs/man); skips where systemd-analyze is missing."""
    import shutil

    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed")
    unit = tmp_path / name
    unit.write_text(content)
    runtime = tmp_path / "xdg-runtime"
    runtime.mkdir(mode=0o700)
    done = subprocess.run(["systemd-analyze", "--user", "verify", str(unit)],
                          env={**os.environ, "XDG_RUNTIME_DIR": str(runtime),
                               "MANPATH": str(ROOT / "docs" / "man")},
                          capture_output=True, text=True, timeout=60, check=False)
    about_us = [line for line in (done.stdout + done.stderr).splitlines() if unit.name in line]
    assert done.returncode == 0 and about_us == [], done.stdout + done.stderr


def eventually(predicate, timeout: float = 5.0, interval: float = 0.02, what: str = ""):
    """Wait until ``predicate()`` is truthy (``what``, in the failure); fail the test after
    ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:g} s: {what or predicate}")
        time.sleep(interval)


async def eventually_async(predicate, timeout: float = 5.0, interval: float = 0.02,
                           what: str = ""):
    """``eventually`` for a test on an event loop, which it leaves running between looks;
    ``predicate`` may be a coroutine function."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:g} s: {what or predicate}")
        await asyncio.sleep(interval)


class Daemon:
    """A resourced daemon as a real subprocess on the private bus."""

    def __init__(self, bus: PrivateBus, tmp_path: Path, gpus="4", args=(), env=None,
                 runtime_dir: Path | None = None):
        self.bus = bus
        stamp = time.monotonic_ns()
        self.log_path = tmp_path / f"daemon-{stamp}.log"
        self.runtime_dir = runtime_dir or tmp_path / f"run-{stamp}"
        self.env = {**os.environ, **bus.env(), "RESOURCED_SIMULATED_GPUS": str(gpus),
                    "RESOURCED_RUNTIME_DIR": str(self.runtime_dir), "PYTHONUNBUFFERED": "1",
                    "RESOURCED_STATE_DIR": f"{self.runtime_dir}-state",
                    **(env or {})}
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "resourced.daemon", "--session", *args],
            env=self.env, stdout=self._log, stderr=subprocess.STDOUT,
        )

    def wait_ready(self, timeout: float = 10.0) -> "Daemon":
        from resourced.client.sync import Client

        def owned():
            if self.proc.poll() is not None:
                raise AssertionError(f"daemon exited with {self.proc.returncode}:\n{self.log()}")
            try:
                with Client(bus="session") as c:
                    c.ping()
                return True
            except Exception:  # noqa: BLE001 - not up yet
                return False

        with _bus_env(self.bus):
            eventually(owned, timeout)
        return self

    def log(self) -> str:
        return self.log_path.read_text()

    def stop(self) -> int:
        code = stop_process(self.proc)
        self._log.close()
        return code


class _bus_env:
    """Point this process's clients at the private bus for a block."""

    def __init__(self, bus: PrivateBus):
        self.bus = bus

    def __enter__(self):
        self.saved = {k: os.environ.get(k) for k in self.bus.env()}
        os.environ.update(self.bus.env())

    def __exit__(self, *exc):
        for k, v in self.saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture
def start_daemon(private_bus, tmp_path, monkeypatch, request):
    """Start daemons on the private bus; each is stopped (and its log shown on failure)."""
    started: list[Daemon] = []
    for k, v in private_bus.env().items():
        monkeypatch.setenv(k, v)

    def start(gpus="4", args=(), env=None, wait=True, runtime_dir=None) -> Daemon:
        d = Daemon(private_bus, tmp_path, gpus, args, env, runtime_dir)
        started.append(d)
        return d.wait_ready() if wait else d

    yield start
    for d in started:
        d.stop()
        if getattr(request.node, "rep_call", None) and request.node.rep_call.failed:
            print(f"--- daemon log ({d.log_path}) ---\n{d.log()}")


@pytest.fixture
def daemon(start_daemon):
    """One daemon on 4 idle simulated GPUs."""
    return start_daemon()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    setattr(item, f"rep_{rep.when}", rep)


def gpuctl(*args, env=None, timeout=30, input=None):
    """Run gpuctl as a real process; returns the CompletedProcess."""
    return subprocess.run(
        [sys.executable, "-m", "resourced.cli", *args],
        env={**os.environ, **(env or {})}, capture_output=True, text=True,
        timeout=timeout, input=input, check=False,
    )
