"""Daemon start: wall time from spawning ``resourced`` to its first answer on the bus.

What ``systemctl restart resourced``, bus activation and every test that starts a daemon
pay.  A wheel of this tree is installed into a fresh virtual environment (as a user
installs it: pip compiles its bytecode), and its ``resourced --session`` is started again
and again on a private session bus with 4 simulated GPUs.  Each start is timed from the
spawn to the reply of the first call: this process watches the bus for the daemon taking
``org.resourced`` (it takes the name last, once its API is complete), then calls its
``Ping``; the daemon is stopped (SIGTERM) before the next start.

* cold: a fresh runtime and state directory each time, as on a new machine;
* warm: the same directories again, as a restart finds them (claims to restore, the
  calendar and the usage history to open);
* uncompiled (for reference): cold, with bytecode that cannot be read or written, so the
  daemon compiles everything it imports, as each test's daemon did before ./dev compiled
  resourced;
* ``python -c pass`` and ``python -c "import dbus_fast"`` from the same environment, the
  floor under any start.

Prints the median and p90 of each (``--runs``, 20 by default), then the ten imports with
the largest cumulative time in ``import resourced.daemon.main`` (``-X importtime``).
Target: the median cold and warm start within 0.3 s on an idle machine.

    python benchmarks/daemon_start.py [--runs 20]
"""

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _harness import clean_env, install_wheel, machine_line, stop_process, summary
from jeepney import DBusAddress, MatchRule, message_bus, new_method_call
from jeepney.io.blocking import open_dbus_connection

from resourced.linux.privatebus import PrivateBus
from resourced.protocol.names import BUS_NAME, MANAGER_PATH

TARGET = 0.3
START_TIMEOUT = 20.0


def time_start(resourced: Path, env: dict[str, str], bus_address: str) -> float:
    """Seconds from the spawn to the reply of the first Ping; the daemon is stopped."""
    with open_dbus_connection(bus_address) as conn:
        rule = MatchRule(type="signal", sender="org.freedesktop.DBus",
                         interface="org.freedesktop.DBus", member="NameOwnerChanged",
                         path="/org/freedesktop/DBus")
        rule.add_arg_condition(0, BUS_NAME)
        conn.send_and_get_reply(message_bus.AddMatch(rule))
        with conn.filter(rule) as owners:
            t0 = time.perf_counter()
            proc = subprocess.Popen([str(resourced), "--session"], env=env,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            try:
                while True:
                    signal = conn.recv_until_filtered(owners, timeout=START_TIMEOUT)
                    if signal.body[2]:  # a new owner
                        break
                ping = new_method_call(DBusAddress(MANAGER_PATH, BUS_NAME,
                                                   "org.freedesktop.DBus.Peer"), "Ping")
                conn.send_and_get_reply(ping, timeout=START_TIMEOUT)
                elapsed = time.perf_counter() - t0
            except TimeoutError:
                stop_process(proc)
                raise RuntimeError(f"no answer within {START_TIMEOUT} s: "
                                   f"{proc.stderr.read().decode(errors='replace')[-2000:]}")
            finally:
                stop_process(proc)
                proc.stderr.close()
    return elapsed


def time_floor(python: Path, code: str, env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    subprocess.run([str(python), "-c", code], env=env, check=True)
    return time.perf_counter() - t0


def report(name: str, samples: list[float], target: float | None) -> None:
    s = summary(samples)
    verdict = ""
    if target is not None:
        verdict = f"  {'within' if s['p50'] <= target else 'OVER'} the {target:g} s target"
    print(f"  {name:<32} p50 {s['p50'] * 1000:6.0f} ms   p90 {s['p90'] * 1000:6.0f} ms{verdict}")


def top_imports(python: Path, env: dict[str, str], top: int = 10) -> None:
    done = subprocess.run([str(python), "-X", "importtime", "-c", "import resourced.daemon.main"],
                          env=env, capture_output=True, text=True, check=True)
    rows = []
    for line in done.stderr.splitlines():
        parts = [p.strip() for p in line.removeprefix("import time:").split("|")]
        if len(parts) == 3 and parts[1].isdigit():
            rows.append((int(parts[1]), parts[2]))
    total = max((us for us, name in rows if name == "resourced.daemon.main"), default=0)
    print(f"import resourced.daemon.main: {total / 1000:.0f} ms; the largest (cumulative):")
    for us, name in sorted(rows, reverse=True)[1:top + 1]:
        print(f"  {us / 1000:6.1f} ms  {name.strip()}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=20, help="timed starts of each kind (20)")
    args = p.parse_args()
    print(machine_line())
    where = Path(tempfile.mkdtemp(prefix="daemon-start-"))
    bus = PrivateBus().start()
    try:
        bin_dir = install_wheel(where)
        python, resourced = bin_dir / "python", bin_dir / "resourced"
        compiled = list((where / "venv").rglob("daemon/__pycache__/main.*.pyc"))
        print(f"resourced: a wheel of this tree in a fresh venv; bytecode compiled by pip: "
              f"{'yes' if compiled else 'NO'}")
        base = clean_env(bus.address)
        base.pop("PYTHONDONTWRITEBYTECODE", None)
        base["RESOURCED_SIMULATED_GPUS"] = "4"
        uncompiled = {**base, "PYTHONDONTWRITEBYTECODE": "1",
                      "PYTHONPYCACHEPREFIX": str(where / "no-pycache")}

        def dirs(env, name):
            return {**env, "RESOURCED_RUNTIME_DIR": str(where / name / "run"),
                    "RESOURCED_STATE_DIR": str(where / name / "state")}

        time_start(resourced, dirs(base, "warm"), bus.address)  # warm-up, and warm's dirs
        samples: dict[str, list[float]] = {"cold": [], "warm": [], "uncompiled": [],
                                           "python -c pass": [], "import dbus_fast": []}
        for i in range(args.runs):
            samples["cold"].append(time_start(resourced, dirs(base, f"cold-{i}"), bus.address))
            samples["warm"].append(time_start(resourced, dirs(base, "warm"), bus.address))
            samples["uncompiled"].append(
                time_start(resourced, dirs(uncompiled, f"uncompiled-{i}"), bus.address))
            samples["python -c pass"].append(time_floor(python, "pass", base))
            samples["import dbus_fast"].append(time_floor(python, "import dbus_fast", base))
        print(f"spawn to first answer, {args.runs} starts each:")
        report("cold (fresh directories)", samples["cold"], TARGET)
        report("warm (a restart's directories)", samples["warm"], TARGET)
        report("uncompiled (cold, compiling)", samples["uncompiled"], None)
        report("python -c pass", samples["python -c pass"], None)
        report('python -c "import dbus_fast"', samples["import dbus_fast"], None)
        over = (statistics.median(samples["cold"])
                - statistics.median(samples["import dbus_fast"]))
        print(f"  cold over the dbus_fast floor: {over * 1000:.0f} ms")
        top_imports(python, base)
    finally:
        bus.stop()
        shutil.rmtree(where, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
