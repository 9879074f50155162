"""What only the daemon can see of itself, for ``gpuctl doctor`` (``Diagnose``).

Its directories as its own account finds them, its GPU backend asked now (and how long it
took), the configured GPUs against those present, and whether its ``/proc`` shows other
users' processes (the evidence of ``verify`` and of no-shows).  Read-only: it looks and
says; it changes nothing.  Each check is a ``core.diagnosis`` record.
"""

import os
import stat
import time
from pathlib import Path

from resourced.core.diagnosis import FAIL, OK, SKIPPED, WARN, check
from resourced.linux.users import user_name
from resourced.protocol.amounts import format_bytes

LOW_SPACE = {"runtime": 16 << 20, "state": 256 << 20}
"""Bytes free under which a directory is short of room: the live claims' log (small, on
a tmpfs), the calendar and the usage history (growing with the retention)."""


async def diagnose(engine, directories: dict[str, Path], configured_gpus: int) -> list[dict]:
    """The daemon's checks (``directories``: name -> path, ``runtime`` and ``state``)."""
    return [*(directory(name, path) for name, path in directories.items()),
            await backend(engine), gpus(engine, configured_gpus), proc_visibility()]


def directory(name: str, path: Path) -> dict:
    id = f"daemon.{name}-dir"
    try:
        st = os.stat(path)
        fs = os.statvfs(path)
    except OSError as exc:
        return check(id, FAIL, f"the {name} directory {path} cannot be read: {exc.strerror}",
                     "give it back to the daemon's account, or restart the daemon",
                     path=str(path))
    owner = user_name(st.st_uid)
    free = fs.f_bavail * fs.f_frsize
    detail = {"path": str(path), "owner": owner, "mode": f"{stat.S_IMODE(st.st_mode):04o}",
              "free_bytes": free}
    said = f"{path} (owner {owner}, mode {detail['mode']}, {format_bytes(free)} free)"
    if not os.access(path, os.W_OK | os.X_OK):
        return check(id, FAIL, f"the daemon cannot write its {name} directory {said}",
                     f"chown it to {user_name(os.geteuid())}", **detail)
    if st.st_mode & stat.S_IWOTH:
        return check(id, WARN, f"anyone may write the {name} directory {said}",
                     f"chmod o-w {path}", **detail)
    if free < LOW_SPACE.get(name, 0):
        return check(id, WARN, f"the {name} directory is short of room: {said}",
                     "free some space on its file system", **detail)
    return check(id, OK, f"{name} directory {said}", **detail)


async def backend(engine) -> dict:
    """Ask the backend what runs on the GPUs now, as a claim would, and time it."""
    name, timeout = engine.backend.name, engine.probe.timeout
    if name == "none":
        return check("daemon.gpu-backend", FAIL, f"no GPU backend: {engine.backend_note}",
                     "install the NVIDIA driver (NVML), or set RESOURCED_SIMULATED_GPUS for "
                     "simulated GPUs, and restart the daemon", backend=name)
    begun = time.monotonic()
    evidence = await engine.probe.processes()
    took = time.monotonic() - begun
    detail = {"backend": name, "took_ms": round(took * 1000, 1), "probe_timeout_s": timeout}
    if not evidence.known:
        return check("daemon.gpu-backend", FAIL, f"the {name} backend did not answer: "
                     f"{evidence.reason}", "look at the driver (nvidia-smi), or raise "
                     "[daemon] probe_timeout", **detail)
    said = f"the {name} backend answered in {took * 1000:.0f} ms (probe_timeout {timeout:g} s)"
    if took > timeout / 2:
        return check("daemon.gpu-backend", WARN, said + ", close to its limit",
                     "look at the driver's load, or raise [daemon] probe_timeout", **detail)
    return check("daemon.gpu-backend", OK, said, **detail)


def gpus(engine, configured: int) -> dict:
    seen, managed = len(engine.present), len(engine.ledger.gpus)
    detail = {"present": seen, "managed": managed, "configured": configured,
              "missing": [e.uuid for e in engine.missing]}
    if engine.missing:
        return check("daemon.gpus", WARN, f"{len(engine.missing)} configured GPU(s) are not "
                     f"present: {', '.join(detail['missing'])}", "fix the [[gpu]] entries "
                     "(gpuctl init writes them from the GPUs present)", **detail)
    if not managed:
        return check("daemon.gpus", FAIL, "no GPUs to manage", "see daemon.gpu-backend",
                     **detail)
    said = f"{managed} GPU(s) managed" + (f" of {seen} present" if seen != managed else "")
    return check("daemon.gpus", OK, said, **detail)


def proc_visibility(mountinfo: str = "/proc/self/mountinfo") -> dict:
    """``/proc`` mounted with ``hidepid`` hides other users' processes from the daemon,
    unless it runs as root or in the mount's ``gid=`` group."""
    try:
        with open(mountinfo, encoding="utf-8") as f:
            options = next((line.split(" - ")[1].split()[2] for line in f
                            if line.split()[4] == "/proc"), "")
    except (OSError, IndexError):
        return check("daemon.proc", SKIPPED, "cannot read the mount table")
    opts = dict(o.partition("=")[::2] for o in options.split(","))
    hidden = opts.get("hidepid", "0") not in ("0", "off")
    exempt = os.geteuid() == 0 or (opts.get("gid", "").isdigit()
                                    and int(opts["gid"]) in os.getgroups())
    detail = {"hidepid": opts.get("hidepid", "0"), "gid": opts.get("gid", "")}
    if hidden and not exempt:
        return check("daemon.proc", WARN, f"/proc is mounted with hidepid={opts['hidepid']}: "
                     "the daemon sees no other user's processes, so verify and the no-show "
                     "evidence cannot attribute them", "mount /proc with gid=GROUP and add "
                     "the daemon's account to GROUP", **detail)
    return check("daemon.proc", OK, "/proc shows every user's processes to the daemon",
                 **detail)
