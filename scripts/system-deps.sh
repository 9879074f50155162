#!/bin/sh
# Installs the Debian packages resourced's demo and tests need, when they are missing.
# Root installs them with apt-get; anyone else is told the command to run.
# `system-deps.sh demo` looks only for what the demo needs (the first list below).
#
# Everyone needs:
#   dbus-daemon   private buses for the bus tests and the demo
#   systemd       busctl
#   python3-venv  venv and ensurepip for python3 (the project's .venv)
# The multi-user tests (tests/system) need, and run only as root:
#   python3-venv  for Debian's /usr/bin/python3: they install the project into a venv
#                 that other users can run
#   polkitd       the real polkit daemon
#   util-linux    setpriv and runuser, to run commands as other users
#   passwd        useradd, userdel, groupadd, groupdel, for their test users
#   dbus-user-session  a user bus under systemd --user, for the tests under a real systemd
#                 (tests/systemd: the per-user service)
#   slurmctld slurmd slurm-client munge  a real one-node Slurm for tests/system/test_slurm.py
#                 (and benchmarks/slurm_prolog.py)
# Anyone but root is only told about those (the tests skip themselves without root).
# The notification test with a real server needs, installed for root, mentioned otherwise:
#   dunst         a real org.freedesktop.Notifications server
#   xvfb          a display for it
# The end-to-end tests of the terminal parts need, the same way:
#   tmux          gpuctl top driven as a person would (send-keys, capture-pane)
#   zsh           the shell hook in zsh as well as bash
# The ObjectManager test (tests/bus/test_object_manager.py), the same way:
#   python3-gi gir1.2-glib-2.0  GLib's object-manager client, for Debian's /usr/bin/python3
# The MCP test through a second client (tests/bus/test_mcp.py), the same way:
#   npm           installs the official MCP Inspector (./dev test, into .venv/mcp-inspector)
set -eu
PATH="$PATH:/usr/sbin:/sbin"
missing=""
optional=""
command -v dbus-daemon >/dev/null 2>&1 || missing="$missing dbus-daemon"
command -v busctl >/dev/null 2>&1 || missing="$missing systemd"
python3 -c 'import venv, ensurepip' 2>/dev/null || missing="$missing python3-venv"
if [ "${1:-}" = demo ]; then
    [ -z "$missing" ] && exit 0
    if [ "$(id -u)" -ne 0 ]; then
        echo "the demo needs these Debian packages:$missing" >&2
        echo "install them with: sudo apt-get install -y$missing" >&2
        exit 1
    fi
    echo "installing:$missing" >&2
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    # shellcheck disable=SC2086
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing
    exit 0
fi

system=""
if [ -x /usr/bin/python3 ]; then
    /usr/bin/python3 -c 'import venv, ensurepip' 2>/dev/null || system="$system python3-venv"
else
    system="$system python3 python3-venv"
fi
[ -x /usr/lib/polkit-1/polkitd ] || system="$system polkitd"
{ command -v setpriv && command -v runuser; } >/dev/null 2>&1 || system="$system util-linux"
{ command -v useradd && command -v groupadd; } >/dev/null 2>&1 || system="$system passwd"
[ -e /usr/lib/systemd/user/dbus.socket ] || system="$system dbus-user-session"
command -v slurmctld >/dev/null 2>&1 || system="$system slurmctld"
command -v slurmd >/dev/null 2>&1 || system="$system slurmd"
command -v srun >/dev/null 2>&1 || system="$system slurm-client"
command -v munged >/dev/null 2>&1 || system="$system munge"
command -v dunst >/dev/null 2>&1 || optional="$optional dunst"
command -v Xvfb >/dev/null 2>&1 || optional="$optional xvfb"
command -v tmux >/dev/null 2>&1 || optional="$optional tmux"
command -v zsh >/dev/null 2>&1 || optional="$optional zsh"
command -v npm >/dev/null 2>&1 || optional="$optional npm"
/usr/bin/python3 -c 'import gi; gi.require_version("Gio", "2.0"); from gi.repository import Gio' \
    2>/dev/null || optional="$optional python3-gi gir1.2-glib-2.0"

if [ "$(id -u)" -ne 0 ]; then
    if [ -n "$system" ]; then
        echo "the multi-user tests (tests/system, run as root) would need:$system" >&2
    fi
    if [ -n "$optional" ]; then
        echo "the tests with a real notification server, tmux, zsh, GLib and the MCP" \
             "Inspector would need:$optional" >&2
    fi
    [ -z "$missing" ] && exit 0
    echo "resourced needs these Debian packages:$missing" >&2
    echo "install them with: sudo apt-get install -y$missing" >&2
    exit 1
fi
# Root: install every list (python3-venv may be in two).
all=""
for p in $missing $system $optional; do
    case " $all " in *" $p "*) ;; *) all="$all $p" ;; esac
done
[ -z "$all" ] && exit 0
echo "installing:$all" >&2
DEBIAN_FRONTEND=noninteractive apt-get update -qq
# shellcheck disable=SC2086
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $all
# Debian enables a daemon's unit as its package is installed; Slurm and munge are here for
# the tests, which start their own, so they are not left to start at the next boot.
case "$all" in
    *slurm*|*munge*)
        systemctl disable --quiet slurmd slurmctld munge 2>/dev/null || true ;;
esac
