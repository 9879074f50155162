"""gpuctl start-up: wall time of whole ``gpuctl`` processes against ``import click``.

Starts its own private session bus and a daemon on it (8 simulated GPUs), then times,
as whole processes, interleaved round-robin (the order rotates every round):

* baseline: ``python -c "import click"``, the least any click CLI can cost;
* reference: ``python -c pass``, the interpreter (and site, with the editable-install
  finder) alone;
* ``python -m resourced.cli free`` and the installed console script ``gpuctl free``,
  which connect to the bus and ask the daemon for FreeGPUs;
* ``gpuctl --help`` and ``gpuctl --version``, which should never touch the bus.

Prints the median and p90 of each and their ratio to the baseline.  Then, through
``python -X importtime``: whether ``gpuctl --help`` (and ``--version``, ``free``) import
dbus_fast or jeepney, and the ten imports with the largest cumulative time in
``gpuctl free`` (median over a few runs), to show where start-up time goes.

Bytecode: by default the commands run with a private ``PYTHONPYCACHEPREFIX`` (and
without ``PYTHONDONTWRITEBYTECODE``), so after the warm-up rounds every module loads from
a cached ``.pyc``, as from an installed package; nothing is written into the source tree.
``--inherit-bytecode-setting`` runs them with this environment's setting instead (with
``PYTHONDONTWRITEBYTECODE=1`` and an editable install, resourced is compiled on every run).

Target: ``gpuctl free`` within 1.5x of the ``import click`` baseline (median);
``gpuctl --help`` imports neither dbus_fast nor jeepney.

``--installed``: as a user runs it, from a regular install rather than an editable one
(whose finder adds about 20 ms to every process).  A wheel of this tree is built and
installed, without its dependencies, into a fresh virtual environment that finds them
where this interpreter does (a ``.pth`` naming its site-packages); no index is asked.
That environment's ``gpuctl free``, ``--help`` and ``--version`` are timed against its
``python -c "import click, jeepney"`` (the baseline: the libraries any such CLI loads)
and ``python -c pass``.  Target: ``gpuctl free`` within 1.1x of that baseline (median).

    python benchmarks/cli_startup.py [--runs 30] [--importtime-runs 5] [--installed]
"""

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _harness import clean_env, daemon_on_private_bus, install_wheel, machine_line, summary

TARGET_RATIO = 1.5
INSTALLED_TARGET_RATIO = 1.1
BUS_LIBRARIES = ("dbus_fast", "jeepney", "asyncio")


def gpuctl_command() -> list[str] | None:
    """The console script next to this interpreter, run as a program; None if absent."""
    script = Path(sys.executable).with_name("gpuctl")
    return [str(script)] if script.is_file() and os.access(script, os.X_OK) else None


def commands() -> dict[str, list[str]]:
    py = sys.executable
    gpuctl = gpuctl_command()
    cli = gpuctl or [py, "-m", "resourced.cli"]
    cmds = {
        'python -c "import click"': [py, "-c", "import click"],
        "python -c pass": [py, "-c", "pass"],
        "python -m resourced.cli free": [py, "-m", "resourced.cli", "free"],
    }
    if gpuctl:
        cmds["gpuctl free"] = gpuctl + ["free"]
    label = "gpuctl" if gpuctl else "python -m resourced.cli"
    cmds[f"{label} --help"] = cli + ["--help"]
    cmds[f"{label} --version"] = cli + ["--version"]
    return cmds


BASELINE = 'python -c "import click"'
INSTALLED_BASELINE = 'python -c "import click, jeepney"'


def installed_commands(bin_dir: Path) -> dict[str, list[str]]:
    py, gpuctl = str(bin_dir / "python"), str(bin_dir / "gpuctl")
    return {
        INSTALLED_BASELINE: [py, "-c", "import click, jeepney"],
        "python -c pass": [py, "-c", "pass"],
        "gpuctl free": [gpuctl, "free"],
        "gpuctl --help": [gpuctl, "--help"],
        "gpuctl --version": [gpuctl, "--version"],
    }


def time_once(cmd: list[str], env: dict[str, str]) -> tuple[float, int, str]:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    return time.perf_counter() - t0, proc.returncode, proc.stderr.decode(errors="replace")


def time_interleaved(cmds: dict[str, list[str]], env, runs: int, warmup: int):
    names = list(cmds)
    samples: dict[str, list[float]] = {n: [] for n in names}
    failures: dict[str, str] = {}
    for r in range(warmup + runs):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            seconds, rc, err = time_once(cmds[name], env)
            if rc != 0:
                failures.setdefault(name, f"exit {rc}: {err.strip()[-300:]}")
            if r >= warmup:
                samples[name].append(seconds)
    return samples, failures


def importtime(cmd: list[str], env, python: str = sys.executable) -> list[tuple]:
    """(module, depth, self_us, cumulative_us) for each import of one run of ``cmd``, run
    by ``python``."""
    argv = [python, "-X", "importtime"]
    argv += cmd[1:] if cmd[0] == python else cmd  # a console script is Python too
    err = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True).stderr
    rows = []
    for line in err.splitlines():
        if not line.startswith("import time:") or "imported package" in line:
            continue
        self_us, cum_us, name = line[len("import time:"):].split("|")
        depth = (len(name) - len(name.lstrip(" ")) - 1) // 2
        rows.append((name.strip(), depth, int(self_us), int(cum_us)))
    return rows


def report_times(samples, failures, baseline: str, target: float) -> None:
    base = summary(samples[baseline])
    labels = {n: f"{n} (baseline)" if n == baseline else n for n in samples}
    width = max(len(label) for label in labels.values()) + 2
    print(f"\n{'command':<{width}}{'runs':>5}{'median ms':>11}{'p90 ms':>9}"
          f"{'x base (median)':>17}{'x base (p90)':>14}")
    for name, values in samples.items():
        s = summary(values)
        print(f"{labels[name]:<{width}}{s['n']:>5}{s['p50'] * 1e3:>11.1f}{s['p90'] * 1e3:>9.1f}"
              f"{s['p50'] / base['p50']:>17.2f}{s['p90'] / base['p90']:>14.2f}")
    for name in samples:
        if name.endswith(" free"):
            ratio = summary(samples[name])["p50"] / base["p50"]
            verdict = "met" if ratio <= target else "MISSED"
            print(f"target: {name} median within {target:g}x of the baseline: "
                  f"{ratio:.2f}x ({verdict})")
    for name, why in failures.items():
        print(f"note: {name} failed at least once ({why})")


def report_bus_imports(cmds, env, python: str) -> None:
    print("\nbus libraries imported (python -X importtime):")
    for name, cmd in cmds.items():
        if not name.startswith(("gpuctl", "python -m")):
            continue
        modules = {row[0] for row in importtime(cmd, env, python)}
        found = []
        for lib in BUS_LIBRARIES:
            hits = sorted(m for m in modules if m == lib or m.startswith(lib + "."))
            found.append(f"{lib}: {'yes (' + str(len(hits)) + ' modules)' if hits else 'no'}")
        print(f"  {name:<32}{', '.join(found)}   [{len(modules)} modules in all]")


def report_top_imports(name, cmd, env, python: str, runs: int, top: int = 10) -> None:
    per_module: dict[str, list[tuple[int, int, int]]] = {}
    totals = []
    for _ in range(runs):
        rows = importtime(cmd, env, python)
        totals.append(sum(cum for _, depth, _, cum in rows if depth == 0))
        for module, depth, self_us, cum_us in rows:
            per_module.setdefault(module, []).append((depth, self_us, cum_us))
    med = {
        m: (v[0][0], statistics.median(x[1] for x in v), statistics.median(x[2] for x in v))
        for m, v in per_module.items()
    }
    ranked = sorted(med.items(), key=lambda kv: kv[1][2], reverse=True)[:top]
    print(f"\ntop {top} cumulative imports of `{name}` (median of {runs} runs of "
          f"-X importtime; all top-level imports together: {statistics.median(totals) / 1e3:.1f} ms)")
    print(f"  {'cumulative ms':>13}{'self ms':>9}  module (indent = nesting)")
    for module, (depth, self_us, cum_us) in ranked:
        print(f"  {cum_us / 1e3:>13.1f}{self_us / 1e3:>9.1f}  {'  ' * depth}{module}")


def bytecode_line(pycache: str | None) -> str:
    if pycache:
        return "bytecode: cached under a private PYTHONPYCACHEPREFIX, filled by the warm-up"
    setting = {k: os.environ[k] for k in ("PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX")
               if k in os.environ}
    return f"bytecode: as inherited ({setting or 'default: .pyc written next to sources'})"


def run(args, pycache: str | None, installed: Path | None) -> None:
    """Time the commands; those of the environment whose bin folder is ``installed``
    (PYTHONPATH then dropped: it would find a source tree first), else this one's."""
    cmds = installed_commands(installed) if installed else commands()
    python = str(installed / "python") if installed else sys.executable
    baseline, target = ((INSTALLED_BASELINE, INSTALLED_TARGET_RATIO) if installed
                        else (BASELINE, TARGET_RATIO))
    print(f"cli_startup: {args.runs} interleaved runs of each command after {args.warmup} "
          "warm-up rounds; daemon with "
          f"{args.gpus} simulated GPUs on a private session bus (RESOURCED_BUS unset)")
    print(machine_line())
    print(bytecode_line(pycache))
    if installed:
        print("commands: a wheel of this tree installed in a fresh virtual environment")
    elif gpuctl_command() is None:
        print(f"note: no console script next to {sys.executable}; gpuctl rows use -m")
    with daemon_on_private_bus(args.gpus) as bus:
        env = clean_env(bus.address)
        if installed:
            env.pop("PYTHONPATH", None)
        if pycache:
            env.pop("PYTHONDONTWRITEBYTECODE", None)
            env["PYTHONPYCACHEPREFIX"] = pycache
        free_cmd = cmds.get("gpuctl free") or cmds["python -m resourced.cli free"]
        out = subprocess.run(free_cmd, env=env, capture_output=True, text=True)
        shown = " ".join([Path(free_cmd[0]).name, *free_cmd[1:]])
        print(f"`{shown}` printed {out.stdout.strip()!r} (exit {out.returncode})")
        samples, failures = time_interleaved(cmds, env, args.runs, args.warmup)
        report_times(samples, failures, baseline, target)
        report_bus_imports(cmds, env, python)
        free_name = "gpuctl free" if "gpuctl free" in cmds else "python -m resourced.cli free"
        report_top_imports(free_name, free_cmd, env, python, args.importtime_runs)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=30, help="timed runs of each command (30)")
    p.add_argument("--warmup", type=int, default=2, help="untimed rounds first (2)")
    p.add_argument("--importtime-runs", type=int, default=5,
                   help="runs of -X importtime behind the top-10 table (5)")
    p.add_argument("--gpus", type=int, default=8, help="simulated GPUs in the daemon (8)")
    p.add_argument("--inherit-bytecode-setting", action="store_true",
                   help="keep PYTHONDONTWRITEBYTECODE/PYTHONPYCACHEPREFIX as inherited")
    p.add_argument("--installed", action="store_true",
                   help="time a wheel of this tree installed in a fresh virtual environment")
    args = p.parse_args()
    pycache = None if args.inherit_bytecode_setting else tempfile.mkdtemp(prefix="pycache-")
    where = Path(tempfile.mkdtemp(prefix="cli-startup-")) if args.installed else None
    try:
        run(args, pycache, install_wheel(where) if where else None)
    finally:
        if pycache:
            shutil.rmtree(pycache, ignore_errors=True)
        if where:
            shutil.rmtree(where, ignore_errors=True)


if __name__ == "__main__":
    main()
