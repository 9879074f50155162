"""Start-up under a real systemd: from `systemctl start resourced` to READY=1, with no claims
and with 1,000 claims to restore, and from a bus-activating call to its answer.

It boots systemd 252 in namespaces of its own with resourced installed as the tests do
(tests/systemd/harness.py: a venv under /opt, `gpuctl init --system` on simulated GPUs,
`gpuctl service enable --system`), and times inside it, so that entering the namespace is
not counted:

* start: `systemctl stop`, then the wall time of `systemctl start` (which returns at
  READY=1, Type=notify), and systemd's own ExecMainStartTimestamp -> ActiveEnterTimestamp
  (fork to READY=1);
* restart with N claims: N claims (`ram` 1M each, one owner) are made, then the same for
  `systemctl restart` (stop included) and for `systemctl start` after a stop (the claims
  are kept in /run/resourced: RuntimeDirectoryPreserve=yes);
* activation: the service stopped, the wall time of a `busctl call ... Describe` that
  starts it, against the same call to the running service.

Root only (it boots systemd); figures, never pass/fail. SIGTERM (like ^C) ends it through
the namespace's teardown.

    sudo .venv/bin/python benchmarks/systemd_start.py [--rounds 5] [--claims 1000]
"""

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _harness import installed_under_systemd, summary

from tests.systemd.harness import UNIT, Namespace, sigterm_interrupts

# Runs inside, with the venv's python: times systemctl and busctl there.
TIMER_PY = r"""
import json, subprocess, sys, time
UNIT = "resourced.service"
DESCRIBE = ("busctl", "call", "org.resourced", "/org/resourced", "org.resourced.Manager",
            "Describe")

def run(*argv):
    return subprocess.run(argv, check=True, capture_output=True, text=True, timeout=120).stdout

def show(*props):
    out = run("systemctl", "show", UNIT, "--property=" + ",".join(props))
    return dict(line.split("=", 1) for line in out.splitlines())

def timed(*argv):
    t = time.monotonic()
    run(*argv)
    return time.monotonic() - t

what, rounds = sys.argv[1], int(sys.argv[2])
results = []
for _ in range(rounds):
    run("systemctl", "reset-failed", UNIT)  # 5 starts in 10 s would hit the start limit
    if what in ("start", "activate"):
        run("systemctl", "stop", UNIT)
    if what == "start":
        wall = timed("systemctl", "start", UNIT)
    elif what == "restart":
        wall = timed("systemctl", "restart", UNIT)
    else:  # activate, call
        wall = timed(*DESCRIBE)
    p = show("ExecMainStartTimestampMonotonic", "ActiveEnterTimestampMonotonic", "StatusText")
    ready = (int(p["ActiveEnterTimestampMonotonic"]) - int(p["ExecMainStartTimestampMonotonic"]))
    results.append({"wall": wall, "fork_to_ready": ready / 1e6, "status": p["StatusText"]})
print(json.dumps(results))
"""

# Makes N claims of 1M of the ram pool, owned by the given pid, through one connection.
CLAIMS_PY = r"""
import sys
from resourced.client.sync import Client
n, owner = int(sys.argv[1]), int(sys.argv[2])
with Client(bus="system") as c:
    for _ in range(n):
        c.claim(mode="dev", gpus=0, ram="1M", owner_pid=owner)
"""


def line(label: str, samples: list[float]) -> str:
    s = summary([x * 1000 for x in samples])
    return (f"  {label:<50} p50 {s['p50']:7.1f} ms   p90 {s['p90']:7.1f} ms   "
            f"mean {s['mean']:7.1f} ms   (n={s['n']})")


def measure(ns: Namespace, what: str, rounds: int) -> list[dict]:
    return json.loads(ns.python(TIMER_PY, what, str(rounds), timeout=600).stdout)


def report(label: str, results: list[dict]) -> None:
    print(line(f"{label}: wall", [r["wall"] for r in results]))
    if label.startswith(("start", "restart")):
        print(line(f"{label}: fork to READY=1 (systemd)", [r["fork_to_ready"] for r in results]))
    print(f"  {'':<50} StatusText: {results[-1]['status']}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--claims", type=int, default=1000)
    a = p.parse_args()
    print(f"systemd_start: {a.rounds} rounds each; systemd 252 in namespaces, simulated GPUs")
    with installed_under_systemd("systemd_start") as ns:
        report("start, 0 claims", measure(ns, "start", a.rounds))
        report("call to the running service", measure(ns, "call", a.rounds))
        report("bus-activating call to its answer", measure(ns, "activate", a.rounds))

        ns.run("systemctl", "start", UNIT)
        ns.run("systemd-run", "--unit=bench-owner", "--property=Type=exec", "sleep", "infinity")
        owner = ns.show("bench-owner.service", "MainPID")["MainPID"]
        t = time.monotonic()
        ns.python(CLAIMS_PY, str(a.claims), owner, timeout=600)
        print(f"  made {a.claims} claims in {time.monotonic() - t:.1f} s")
        report(f"restart, {a.claims} claims", measure(ns, "restart", a.rounds))
        report(f"start, {a.claims} claims", measure(ns, "start", a.rounds))
        report(f"bus activation, {a.claims} claims", measure(ns, "activate", a.rounds))
        status = ns.show(UNIT, "StatusText")["StatusText"]
        if f"{a.claims} claim(s)" not in status:
            print(f"systemd_start: the claims were not all restored: {status}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    with sigterm_interrupts():  # raises in main, whose finally tears the namespace down
        sys.exit(main())
