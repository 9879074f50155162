"""Job start latency the prolog adds: ``srun --gres=gpu:1 -- true`` with and without it.

Starts a daemon on a private bus (4 simulated GPUs, all of them Slurm's) and, as root,
three one-node Slurm clusters on localhost (tests/system/slurm_cluster.py: munged,
slurmctld, slurmd): one without a prolog (the baseline), one whose prolog and epilog do
nothing (what Slurm itself spends on running one), one whose Prolog=/Epilog= run
``gpuctl slurm prolog``/``epilog``.  Runs the jobs interleaved round-robin and prints the
median and p90 of each and what each adds to the baseline.

Target: the prolog adds under 50 ms (median).  Needs root and the packages slurmctld,
slurmd, slurm-client and munge (scripts/system-deps.sh).

    sudo .venv/bin/python benchmarks/slurm_prolog.py [--runs 20]
"""

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from _harness import daemon_on_private_bus, percentile

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "system"))
from slurm_cluster import SlurmCluster, missing_tools

VENV_BIN = Path(sys.executable).parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    if missing_tools():
        print(f"needs {', '.join(missing_tools())} (scripts/system-deps.sh, as root)")
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "config.toml"
        config.write_text('[slurm]\ngpus = "all"\n')
        with daemon_on_private_bus(gpus=4, args=("--config", str(config))) as rig:
            env = {"DBUS_SESSION_BUS_ADDRESS": rig.address, "RESOURCED_BUS": "session"}
            variants = {
                "no prolog (baseline)": ("", ""),
                "a prolog that does nothing": ("exit 0", "exit 0"),
                "gpuctl slurm prolog": (f"exec {VENV_BIN}/gpuctl slurm prolog",
                                        f"exec {VENV_BIN}/gpuctl slurm epilog"),
            }
            clusters = {name: SlurmCluster(range(4), env) for name in variants}
            try:
                for name, (prolog, epilog) in variants.items():
                    clusters[name].write_config(prolog=prolog, epilog=epilog)
                    clusters[name].start()
                times = measure(clusters, args.runs)
            finally:
                for cluster in clusters.values():
                    cluster.stop()
    report(times)
    return 0


def measure(clusters: dict[str, SlurmCluster], runs: int) -> dict[str, list[float]]:
    """Seconds per ``srun -- true``, per cluster; two warm-up rounds are not counted."""
    times = {name: [] for name in clusters}
    names = list(clusters)
    for i in range(runs + 2):
        for name in names[i % len(names):] + names[:i % len(names)]:
            start = time.perf_counter()
            cp = clusters[name].run("srun", "--gres=gpu:1", "--", "true", timeout=60)
            elapsed = time.perf_counter() - start
            if cp.returncode != 0:
                raise SystemExit(f"srun failed on {name}: {cp.stderr}")
            if i >= 2:
                times[name].append(elapsed)
    return times


def report(times: dict[str, list[float]]) -> None:
    base = statistics.median(next(iter(times.values())))
    print(f"srun --gres=gpu:1 -- true, {len(next(iter(times.values())))} runs each")
    for name, values in times.items():
        median = statistics.median(values)
        print(f"  {name:34} median {median * 1e3:7.1f} ms  p90 {percentile(sorted(values), 90) * 1e3:7.1f} ms"
              f"  added {(median - base) * 1e3:+6.1f} ms")
    print("target: the prolog adds under 50 ms (median)")


if __name__ == "__main__":
    sys.exit(main())
