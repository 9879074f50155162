#!/bin/bash
# A real systemd as PID 1 inside new PID, mount, cgroup, network, UTS and IPC namespaces,
# on a throw-away overlay of / (lower: the host's /, upper: a tmpfs): what runs inside
# writes nothing to the host's files. The tests/systemd harness (conftest.py) drives it;
# adapted from the project's recipe (systemd-in-namespace.sh) for the test tier:
#   * no unit directory to copy: the tests install their units the way an administrator
#     does, with gpuctl, inside;
#   * `exec` runs with a clean environment (nothing of the caller's leaks in);
#   * `stop` also works on a half-started instance (init never came up) and always
#     removes the cgroup2 directories it made on the host;
#   * `run` + `wait`: the same boot with `unshare` in the foreground, for a caller that
#     wants the namespace to die with it: unshare --kill-child SIGKILLs the namespace's
#     init when unshare dies, so a caller that runs `run` under
#     `setpriv --pdeathsig KILL` takes the whole namespace with it, even when SIGKILLed.
#
#   systemd-ns.sh start     boot in the background; prints the init's host pid
#   systemd-ns.sh run       boot in the foreground: becomes unshare, until poweroff
#   systemd-ns.sh wait      (after run) until systemd is up; prints the init's host pid
#   systemd-ns.sh exec CMD  run CMD inside (systemctl, journalctl, busctl, gpuctl ...)
#   systemd-ns.sh stop      poweroff (SIGRTMIN+4 to init), SIGKILL fallback, remove cgroups
#
# State (the pids, console.log, the mount points) is kept in $SYSD_NS_BASE.
#
# Needs root, util-linux (unshare, nsenter, setpriv), systemd as /lib/systemd/systemd, and
# cgroup2 at /sys/fs/cgroup/unified (a hybrid host) or /sys/fs/cgroup (a unified one).
# SYSD_NS_BASE (required) is this instance's directory; SYSD_NS_CGROUP its cgroup's name
# (default: systemd-ns-<basename of the directory>).
set -euo pipefail
BASE=${SYSD_NS_BASE:?SYSD_NS_BASE must name the instance directory}
CG=${SYSD_NS_CGROUP:-systemd-ns-$(basename "$BASE")}
if [ -d /sys/fs/cgroup/unified ] && [ "$(stat -fc %T /sys/fs/cgroup/unified)" = cgroup2fs ]; then
  CG2=/sys/fs/cgroup/unified
else
  CG2=/sys/fs/cgroup
fi
SELF=$(readlink -f "$0")
INNER_PATH=/usr/sbin:/usr/bin:/sbin:/bin

inner() {   # runs as PID 1 of the new pid namespace
  if [ "${1:-}" != stage2 ]; then
    echo 1 > "$CG2/$CG/cgroup.procs"                 # into the dedicated cgroup2 node ...
    exec unshare --cgroup "$SELF" __inner stage2     # ... which becomes the cgroup ns root
  fi
  local R=$BASE/root L=$BASE/layer
  mount -t tmpfs -o mode=755,size=2g ns-layer "$L"
  mkdir -p "$L/upper" "$L/work"
  mount -t overlay -o lowerdir=/,upperdir="$L/upper",workdir="$L/work" ns-root "$R"
  mount -t proc -o nosuid,nodev,noexec proc "$R/proc"
  mount --bind "$R/proc/sys" "$R/proc/sys"; mount -o remount,bind,ro "$R/proc/sys"   # no host sysctl writes
  mount -t sysfs -o ro,nosuid,nodev,noexec sysfs "$R/sys"                            # ro /sys: no udev
  mount -t cgroup2 -o nosuid,nodev,noexec cgroup2 "$R/sys/fs/cgroup"                  # unified, ns-rooted
  mount -t tmpfs -o mode=755,nosuid,size=4m ns-dev "$R/dev"                          # private /dev
  for d in null zero full random urandom tty; do touch "$R/dev/$d"; mount --bind "/dev/$d" "$R/dev/$d"; done
  mkdir -p "$R/dev/pts" "$R/dev/shm"
  mount -t devpts -o newinstance,ptmxmode=0666,mode=620,gid=5 devpts "$R/dev/pts"
  ln -s pts/ptmx "$R/dev/ptmx"; ln -s /proc/self/fd "$R/dev/fd"
  mount -t tmpfs -o mode=1777,nosuid,nodev ns-shm "$R/dev/shm"
  mount -t tmpfs -o mode=755,nosuid,nodev,size=256m ns-run "$R/run"
  mount -t tmpfs -o mode=1777,nosuid,nodev ns-tmp "$R/tmp"
  mkdir -p "$R/etc/systemd/system"
  # The host's timers would fire inside (apt, man-db ...): masked, on the overlay only.
  for t in "$R"/etc/systemd/system/timers.target.wants/*; do
    [ -e "$t" ] && ln -sf /dev/null "$R/etc/systemd/system/$(basename "$t")"
  done
  printf '[Unit]\nDescription=test target\nRequires=basic.target\nAfter=basic.target\n' \
    > "$R/etc/systemd/system/ns-test.target"
  cd "$R"; mkdir -p .oldroot; pivot_root . .oldroot; cd /; umount -l /.oldroot; rmdir /.oldroot
  exec setpriv --bounding-set -sys_time,-sys_module,-syslog,-wake_alarm \
    env -i container=unshare PATH=$INNER_PATH \
    /lib/systemd/systemd --system --unit=ns-test.target
}

initpid() { cat "$BASE/init.pid"; }
in_ns() {
  nsenter -t "$(initpid)" -a env -i PATH=$INNER_PATH LANG=C.UTF-8 HOME=/root TERM=dumb "$@"
}

run() {       # the foreground boot: this process becomes unshare, the namespace's parent
  mkdir -p "$BASE/root" "$BASE/layer"
  mkdir "$CG2/$CG"
  echo $$ > "$BASE/unshare.pid"
  exec unshare --kill-child --pid --fork --mount --propagation private --net --uts --ipc \
    "$SELF" __inner > "$BASE/console.log" 2>&1 < /dev/null
}

start() {
  setsid "$SELF" run < /dev/null > /dev/null 2>&1 &
  wait_boot
}

wait_boot() {
  local uns="" init="" st=""
  for _ in $(seq 200); do uns=$(cat "$BASE/unshare.pid" 2>/dev/null || true); [ -n "$uns" ] && break; sleep 0.025; done
  [ -n "$uns" ] || { echo "unshare did not start" >&2; return 1; }
  for _ in $(seq 200); do init=$(pgrep -P "$uns" || true); [ -n "$init" ] && break; sleep 0.025; done
  [ -n "$init" ] || { echo "no init process; see $BASE/console.log" >&2; return 1; }
  echo "$init" > "$BASE/init.pid"
  # Until systemd answers and the boot transaction is done (a minute at most).
  local deadline=$((SECONDS + 60))
  while [ "$SECONDS" -lt "$deadline" ]; do
    st=$(in_ns systemctl is-system-running 2>/dev/null || true)
    case $st in running|degraded) echo "$init"; return 0;; esac
    sleep 0.025
  done
  echo "systemd did not come up; state '$st'; see $BASE/console.log" >&2; return 1
}

# Alive and not a zombie (`run`'s unshare is its caller's child: a zombie until reaped).
alive() { [ -n "$1" ] && [ -r "/proc/$1/status" ] && ! grep -q '^State:[[:space:]]*Z' "/proc/$1/status" 2>/dev/null; }

stop() {
  local init uns
  init=$(cat "$BASE/init.pid" 2>/dev/null || true); uns=$(cat "$BASE/unshare.pid" 2>/dev/null || true)
  if alive "$init"; then
    kill -s SIGRTMIN+4 "$init"                     # = systemctl poweroff: reboot() ends the pid ns
    for _ in $(seq 200); do alive "$init" || break; sleep 0.025; done
    if alive "$init"; then
      echo "graceful stop timed out; SIGKILL" >&2
      kill -KILL "$init"
    fi
  fi
  # unshare (init's parent) outlives init only for a moment; a killed caller may have
  # left it without an init at all.
  if [ -n "$uns" ]; then
    for _ in $(seq 200); do alive "$uns" || break; sleep 0.025; done
    if alive "$uns"; then kill -KILL "$uns" 2>/dev/null || true; fi
  fi
  # The namespaces' mounts go with their last process; the cgroup2 directories stay on the
  # host until removed, deepest first (a cgroup goes once its processes are reaped).
  if [ -d "$CG2/$CG" ]; then
    for _ in $(seq 200); do
      find "$CG2/$CG" -depth -type d -exec rmdir {} \; 2>/dev/null || true
      [ -d "$CG2/$CG" ] || break
      sleep 0.025
    done
  fi
  [ -d "$CG2/$CG" ] && { echo "cannot remove $CG2/$CG" >&2; return 1; }
  rm -f "$BASE/init.pid" "$BASE/unshare.pid"
}

case ${1:-} in
  __inner) shift; inner "$@";;
  start) start;;
  run) run;;
  wait) wait_boot;;
  exec) shift; in_ns "$@";;
  stop) stop;;
  cgroup) echo "$CG2/$CG";;
  *) echo "usage: $0 start | run | wait | exec CMD... | stop | cgroup" >&2; exit 2;;
esac
