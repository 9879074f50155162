"""What isolation adds to a one-off run: `gpuctl run --isolate -- true` against `gpuctl run
-- true`, in the same run, under a real systemd.

It boots systemd 252 in namespaces of its own with resourced installed as the tests do
(tests/systemd/harness.py), sets `[daemon] isolation = "opt-in"`, and times inside it,
interleaved (the order alternates every round), whole `gpuctl run` processes as a member
of the access group from a session scope in their slice (isolation confines no root
process, and only processes of their user's slice):

* plain: `gpuctl run -- true`;
* isolated: `gpuctl run --isolate -- true` (the claim, Confine: the helper's
  StartTransientUnit and the wait until the pid is inside, then the command);
* for scale, as root, `systemd-run --scope true`, what a scope alone costs from a shell,
  and the same with a device filter (`DevicePolicy=closed`, one `DeviceAllow=`), which systemd
  loads as a BPF program: the part of the cost that is systemd's.

Prints the median and p90 of each, and the added latency (isolated minus plain, medians).
Target: under 20 ms added.  The first isolated run, which starts the helper by bus
activation, is a warm-up and not counted.

Root only (it boots systemd); figures, never pass/fail.

    sudo .venv/bin/python benchmarks/isolation_latency.py [--rounds 30]
"""

import argparse
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _harness import installed_under_systemd, summary

from tests.systemd.harness import CONFIG, UNIT, USERS, sigterm_interrupts

SCOPES = {"scope": ["systemd-run", "--quiet", "--scope", "true"],
          "filtered scope": ["systemd-run", "--quiet", "--scope", "-p", "DevicePolicy=closed",
                             "-p", "DeviceAllow=/dev/char/195:0 rw", "true"]}

# Runs inside, with the venv's python: times the commands there.
TIMER_PY = r"""
import json, subprocess, sys, time
kinds, rounds = json.loads(sys.argv[1]), int(sys.argv[2])
for argv in kinds.values():  # warm-up: the helper's activation, caches
    subprocess.run(argv, check=True, capture_output=True, timeout=60)
times = {k: [] for k in kinds}
for i in range(rounds):
    order = list(kinds) if i % 2 == 0 else list(reversed(kinds))
    for k in order:
        t = time.monotonic()
        subprocess.run(kinds[k], check=True, capture_output=True, timeout=60)
        times[k].append(time.monotonic() - t)
print(json.dumps(times))
"""


def line(label: str, samples: list[float]) -> str:
    s = summary([x * 1000 for x in samples])
    return (f"  {label:<40} p50 {s['p50']:7.1f} ms   p90 {s['p90']:7.1f} ms   "
            f"mean {s['mean']:7.1f} ms   (n={s['n']})")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=30)
    a = p.parse_args()
    print(f"isolation_latency: {a.rounds} rounds; systemd 252 in namespaces, simulated GPUs")
    with installed_under_systemd("isolation_latency") as ns:
        text = ns.run("cat", CONFIG).stdout
        ns.write(CONFIG, re.sub(r"(?m)^\[daemon\]\s*\n", '[daemon]\nisolation = "opt-in"\n',
                                text, count=1) if "[daemon]" in text
                 else '[daemon]\nisolation = "opt-in"\n' + text)
        ns.run("systemctl", "restart", UNIT)
        gpuctl = str(ns.venv / "bin/gpuctl")
        runs = {"plain": [gpuctl, "run", "--", "true"],
                "isolated": [gpuctl, "run", "--isolate", "--", "true"]}
        times = json.loads(ns.python(TIMER_PY, json.dumps(runs), str(a.rounds), timeout=900,
                                     user=USERS["alice"][0], session=True).stdout)
        times |= json.loads(ns.python(TIMER_PY, json.dumps(SCOPES), str(a.rounds),
                                      timeout=900).stdout)
        print(line("gpuctl run -- true", times["plain"]))
        print(line("gpuctl run --isolate -- true", times["isolated"]))
        print(line("systemd-run --scope true", times["scope"]))
        print(line("the same with a device filter", times["filtered scope"]))
        added = (summary(times["isolated"])["p50"] - summary(times["plain"])["p50"]) * 1000
        print(f"  added by isolation (p50 - p50): {added:.1f} ms (target < 20 ms)")
    return 0


if __name__ == "__main__":
    with sigterm_interrupts():
        sys.exit(main())
