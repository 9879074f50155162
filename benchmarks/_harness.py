"""What the benchmark scripts share: a daemon on a private bus, resourced under a real
systemd, and percentiles.

Not a benchmark itself.  The scripts import it as ``_harness`` (``python benchmarks/X.py``
puts this folder first on ``sys.path``).
"""

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from resourced.linux.privatebus import PrivateBus

READY_TIMEOUT = 15.0
ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Rig:
    bus: PrivateBus
    daemon: subprocess.Popen

    @property
    def address(self) -> str:
        return self.bus.address


def clean_env(bus_address: str) -> dict[str, str]:
    """Our environment pointed at the private bus, with no resourced or D-Bus leftovers.

    ``RESOURCED_BUS`` is left unset on purpose: clients find the daemon the way a user's
    would, by asking the session bus whether ``org.resourced`` is owned there.
    """
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RESOURCED_", "DBUS_"))}
    env["DBUS_SESSION_BUS_ADDRESS"] = bus_address
    return env


@contextlib.contextmanager
def daemon_on_private_bus(gpus: int | str = 8, args: tuple[str, ...] = (),
                          runtime_parent: str | None = None, state_dir: str | None = None):
    """Yield a ``Rig`` (the private bus and the ready daemon's process on it); stop both
    however the block ends.  ``gpus`` is ``RESOURCED_SIMULATED_GPUS``: a count, or the path
    of a simulation file.

    This process's own environment points at the private bus for the duration, so that
    ``resourced.Client(bus="session")`` here finds it.  The daemon keeps its claims in a
    fresh runtime directory on tmpfs where there is one (as ``/run`` and
    ``$XDG_RUNTIME_DIR`` are in production) unless ``runtime_parent`` names another
    place; its state directory is a fresh one there unless ``state_dir`` names one
    (filled beforehand); ``args`` go to the daemon's command line.  Its log goes to a temporary file, printed
    only if it fails to come up.
    """
    bus = PrivateBus().start()
    saved = {k: os.environ.get(k) for k in ("DBUS_SESSION_BUS_ADDRESS", "RESOURCED_BUS")}
    log = tempfile.TemporaryFile(mode="w+")
    runtime_dir = tempfile.mkdtemp(prefix="resourced-bench-", dir=runtime_parent or _tmpfs())
    proc = None
    try:
        env = clean_env(bus.address)
        os.environ["DBUS_SESSION_BUS_ADDRESS"] = bus.address
        os.environ.pop("RESOURCED_BUS", None)
        env["RESOURCED_SIMULATED_GPUS"] = str(gpus)
        env["RESOURCED_RUNTIME_DIR"] = runtime_dir
        env["RESOURCED_STATE_DIR"] = state_dir or os.path.join(runtime_dir, "state")
        proc = subprocess.Popen(
            [sys.executable, "-m", "resourced.daemon", "--session", *args],
            env=env, stdout=log, stderr=subprocess.STDOUT,
        )
        wait_ready(proc, log)
        yield Rig(bus, proc)
    finally:
        if proc is not None:
            stop_process(proc)
        bus.stop()
        log.close()
        shutil.rmtree(runtime_dir, ignore_errors=True)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def install_wheel(where: Path) -> Path:
    """A virtual environment in ``where`` with a wheel of this tree installed (no
    dependencies: a ``.pth`` points at this interpreter's site-packages for them); its
    bin folder."""
    import sysconfig

    venv = where / "venv"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w",
                    str(where), str(ROOT)], check=True, timeout=300)
    [wheel] = where.glob("resourced-*.whl")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=120)
    python = venv / "bin" / "python"
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()"
                           "['purelib'])"], check=True, capture_output=True, text=True,
                          timeout=30).stdout.strip()
    Path(site, "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q",
                    "--no-deps", "--no-index", str(wheel)], check=True, timeout=300)
    return venv / "bin"


def stop_process(proc: subprocess.Popen, grace: float = 10) -> None:
    """SIGTERM a process still running, then SIGKILL it ``grace`` seconds later."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


def _tmpfs() -> str | None:
    """A tmpfs folder for the daemon's runtime directory, or None for the default temp."""
    for candidate in (os.environ.get("XDG_RUNTIME_DIR"), "/dev/shm"):
        if candidate and os.path.isdir(candidate) and os.access(candidate, os.W_OK):
            return candidate
    return None


def wait_ready(proc: subprocess.Popen, log, timeout: float | None = None) -> None:
    """Poll with a ping until the daemon answers; give up after ``timeout`` seconds
    (READY_TIMEOUT if None)."""
    from resourced import Client

    timeout = READY_TIMEOUT if timeout is None else timeout
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            log.seek(0)
            raise RuntimeError(f"daemon exited with {proc.returncode}:\n{log.read()}")
        try:
            with Client(bus="session", timeout=1.0) as c:
                c.ping()
            return
        except Exception as exc:  # noqa: BLE001 - not up yet
            if time.monotonic() > deadline:
                log.seek(0)
                raise RuntimeError(f"daemon not ready after {timeout}s ({exc}):\n"
                                   f"{log.read()}") from exc
            time.sleep(0.02)


def rss_mb(pid: int) -> float:
    """A process's resident memory (VmRSS), in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of an already sorted list."""
    if not sorted_values:
        return float("nan")
    rank = max(1, -(-len(sorted_values) * q // 100))  # ceil(n * q / 100), at least 1
    return sorted_values[int(rank) - 1]


def summary(samples: list[float]) -> dict[str, float]:
    """p50, p90, p99 and mean of a list of durations (any unit)."""
    s = sorted(samples)
    return {
        "n": len(s),
        "p50": percentile(s, 50),
        "p90": percentile(s, 90),
        "p99": percentile(s, 99),
        "mean": sum(s) / len(s) if s else float("nan"),
    }


def machine_line() -> str:
    """Interpreter, CPUs, load and source tree, so a figure can be tied to what made it."""
    return (f"python {sys.version.split()[0]} ({sys.executable}), "
            f"{os.cpu_count()} CPU(s), load avg {os.getloadavg()[0]:.2f}, tree {_tree()}")


def _tree() -> str:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        head = subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, timeout=5).stdout.strip()
        dirty = subprocess.run(["git", "-C", root, "status", "--porcelain", "--", "resourced"],
                               capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{head or 'unknown'}{' + uncommitted changes in resourced/' if dirty else ''}"


@contextlib.contextmanager
def installed_under_systemd(name: str):
    """systemd 252 booted in namespaces of its own with resourced installed and enabled
    as the systemd tests do (tests/systemd/harness.py); the namespace, torn down after.
    Exits with 2 where it cannot run (not root, no systemd)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.systemd.harness import Namespace, boot_with_resourced, missing_prerequisites

    reason = missing_prerequisites()
    if reason:
        print(f"{name}: cannot run: {reason}", file=sys.stderr)
        sys.exit(2)
    print(machine_line())
    Namespace.recover_stale()
    ns = Namespace()
    try:
        t = time.monotonic()
        boot_with_resourced(ns)
        ns.enable()
        print(f"  set-up (venv, boot, accounts, enable): {time.monotonic() - t:.1f} s "
              f"({', '.join(f'{k} {v:.1f} s' for k, v in ns.timings.items())})")
        yield ns
    finally:
        problems = ns.stop()
        if problems:
            print(f"{name}: left behind: " + "; ".join(problems), file=sys.stderr)
