"""A real Slurm on localhost for the tests: munged, slurmctld and one slurmd, as root.

Everything lives in one private directory (configuration, state, spool, logs, the munge
key and socket, and the placeholder GPU devices): ``stop()`` kills what was started, by
pid, and removes the directory, whatever state ``start()`` reached.  Ports are free ones
on 127.0.0.1, and ``CommunicationParameters=NoInAddrAny`` keeps the daemons off every
other address.

The ``gpu`` GRES names character devices made with ``mknod`` (slurmd refuses plain files);
with them slurmd sets ``SLURM_JOB_GPUS`` and ``CUDA_VISIBLE_DEVICES`` for the job and its
prolog.  Processes are tracked with ``proctrack/linuxproc``, which needs no cgroups.
"""

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

PREFIX = "rdt-slurm-"
DEVICE_MAJOR = 1  # the "mem" major: a harmless number for devices nobody opens
DEVICE_MINOR_BASE = 240
NODE = socket.gethostname().split(".")[0]
TOOLS = ("munged", "slurmctld", "slurmd", "srun", "scontrol", "scancel", "sinfo")


def missing_tools() -> list[str]:
    path = os.environ.get("PATH", "") + ":/usr/sbin:/sbin"
    return [t for t in TOOLS if shutil.which(t, path=path) is None]


def _tool(name: str) -> str:
    return shutil.which(name, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin") or name


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class SlurmCluster:
    """One controller and one node named after this host, on 127.0.0.1."""

    def __init__(self, gpu_indices, env: dict[str, str] | None = None):
        self.env = env or {}  # what the prolog and epilog scripts export
        self.dir = Path(tempfile.mkdtemp(prefix=PREFIX, dir="/tmp"))
        self.procs: dict[str, subprocess.Popen] = {}
        self.devices = [self.dir / "dev" / f"nvidia{i}" for i in gpu_indices]
        self.conf = self.dir / "etc" / "slurm.conf"

    # -- configuration ----------------------------------------------------------------
    def write_config(self, prolog: str = "", epilog: str = "", node_line: str = "",
                     gres_lines: str = "") -> None:
        """slurm.conf and gres.conf; ``prolog``/``epilog`` are shell lines run as root by
        slurmd (with ``self.env`` exported); the node and GRES lines default to ours."""
        etc = self.dir / "etc"
        etc.mkdir(exist_ok=True)
        hooks = {}
        for name, body in (("prolog", prolog), ("epilog", epilog)):
            if body:
                script = etc / f"{name}.sh"
                exports = "".join(f"export {k}='{v}'\n" for k, v in self.env.items())
                script.write_text(f"#!/bin/sh\n{exports}{body}\n")
                script.chmod(0o755)
                hooks[name.capitalize()] = str(script)
        node_line = node_line or (f"NodeName={NODE} CPUs=1 RealMemory=100 "
                                  f"Gres=gpu:{len(self.devices)} State=UNKNOWN")
        d = self.dir
        lines = [
            "ClusterName=rdt",
            f"SlurmctldHost={NODE}(127.0.0.1)",
            f"SlurmctldPort={_free_port()}",
            f"SlurmdPort={_free_port()}",
            "CommunicationParameters=NoInAddrAny",
            "SlurmUser=root", "SlurmdUser=root",
            "AuthType=auth/munge", "CredType=cred/munge",
            f"AuthInfo=socket={d / 'munge.socket'}",
            f"StateSaveLocation={d / 'ctld'}", f"SlurmdSpoolDir={d / 'spool'}",
            f"SlurmctldPidFile={d / 'slurmctld.pid'}", f"SlurmdPidFile={d / 'slurmd.pid'}",
            f"SlurmctldLogFile={d / 'slurmctld.log'}", f"SlurmdLogFile={d / 'slurmd.log'}",
            "SlurmctldDebug=info", "SlurmdDebug=info",
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none", "AccountingStorageType=accounting_storage/none",
            "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core",
            "SchedulerType=sched/builtin", "MpiDefault=none", "ReturnToService=2",
            "GresTypes=gpu", "KillWait=2", "InactiveLimit=0", "MessageTimeout=5",
            *(f"{k}={v}" for k, v in hooks.items()),
            f"{node_line} NodeAddr=127.0.0.1",
            f"PartitionName=rdt Nodes={NODE} Default=YES MaxTime=INFINITE State=UP",
        ]
        self.conf.write_text("\n".join(lines) + "\n")
        gres = gres_lines or "\n".join(f"Name=gpu File={p}" for p in self.devices)
        (etc / "gres.conf").write_text(gres + "\n")

    # -- lifecycle --------------------------------------------------------------------
    def start(self, timeout: float = 30) -> None:
        """munged, slurmctld, slurmd; returns once the node is idle."""
        for sub in ("ctld", "spool"):
            (self.dir / sub).mkdir(mode=0o700, exist_ok=True)
        (self.dir / "dev").mkdir(mode=0o700, exist_ok=True)
        for i, dev in enumerate(self.devices):
            if not dev.exists():
                os.mknod(dev, 0o600 | 0o020000, os.makedev(DEVICE_MAJOR, DEVICE_MINOR_BASE + i))
        key = self.dir / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        d = self.dir
        self._spawn("munged", [_tool("munged"), "--foreground", "--force",
                               f"--socket={d / 'munge.socket'}", f"--key-file={key}",
                               f"--pid-file={d / 'munged.pid'}", f"--log-file={d / 'munged.log'}",
                               f"--seed-file={d / 'munged.seed'}"])
        self._wait(lambda: (d / "munge.socket").exists(), 10, "munged's socket")
        self._spawn("slurmctld", [_tool("slurmctld"), "-D", "-i", "-f", str(self.conf)])
        self._spawn("slurmd", [_tool("slurmd"), "-D", "-f", str(self.conf)])
        self.wait_idle(timeout)

    def wait_idle(self, timeout: float) -> None:
        self._wait(lambda: self.node_state().startswith("IDLE"), timeout, "the node to be IDLE")

    def node_state(self) -> str:
        cp = self.run("scontrol", "show", "node", NODE, "-o", timeout=5)
        fields = dict(f.split("=", 1) for f in cp.stdout.split() if "=" in f)
        return fields.get("State", "")

    def stop(self) -> None:
        """Kill every daemon started (and their children), remove the directory."""
        for name in ("slurmd", "slurmctld", "munged"):
            proc = self.procs.pop(name, None)
            if proc is None:
                continue
            try:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(10)
            except ProcessLookupError:
                pass
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
        self._kill_steps()
        shutil.rmtree(self.dir, ignore_errors=True)

    def _kill_steps(self) -> None:
        """slurmstepd processes of this cluster left by a killed slurmd (they read our
        configuration file)."""
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                if (entry / "comm").read_text().strip() == "slurmstepd" and \
                        str(self.dir) in (entry / "environ").read_bytes().decode(errors="replace"):
                    os.kill(int(entry.name), signal.SIGKILL)
            except (OSError, ProcessLookupError):
                pass

    # -- use --------------------------------------------------------------------------
    def client_env(self) -> dict[str, str]:
        return {"PATH": "/usr/bin:/bin:/usr/sbin:/sbin", "SLURM_CONF": str(self.conf),
                "LANG": "C.UTF-8", "HOME": str(self.dir)}

    def run(self, *argv: str, timeout: float = 20) -> subprocess.CompletedProcess:
        return subprocess.run([_tool(argv[0]), *argv[1:]], check=False, env=self.client_env(),
                              capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)

    def popen(self, *argv: str) -> subprocess.Popen:
        return subprocess.Popen([_tool(argv[0]), *argv[1:]], env=self.client_env(),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                stdin=subprocess.DEVNULL, start_new_session=True)

    def log(self, name: str) -> str:
        path = self.dir / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def logs(self) -> str:
        return "\n".join(f"--- {n}.log\n{self.log(n)[-3000:]}" for n in ("slurmctld", "slurmd"))

    def _spawn(self, name: str, argv: list[str]) -> None:
        env = {**self.client_env(), "SLURM_CONF": str(self.conf)}
        with open(self.dir / f"{name}.out", "w") as out:
            self.procs[name] = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT,
                                                stdin=subprocess.DEVNULL, start_new_session=True)

    def _wait(self, predicate, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while True:
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    out = (self.dir / f"{name}.out").read_text(errors="replace")
                    raise RuntimeError(f"{name} exited ({proc.returncode}) while waiting for "
                                       f"{what}:\n{out}\n{self.logs()}")
            try:
                if predicate():
                    return
            except (OSError, subprocess.SubprocessError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed out after {timeout:g} s waiting for {what}\n{self.logs()}")
            time.sleep(0.05)
