"""The shell hook's cost: per prompt when nothing changed, and per refresh.

Starts its own private session bus and a daemon on it (4 simulated GPUs), a private
``XDG_RUNTIME_DIR`` (the stamp), then in one bash process (and one zsh process, where zsh
is installed), after ``eval "$(gpuctl shell init bash)"`` and a first refresh:

* per prompt, nothing changed: ``N`` calls of the prompt hook ``_gpuctl_prompt`` in a loop,
  timed with ``$EPOCHREALTIME`` (against the same loop calling an empty function, the
  loop's own cost), with no claim and again on an active development claim;
* per refresh: ``gpuctl_refresh`` (one whole ``gpuctl shell env`` process, its round trips
  to the daemon and the ``eval``) ``R`` times, each timed alone: median and p90;
* what a prompt costs when the stamp changed (another gpuctl of the user's): the same
  refresh, started by the hook.

Target: under 5 ms per prompt when nothing changed (it starts no process: microseconds).

    python benchmarks/prompt_hook.py [--prompts 1000] [--refreshes 20]
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile

from _harness import daemon_on_private_bus, machine_line, summary

TARGET_MS = 5.0

# Each shell prints lines "name value-in-microseconds".  `time` would do for bash, but
# EPOCHREALTIME (bash 5, zsh/datetime) is the same in both and needs no parsing.
BASH = r"""
eval "$(@INIT@ bash)"
now() { _t=${EPOCHREALTIME/[.,]/}; }
empty() { :; }
loop() { local i; now; local s=$_t; for ((i = 0; i < @N@; i++)); do "$1"; done; now
         echo "$2 $(( (_t - s) / @N@ ))"; }
gpuctl_refresh || exit 1
loop empty loop_empty
loop _gpuctl_prompt prompt_no_claim
@CLAIM@
gpuctl_refresh
[[ -n $CUDA_VISIBLE_DEVICES ]] || { echo "no claim seen" >&2; exit 1; }
loop _gpuctl_prompt prompt_on_claim
for ((i = 0; i < @R@; i++)); do now; s=$_t; gpuctl_refresh; now; echo "refresh $((_t - s))"; done
for ((i = 0; i < @R@; i++)); do
    @TOUCH@
    now; s=$_t; _gpuctl_prompt; now; echo "prompt_after_change $((_t - s))"
done
@RELEASE@
"""

ZSH = r"""
zmodload zsh/datetime
eval "$(@INIT@ zsh)"
now() { _t=$(( EPOCHREALTIME * 1000000 )); }
empty() { :; }
loop() { local i s; now; s=$_t; for ((i = 0; i < @N@; i++)); do "$1"; done; now
         printf '%s %d\n' $2 $(( (_t - s) / @N@ )); }
gpuctl_refresh || exit 1
loop empty loop_empty
loop _gpuctl_prompt prompt_no_claim
@CLAIM@
gpuctl_refresh
[[ -n $CUDA_VISIBLE_DEVICES ]] || { echo "no claim seen" >&2; exit 1; }
loop _gpuctl_prompt prompt_on_claim
for ((i = 0; i < @R@; i++)); do now; s=$_t; gpuctl_refresh; now; printf 'refresh %d\n' $((_t - s)); done
for ((i = 0; i < @R@; i++)); do
    @TOUCH@
    now; s=$_t; _gpuctl_prompt; now; printf 'prompt_after_change %d\n' $((_t - s))
done
@RELEASE@
"""


def measure(shell: str, script: str, env: dict, prompts: int, refreshes: int,
            owner_pid: int) -> dict[str, list[float]]:
    """Run the script in ``shell``; each figure's samples, in microseconds."""
    py = sys.executable
    claim = (f"_ref=$({py} -m resourced.cli claim --gpus 1 --owner-pid {owner_pid} "
             "--task-name prompt-bench) || exit 1")
    release = f'{py} -m resourced.cli release --force --allocation "$_ref" || exit 1'
    touch = f'{py} -c "from resourced.linux.shell_stamp import touch_stamp; touch_stamp()"'
    for key, value in (("@INIT@", f"{py} -m resourced.cli shell init"), ("@N@", str(prompts)),
                       ("@R@", str(refreshes)), ("@CLAIM@", claim), ("@TOUCH@", touch),
                       ("@RELEASE@", release)):
        script = script.replace(key, value)
    argv = {"bash": ["bash", "--norc", "--noprofile", "-c", script],
            "zsh": ["zsh", "-f", "-c", script]}[shell]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600,
                          check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{shell} failed ({done.returncode}):\n{done.stderr}")
    samples: dict[str, list[float]] = {}
    for line in done.stdout.splitlines():
        name, value = line.split()
        samples.setdefault(name, []).append(float(value))
    return samples


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--prompts", type=int, default=1000, help="prompt calls per loop")
    p.add_argument("--refreshes", type=int, default=20, help="refreshes timed")
    args = p.parse_args()
    print(machine_line())
    shells = [s for s in ("bash", "zsh") if shutil.which(s)]
    runtime = tempfile.mkdtemp(prefix="resourced-prompt-bench-")
    os.chmod(runtime, 0o700)
    failed = False
    try:
        with daemon_on_private_bus(gpus=4) as rig:
            env = {k: v for k, v in os.environ.items() if not k.startswith("RESOURCED_")}
            env.update(DBUS_SESSION_BUS_ADDRESS=rig.address, XDG_RUNTIME_DIR=runtime)
            for shell in shells:
                version = subprocess.run([shell, "-c", "echo ${BASH_VERSION:-$ZSH_VERSION}"],
                                         capture_output=True, text=True, timeout=10, check=True)
                s = measure(shell, BASH if shell == "bash" else ZSH, env, args.prompts,
                            args.refreshes, os.getpid())
                empty = s["loop_empty"][0]
                print(f"\n{shell} {version.stdout.strip()}: {args.prompts} prompts per loop, "
                      f"{args.refreshes} refreshes")
                for name, what in (("prompt_no_claim", "prompt, nothing changed, no claim"),
                                   ("prompt_on_claim", "prompt, nothing changed, on a claim")):
                    us = s[name][0]
                    ok = us / 1000 < TARGET_MS
                    failed |= not ok
                    print(f"  {what:<40} {us:8.1f} us  (loop alone {empty:.1f} us; "
                          f"target < {TARGET_MS:g} ms: {'ok' if ok else 'MISSED'})")
                for name, what in (("refresh", "gpuctl_refresh (a whole gpuctl)"),
                                   ("prompt_after_change", "prompt after the stamp changed")):
                    st = summary([v / 1000 for v in s[name]])
                    print(f"  {what:<40} {st['p50']:8.1f} ms median, {st['p90']:.1f} ms p90")
    finally:
        shutil.rmtree(runtime, ignore_errors=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
