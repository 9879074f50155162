"""gpuctl demo: resourced at work on simulated GPUs, on a private bus of its own.

It never touches a real bus or a real GPU, so it is safe on a busy machine: it starts a
private ``dbus-daemon`` and a daemon on 4 simulated GPUs, runs a development claim,
concurrent one-off jobs (whole GPUs and VRAM shares) and a job that waits in the queue
through gpuctl, shows ``gpuctl status`` at each step, and stops everything it started.

Each command it runs has the exit code the script expects of it (0, or 3 for the run that
cannot fit); any other ends the demo with exit 1, naming the step and the command, so that
a broken daemon cannot pass for a demo that worked.
"""

import os
import shutil
import subprocess
import sys
import tempfile
import time

import click

from resourced.exits import EXIT_NOT_ENOUGH_GPUS, GpuctlError

JOB_SECONDS = 2.0
GPUCTL = (sys.executable, "-m", "resourced.cli")
# The README's named pools, so that its examples can be typed in the demo's shell.
CONFIG = """\
[[pool]]
name = "licenses"
capacity = 4

[[pool]]
name = "gpu_slots"
capacity = 2
"""


class _Demo:
    def __init__(self, gpus: int):
        from resourced.linux.privatebus import PrivateBus

        self.bus = PrivateBus().start()
        self.runtime_dir = tempfile.mkdtemp(prefix="resourced-demo-")
        config = os.path.join(self.runtime_dir, "config.toml")
        with open(config, "w") as f:
            f.write(CONFIG)
        self.env = {
            **os.environ,
            **self.bus.env(),
            "DBUS_SYSTEM_BUS_ADDRESS": self.bus.address,  # nothing reaches the real system bus
            "RESOURCED_SIMULATED_GPUS": str(gpus),
            "RESOURCED_RUNTIME_DIR": self.runtime_dir,   # nor the real runtime directory
            "RESOURCED_STATE_DIR": os.path.join(self.runtime_dir, "state"),  # nor the calendar
            "RESOURCED_CONFIG": config,  # nor this account's configuration
            # nor the account's state: a command booked in the demo keeps its job file
            # here, not where the account's own runner would take it for its daemon's
            "XDG_STATE_HOME": os.path.join(self.runtime_dir, "user-state"),
            # gpuctl, and a python that imports resourced, first on the shell's PATH: the
            # environment this demo runs from (./dev shell's .venv)
            "PATH": os.pathsep.join(filter(None, [os.path.dirname(sys.executable),
                                                  os.environ.get("PATH")])),
        }
        self.daemon = None
        self.step = ""

    def say(self, text: str) -> None:
        """Start a step: its title, which a failure names."""
        self.step = text
        click.secho(f"\n== {text}", bold=True)

    def check(self, args, returncode: int, said: str, expect: int = 0) -> None:
        """End the demo unless ``gpuctl ARGS`` exited ``expect``; ``said``: its output."""
        if returncode != expect:
            lines = said.strip().splitlines()
            raise GpuctlError(
                f"demo step \"{self.step}\" failed: `gpuctl {' '.join(args)}` exited "
                f"{returncode}, not {expect}" + (f": {lines[-1]}" if lines else ""))

    def start_daemon(self) -> None:
        self.daemon = subprocess.Popen(
            [sys.executable, "-m", "resourced.daemon", "--session"],
            env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )
        deadline = time.monotonic() + 15
        while self.gpuctl("free", capture=True, expect=None).returncode != 0:
            if self.daemon.poll() is not None or time.monotonic() > deadline:
                raise GpuctlError(f"the daemon did not start: {self.daemon.stderr.read()}")
            time.sleep(0.05)

    def gpuctl(self, *args: str, capture: bool = False, expect: int | None = 0
               ) -> subprocess.CompletedProcess:
        """``gpuctl ARGS``, which must exit ``expect`` (None: any code will do).

        Its stderr is read, to name in a failure, and passed on otherwise; its stdout is
        passed on, or kept in the result with ``capture``."""
        r = subprocess.run([*GPUCTL, *args], env=self.env,
                           stdout=subprocess.PIPE if capture else None,
                           stderr=subprocess.PIPE, text=True, timeout=60)
        if expect is not None:
            self.check(args, r.returncode, r.stderr, expect)
        if not capture:
            sys.stderr.write(r.stderr)
        return r

    def spawn(self, *args: str) -> subprocess.Popen:
        return subprocess.Popen([*GPUCTL, *args], env=self.env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def finish(self, proc: subprocess.Popen, what: str) -> None:
        """Show the output of a spawned gpuctl, which must have exited 0."""
        out, _ = proc.communicate(timeout=60)
        click.echo(f"{what}: exit {proc.returncode}, {out.strip()}")
        self.check(proc.args[len(GPUCTL):], proc.returncode, out)

    def status(self) -> None:
        self.gpuctl("status")

    def shell(self) -> int:
        """A shell on the private bus and daemon (gpuctl finds them as the session bus)."""
        command = os.environ.get("SHELL") or "/bin/sh"
        click.echo(f"\nA shell on the private bus ({command}); gpuctl and the Python client "
                   "use it. Type exit to stop the daemon and the bus.")
        env = {**self.env, "RESOURCED_BUS": "session"}
        return subprocess.run([command], env=env, check=False).returncode

    def close(self) -> None:
        if self.daemon and self.daemon.poll() is None:
            self.daemon.terminate()
            self.daemon.wait(10)
        self.bus.stop()
        shutil.rmtree(self.runtime_dir, ignore_errors=True)


@click.command()
@click.option("--gpus", type=click.IntRange(1, 64), default=4, show_default=True,
              help="How many simulated GPUs.")
@click.option("--shell", "shell", is_flag=True,
              help="Instead of the script, a shell ($SHELL) on the private bus and daemon, "
              "where every README example can be typed; both stop when it exits.")
def demo(gpus, shell):
    """Show resourced at work on simulated GPUs, on a private bus (safe on a busy machine).

    Exits 1, naming the step, when a command it runs fails where the script expects no
    failure. With --shell, the shell's exit code.

    Example: gpuctl demo

    Example: gpuctl demo --shell
    """
    d = _Demo(gpus)
    try:
        d.say(f"Starting a private bus and a resourced daemon on {gpus} simulated GPUs")
        d.start_daemon()
        d.status()
        if shell:
            return d.shell()

        d.say("A development claim: 1 GPU kept for this demo's process until released")
        ref = d.gpuctl("claim", "--gpus", "1", "--owner-pid", str(os.getpid()),
                       "--task-name", "tune kernels", "--label", "dev", capture=True).stdout.strip()
        click.echo(f"$ gpuctl claim --gpus 1 --owner-pid {os.getpid()} ...  ->  {ref}")
        d.status()

        d.say(f"Concurrent one-off jobs for {JOB_SECONDS:.0f} s: one whole GPU, two 30G VRAM "
              "shares of one GPU, and one asking for 3 whole GPUs, which cannot fit")
        job = ("import os, time; time.sleep(%s); print('ran on', "
               "os.environ['CUDA_VISIBLE_DEVICES'][-4:], os.environ.get('RESOURCED_VRAM_BYTES', 'whole'))"
               % JOB_SECONDS)
        jobs = [d.spawn("run", *amount, "--task-name", f"job {i}", "--", sys.executable, "-c", job)
                for i, amount in enumerate([("--gpus", "1"), ("--vram", "30G"), ("--vram", "30G")], 1)]
        time.sleep(JOB_SECONDS / 2)
        too_big = d.gpuctl("run", "--gpus", "3", "--", "true", capture=True,
                           expect=EXIT_NOT_ENOUGH_GPUS)
        click.echo(f"$ gpuctl run --gpus 3 -- true  ->  exit {too_big.returncode}: "
                   f"{too_big.stderr.strip()}")
        d.status()

        d.say("The jobs end; their GPUs come back by themselves")
        for i, p in enumerate(jobs, 1):
            d.finish(p, f"job {i}")
        d.status()

        d.say("A job that needs all 4 GPUs waits in the queue (--wait) until the claim is released")
        waiter = d.spawn("run", "--gpus", "4", "--wait", "--task-name", "big job", "--",
                         sys.executable, "-c", "import os; print('big job on', "
                         "len(os.environ['CUDA_VISIBLE_DEVICES'].split(',')), 'GPUs')")
        deadline = time.monotonic() + 10
        while "big job" not in d.gpuctl("queue", capture=True).stdout:
            if time.monotonic() > deadline:
                break
            time.sleep(0.05)
        d.gpuctl("queue")
        d.gpuctl("run", "--allocation", ref, "--", sys.executable, "-c",
                 "import os; print('meanwhile on the claim', os.environ['RESOURCED_ALLOCATION'])")
        click.echo(f"$ gpuctl release {ref}")
        d.gpuctl("release", ref)
        d.finish(waiter, "waiting job")
        d.status()

        d.say("The calendar: book 2 GPUs for 2 hours an hour from now, see where 4 would fit")
        for args in (("book", "--gpus", "2", "--for", "2h", "--at", "+1h", "--label", "demo"),
                     ("slots", "--gpus", "4", "--for", "1h", "--count", "2"),
                     ("bookings", "--all"), ("timeline", "--span", "6h", "--width", "90")):
            click.echo(f"$ gpuctl {' '.join(args)}")
            d.gpuctl(*args)
        d.say("Done: the private daemon and bus are stopped")
    finally:
        d.close()
