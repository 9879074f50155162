#!/bin/sh
# Installs the Debian packages resourced's demo and tests need, when they are missing.
# Root installs them with apt-get; anyone else is told the command to run.
set -eu
missing=""
command -v dbus-daemon >/dev/null 2>&1 || missing="$missing dbus-daemon"
command -v busctl >/dev/null 2>&1 || missing="$missing systemd"
python3 -c 'import venv, ensurepip' 2>/dev/null || missing="$missing python3-venv"
[ -z "$missing" ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
    echo "resourced needs these Debian packages:$missing" >&2
    echo "install them with: sudo apt-get install -y$missing" >&2
    exit 1
fi
echo "installing:$missing" >&2
DEBIAN_FRONTEND=noninteractive apt-get update -qq
# shellcheck disable=SC2086
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing
