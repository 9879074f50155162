"""``gpuctl doctor``: whether resourced works here, one check per layer.

gpuctl's own checks (the bus and the daemon that answers, the service's files, the
configuration, device nodes, the clock, Slurm's share, lingering, isolation) and the
daemon's (``Diagnose``: its directories, its GPU backend, its ``/proc``), in one list of
``core.diagnosis`` records.  Nothing changes, except with ``probe``: then a claim is made
and released, and a booking a week ahead made and cancelled, each timed.
"""

import ctypes
import os
import re
import shlex
import stat
import time
from pathlib import Path

from resourced import __version__
from resourced.config import Config, ConfigError, find_config, load_config
from resourced.core.diagnosis import FAIL, OK, SKIPPED, WARN, check
from resourced.errors import ResourcedError
from resourced.linux import install
from resourced.linux.users import user_name

START = {
    "system": "sudo systemctl start resourced (installed by gpuctl service enable --system)",
    "session": "systemctl --user start resourced (gpuctl service enable --user), or run "
               "`resourced &`",
    "shared": "start the host account's service (systemctl --user start resourced-shared), "
              "or `gpuctl connect` again",
}


def run(bus: str | None, probe: bool = False, environ=os.environ) -> list[dict]:
    """Every check, in the order printed."""
    from .sync import Client

    checks = []
    try:
        client = Client(bus=bus, timeout=10)
        view = client.status()
    except ResourcedError as exc:
        checks.append(check("bus", FAIL, str(exc), _start_hint(str(exc), bus)))
        view = client = None
    if view is not None:
        checks.append(check("bus", OK, f"the {client.bus} bus answers: resourced "
                            f"{view['version']}, {view['backend']} backend, "
                            f"{len(view['gpus'])} GPU(s)", bus=client.bus,
                            daemon_version=view["version"], backend=view["backend"]))
        checks.append(version(view["version"]))
    checks.append(service(environ))
    mode = view["mode"] if view else ("system" if bus == "system" else "session")
    found, config = configuration(mode, environ)
    checks += [found, textfile(config)]
    if client is not None:
        checks += daemon_checks(client)
        checks.append(device_nodes(view))
        checks.append(isolation(client, config))
        checks.append(slurm_split(view, environ))
    checks.append(clock())
    checks.append(linger(environ))
    if probe and client is not None:
        checks += probes(client, view)
    if client is not None:
        client.close()
    return checks


def _start_hint(message: str, bus: str | None) -> str:
    for name, hint in START.items():
        if f"the {name} bus" in message:
            return f"start the daemon: {hint}"
    return f"start the daemon: {START['system' if bus == 'system' else 'session']}"


def version(daemon: str) -> dict:
    if daemon == __version__:
        return check("version", OK, f"the daemon and gpuctl are both {daemon}")
    return check("version", WARN, f"the daemon is {daemon}, gpuctl is {__version__}",
                 "restart the daemon after an upgrade (systemctl restart resourced)",
                 daemon=daemon, client=__version__)


def service(environ) -> dict:
    """The unit, bus policy, activation and polkit files, as ``service enable`` wrote them."""
    try:
        modes = install.installed_modes(env=environ)
    except RuntimeError as exc:  # no home directory for the user files
        return check("service", SKIPPED, f"cannot look for the user service: {exc}")
    if not modes:
        return check("service", SKIPPED, "no service is installed (the daemon was started by "
                     "hand, or by a package)", "gpuctl service enable --user, or --system "
                     "for everyone")
    try:
        problems = [(mode, path, why) for mode in modes
                    for path, why in install.drift(mode, env=environ)]
    except install.InstallError as exc:
        return check("service", SKIPPED, f"cannot compare the files: {exc}", modes=modes)
    states = {mode: _unit_state(mode) for mode in modes}
    detail = {"modes": modes, "active": states,
              "problems": [f"{path}: {why}" for _, path, why in problems]}
    dead = _dead_interpreter(modes, environ)
    if dead:
        return check("service", FAIL, f"the unit runs {dead}, which is not there any more",
                     f"gpuctl service enable --{_flag(modes[0])} again, from the environment "
                     "resourced is installed in", **detail)
    if problems:
        mode, path, why = problems[0]
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        return check("service", WARN, f"{path}: {why}{more}",
                     f"gpuctl service enable --{_flag(mode)} writes it again", **detail)
    failed = [m for m, s in states.items() if s == "failed"]
    if failed:
        unit = install.unit_name(failed[0])
        user = " --user" if failed[0] != install.SYSTEM else ""
        return check("service", FAIL, f"{unit} ({failed[0]}) has failed",
                     f"journalctl{user} -u {unit} says why; then systemctl{user} restart "
                     f"{unit}", **detail)
    said = ", ".join(f"{m} ({states[m] or 'state unknown'})" for m in modes)
    return check("service", OK, f"the service's files are as gpuctl service enable wrote "
                 f"them: {said}", **detail)


def _flag(mode: str) -> str:
    return {"system": "system", "user": "user", "shared": "user --shared DIR"}[mode]


def _unit_state(mode: str) -> str:
    """systemctl is-active of the mode's unit; "" where systemd does not answer."""
    import subprocess

    if not os.path.isdir("/run/systemd/system"):
        return ""
    command = ["systemctl", *([] if mode == install.SYSTEM else ["--user"]), "is-active",
               install.unit_name(mode)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=5, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    state = done.stdout.strip()
    return state if re.fullmatch(r"[a-z-]+", state) and "bus" not in done.stderr else ""


def _dead_interpreter(modes: list[str], environ) -> str:
    """The interpreter an installed unit's ExecStart names, where it is gone."""
    for mode in modes:
        unit = install.unit_path(mode, env=environ)
        for line in unit.read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("ExecStart="):
                words = shlex.split(line.partition("=")[2])
                if words and not os.access(words[0], os.X_OK):
                    return words[0]
    return ""


def configuration(mode: str, environ) -> tuple[dict, Config | None]:
    """The check of the configuration the daemon of ``mode`` reads, and that configuration
    (None when it cannot be read), for the checks that look at its settings."""
    try:
        path = find_config(None, environ, system=mode == "system")
        config = load_config(path)
    except ConfigError as exc:
        return check("config", FAIL, str(exc), "fix what it names, then gpuctl config check "
                     "and systemctl reload resourced (or restart the daemon)"), None
    if path is None:
        return check("config", OK, "no configuration file: the defaults apply"), config
    if config.notes:
        return check("config", WARN, f"{path}: {config.notes[0]}", "see gpuctl config check",
                     path=str(path), notes=list(config.notes)), config
    return check("config", OK, f"{path}: ok", path=str(path)), config


def textfile(config: Config | None, now: float | None = None) -> dict:
    """``[metrics] textfile``: there, and written within two health samples."""
    if config is None:
        return check("metrics", SKIPPED, "the configuration cannot be read (see config)")
    path = config.metrics.textfile
    if not path:
        return check("metrics", SKIPPED, "no [metrics] textfile: gpuctl metrics prints them")
    limit = 2 * config.daemon.sample_interval + 5
    try:
        age = (time.time() if now is None else now) - os.stat(path).st_mtime
    except OSError as exc:
        return check("metrics", FAIL, f"the textfile {path} is not there ({exc.strerror})",
                     "the daemon's log says why it cannot write it", path=path)
    if age > limit:
        return check("metrics", FAIL, f"the textfile {path} was last written {age:.0f} s ago",
                     "is the daemon running? its log says why it cannot write", path=path,
                     age_s=round(age, 1))
    return check("metrics", OK, f"the textfile {path} is current ({age:.0f} s old)", path=path,
                 age_s=round(age, 1))


def daemon_checks(client) -> list[dict]:
    try:
        return client.diagnose()
    except ResourcedError as exc:
        return [check("daemon", SKIPPED, f"the daemon does not diagnose itself ({exc})",
                      "upgrade and restart the daemon")]


def device_nodes(view: dict, dev: str = "/dev") -> dict:
    """The NVIDIA device nodes of the GPUs the daemon manages (NVML backend only)."""
    if view["backend"] != "nvml":
        return check("devices", SKIPPED, f"the {view['backend']} backend has no device nodes")
    wanted = ["nvidiactl", *(f"nvidia{g['index']}" for g in view["gpus"])]
    missing = [n for n in wanted if not _is_char_device(os.path.join(dev, n))]
    uvm = _is_char_device(os.path.join(dev, "nvidia-uvm"))
    detail = {"missing": missing, "nvidia_uvm": uvm}
    if missing:
        return check("devices", FAIL, f"no device node {', '.join(dev + '/' + n for n in missing)}",
                     "load the driver (nvidia-modprobe, or nvidia-smi as root makes them)",
                     **detail)
    note = "" if uvm else " (nvidia-uvm appears at the first CUDA call)"
    return check("devices", OK, f"{len(wanted)} device nodes present{note}", **detail)


def _is_char_device(path: str) -> bool:
    try:
        return stat.S_ISCHR(os.stat(path).st_mode)
    except OSError:
        return False


def isolation(client, config: Config | None) -> dict:
    """Whether claims' commands run confined to their GPUs: the daemon can (the system
    service), and ``[daemon] isolation`` says when."""
    try:
        features = client._send(client._get_property("Features"))[0][1]
    except ResourcedError as exc:
        return check("isolation", SKIPPED, f"cannot read the daemon's features: {exc}")
    if "isolation" not in features:
        return check("isolation", SKIPPED, "this daemon cannot confine claims to their GPUs "
                     "(only the system service can): resourced is cooperative here "
                     "(gpuctl verify shows who ignores it)")
    setting = config.daemon.isolation if config is not None else "unknown"
    if setting == "off":
        return check("isolation", SKIPPED, "isolation is off: claims are cooperative "
                     "(gpuctl verify shows who ignores them)", 'to confine them, set [daemon] '
                     'isolation = "opt-in" or "always", then systemctl reload resourced',
                     setting=setting)
    return check("isolation", OK, f'isolation is "{setting}": isolated commands open their '
                 "claim's GPUs and no others (resourced-isolation.service starts their scopes)",
                 setting=setting)


TIME_ERROR = 5
"""adjtimex's answer when the kernel's clock is not synchronised."""


def clock() -> dict:
    """The kernel's view of clock synchronisation (adjtimex, read-only: modes 0)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        buf = ctypes.create_string_buffer(512)  # struct timex, with room to spare
        state = libc.adjtimex(buf)
    except (OSError, AttributeError):
        return check("clock", SKIPPED, "cannot ask the kernel (adjtimex)")
    if state < 0:
        return check("clock", SKIPPED, f"adjtimex failed: {os.strerror(ctypes.get_errno())}")
    if state == TIME_ERROR:
        return check("clock", WARN, "the clock is not synchronised: bookings start and end by it",
                     "enable time synchronisation (timedatectl set-ntp true, or chrony)",
                     adjtimex=state)
    return check("clock", OK, "the clock is synchronised", adjtimex=state)


GRES_FILE = re.compile(r"\bFile=/dev/nvidia(\[[0-9,\-]+\]|[0-9]+)")


def slurm_split(view: dict, environ, gres: str | None = None) -> dict:
    """GPUs that Slurm's gres.conf hands out and [slurm] gpus does not keep from our claims."""
    path = Path(gres) if gres else Path(
        environ.get("SLURM_CONF", "/etc/slurm/slurm.conf")).with_name("gres.conf")
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return check("slurm", SKIPPED, f"no {path}: Slurm schedules no GPUs here")
    except OSError as exc:
        return check("slurm", SKIPPED, f"cannot read {path}: {exc.strerror}")
    slurms = set()
    for line in text.splitlines():
        line = line.split("#")[0]
        if re.search(r"\bName=gpu\b", line):
            for match in GRES_FILE.finditer(line):
                slurms |= _indices(match.group(1))
    ours = {g["index"]: g for g in view["gpus"]}
    overlap = sorted(i for i in slurms if i in ours and not ours[i]["slurm"])
    detail = {"gres_conf": str(path), "slurm_indices": sorted(slurms), "overlap": overlap}
    if overlap:
        names = ", ".join(ours[i]["alias"] for i in overlap)
        return check("slurm", FAIL, f"{path} gives Slurm {names}, which resourced also grants",
                     "list them in [slurm] gpus (gpuctl slurm config prints the lines), then "
                     "restart the daemon", **detail)
    return check("slurm", OK, f"Slurm's GPUs ({len(slurms)}) are kept from resourced's claims",
                 **detail)


def _indices(text: str) -> set[int]:
    if not text.startswith("["):
        return {int(text)}
    found = set()
    for part in text.strip("[]").split(","):
        low, _, high = part.partition("-")
        if low.isdigit() and (not high or high.isdigit()):
            found |= set(range(int(low), int(high or low) + 1))
    return found


def linger(environ, linger_dir: str = "/var/lib/systemd/linger") -> dict:
    """A user service stops at its user's last logout unless lingering is on."""
    try:
        modes = [m for m in install.installed_modes(env=environ) if m != install.SYSTEM]
    except RuntimeError:
        modes = []
    if not modes:
        return check("linger", SKIPPED, "no user service is installed")

    user = user_name(os.getuid())
    if os.path.exists(os.path.join(linger_dir, user)):
        return check("linger", OK, f"lingering is on for {user}: the user service outlives "
                     "logouts")
    return check("linger", WARN, f"lingering is off for {user}: the user service (and its "
                 "claims) stop at the last logout", f"loginctl enable-linger {user}")


def probes(client, view: dict) -> list[dict]:
    """Make and release a claim; make and cancel a booking a week ahead; each timed."""
    found = []
    if view["free"]:
        try:
            begun = time.monotonic()
            ref = client.claim(mode="run", gpus=1, owner_pid=os.getpid(),
                               label="gpuctl doctor --probe")["allocation"]["ref"]
            claimed = time.monotonic()
            client.release(ref)
            done = time.monotonic()
            found.append(check("probe.claim", OK, f"claimed {ref} in {_ms(claimed - begun)} "
                               f"and released it in {_ms(done - claimed)}",
                               claim_ms=_ms_value(claimed - begun),
                               release_ms=_ms_value(done - claimed)))
        except ResourcedError as exc:
            found.append(check("probe.claim", FAIL, f"a claim failed: {exc}",
                               "see the daemon's log (journalctl -u resourced)"))
    else:
        found.append(check("probe.claim", SKIPPED, "no GPU is free to claim"))
    if not view["gpus"]:
        return [*found, check("probe.booking", SKIPPED, "no GPUs to book")]
    horizon = view["limits"].get("booking_horizon") or 0
    ahead = min(7 * 86400, horizon / 2) if horizon else 7 * 86400
    start = int(time.time() + ahead) // 60 * 60
    try:
        begun = time.monotonic()
        booking = client.book(60, gpus=1, start=start, label="gpuctl doctor --probe")["booking"]
        booked = time.monotonic()
        client.cancel(booking["id"], reason="gpuctl doctor --probe")
        done = time.monotonic()
        found.append(check("probe.booking", OK, f"booked {booking['id']} a week ahead in "
                           f"{_ms(booked - begun)} and cancelled it in {_ms(done - booked)}",
                           book_ms=_ms_value(booked - begun),
                           cancel_ms=_ms_value(done - booked)))
    except (ResourcedError, ValueError) as exc:
        found.append(check("probe.booking", FAIL, f"a booking a week ahead failed: {exc}",
                           "see gpuctl slots --gpus 1 --for 1m, and the daemon's log"))
    return found


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms"


def _ms_value(seconds: float) -> float:
    return round(seconds * 1000, 1)
