"""CPU use of an idle ``gpuctl top``: what a live view costs while nothing happens.

Starts its own private session bus and a daemon on it (8 simulated GPUs, a few claims and
bookings so that the screen has something on it), then runs ``gpuctl top`` in a terminal:
a detached tmux session (120x40) where tmux is installed, else a pseudo-terminal of the
same size (``--pty`` forces it; its output is read and thrown away, as a terminal would).
Once the screen is up and has settled, it reads the process's user and system CPU time
(``/proc/<pid>/stat``, fields utime and stime) at the start and the end of ``--seconds``
(default 20) of idleness, and prints the share of one core.

Idle means: no keys, no changes on the bus.  ``gpuctl top`` waits on the bus socket for
the daemon's signals and redraws once a minute for the moving now; it never polls.

Target: under 2 % of one core.

    python benchmarks/top_idle.py [--seconds 20] [--pty]
"""

import argparse
import contextlib
import fcntl
import os
import pty
import shutil
import struct
import subprocess
import sys
import tempfile
import termios
import threading
import time

from _harness import clean_env, daemon_on_private_bus, machine_line, stop_process

TARGET_PCT = 2.0
SETTLE = 3.0          # seconds after the screen is up before measuring
STARTUP_TIMEOUT = 30.0
COLUMNS, LINES = 120, 40


def cpu_seconds(pid: int) -> float:
    """utime + stime of ``pid`` (fields 14 and 15 of /proc/<pid>/stat), in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        stat = f.read()
    fields = stat[stat.rindex(")") + 2:].split()   # after "pid (comm) "
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def populate() -> None:
    """Something on screen: two claims and three bookings."""
    from resourced import Client

    with Client(bus="session") as c:
        c.claim(mode="dev", gpus=2, owner_pid=os.getpid(), task_name="bench", duration="3h")
        c.claim(mode="dev", gpus=1, owner_pid=os.getpid(), task_name="open-ended")
        for start, gpus in (("+1h", 2), ("+3h", 4), ("+6h", 1)):
            c.book("2h", gpus=gpus, start=start)


def command(env: dict) -> list[str]:
    gpuctl = os.path.join(os.path.dirname(sys.executable), "gpuctl")
    args = [gpuctl] if os.access(gpuctl, os.X_OK) else [sys.executable, "-m", "resourced.cli"]
    return ["env", *(f"{k}={v}" for k, v in env.items()
                     if k.startswith(("DBUS_", "RESOURCED_"))), *args, "top"]


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not within {timeout}s")
        time.sleep(0.1)


@contextlib.contextmanager
def in_tmux(argv: list[str], env: dict):
    """Yield the pid of ``argv`` running in a detached tmux session, once drawn."""
    folder = tempfile.mkdtemp(prefix="top-idle-")
    tmux = ["tmux", "-S", os.path.join(folder, "socket")]
    try:
        subprocess.run([*tmux, "new-session", "-d", "-s", "top", "-x", str(COLUMNS),
                        "-y", str(LINES), "exec " + " ".join(_quote(a) for a in argv)],
                       check=True, timeout=10, env=env)

        def screen() -> str:
            return subprocess.run([*tmux, "capture-pane", "-p", "-t", "top"], check=True,
                                  capture_output=True, text=True, timeout=10).stdout

        wait_for(lambda: "queue" in screen() and "(not live)" not in screen(),
                 STARTUP_TIMEOUT, "gpuctl top on screen")
        pid = int(subprocess.run([*tmux, "list-panes", "-t", "top", "-F", "#{pane_pid}"],
                                 check=True, capture_output=True, text=True,
                                 timeout=10).stdout.split()[0])
        yield pid
    finally:
        subprocess.run([*tmux, "kill-server"], check=False, capture_output=True, timeout=10)
        shutil.rmtree(folder, ignore_errors=True)


@contextlib.contextmanager
def in_pty(argv: list[str], env: dict):
    """Yield the pid of ``argv`` running on a pseudo-terminal, once drawn."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", LINES, COLUMNS, 0, 0))
    proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave,
                            env={**env, "TERM": env.get("TERM") or "xterm-256color"},
                            start_new_session=True)
    os.close(slave)
    seen = bytearray()

    def drain():
        with contextlib.suppress(OSError):
            while chunk := os.read(master, 65536):
                if len(seen) < 1 << 20:
                    seen.extend(chunk)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        wait_for(lambda: b"queue" in seen, STARTUP_TIMEOUT, "gpuctl top on the terminal")
        yield proc.pid
    finally:
        stop_process(proc)
        os.close(master)


def _quote(arg: str) -> str:
    import shlex

    return shlex.quote(arg)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="How long to measure.")
    parser.add_argument("--pty", action="store_true", help="A pseudo-terminal, not tmux.")
    args = parser.parse_args()
    use_tmux = not args.pty and shutil.which("tmux") is not None
    print(machine_line())
    with daemon_on_private_bus(gpus=8) as rig:
        populate()
        env = clean_env(rig.address)
        runner = in_tmux if use_tmux else in_pty
        with runner(command(env), env) as pid:
            time.sleep(SETTLE)
            before, started = cpu_seconds(pid), time.monotonic()
            time.sleep(args.seconds)
            used, elapsed = cpu_seconds(pid) - before, time.monotonic() - started
    pct = 100 * used / elapsed
    print(f"gpuctl top, idle in {'tmux' if use_tmux else 'a pty'} ({COLUMNS}x{LINES}): "
          f"{used:.2f} s of CPU in {elapsed:.1f} s = {pct:.2f} % of one core "
          f"(target < {TARGET_PCT} %: {'met' if pct < TARGET_PCT else 'NOT met'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
