#!/bin/sh
# The GPU acceptance run (scripts/gpu_acceptance.py says what it checks): on a machine
# with the NVIDIA driver, a few minutes, no network.
#
# It makes a fresh virtual environment that imports resourced from this checkout and
# its dependencies (dbus-fast, jeepney, click, nvidia-ml-py) from the environment of
# $PYTHON (default: the checkout's .venv, which `./dev` makes, else python3), so nothing
# is downloaded or built; then runs every check there.
#
#   scripts/gpu-acceptance.sh [--report FILE] [--simulated N]
#
# Exit 0: every check passed or was skipped; 1: one failed; 77: no NVIDIA driver here
# (nothing checked, nothing changed); 2: the environment could not be made.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-}
if [ -z "$python" ]; then
    if [ -x "$root/.venv/bin/python" ]; then python=$root/.venv/bin/python; else python=python3; fi
fi
if ! "$python" -c 'import click, dbus_fast, jeepney, pynvml' 2>/dev/null; then
    echo "gpu-acceptance: $python lacks resourced's dependencies: run ./dev (it makes .venv)," \
         "or name a python that has them: PYTHON=... $0" >&2
    exit 2
fi
work=$(mktemp -d "${TMPDIR:-/tmp}/resourced-acceptance-venv.XXXXXX")
trap 'rm -rf "$work"' EXIT
"$python" -m venv --without-pip "$work/venv"
site=$("$work/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
deps=$("$python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
printf '%s\n%s\n' "$root" "$deps" > "$site/resourced-acceptance.pth"
"$work/venv/bin/python" "$root/scripts/gpu_acceptance.py" "$@"
