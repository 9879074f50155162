"""A real systemd, booted for the tests in namespaces of its own, with resourced installed
in it as an administrator would (tests/systemd/conftest.py; benchmarks/systemd_start.py).

``systemd-ns.sh`` (beside this file) boots systemd 252 as PID 1 of new PID, mount, cgroup,
network, UTS and IPC namespaces, on an overlay of ``/`` whose upper layer is a tmpfs:
everything done inside (accounts, files in /etc and /usr/share, the journal) is gone with
it, and the host's files are never written. What the host must provide is made before the
boot, in one directory the overlay shows: ``/opt/resourced-test-<pid>`` holds a virtualenv
made from Debian's ``/usr/bin/python3`` with this source tree installed into it
(non-editable: the unit's ExecStart names it, and ProtectHome= hides /root and /home from
the service), and the namespace's own working directory.

Nothing is left on the host: ``stop`` powers the namespace off (its mounts and processes
go with it), removes the cgroup2 directories made for it (``systemd-ns-resourced-test-<pid>``),
and deletes the directory. The directory is made before the cgroup and deleted after it,
and its journal (``owner.json``: the run's pid and the namespace's init, each with its
start time) stays while the cgroup does. The next run undoes what a killed run or a
failed teardown left (``recover_stale``): from the journal, and a harness cgroup without
its directory; it never touches a live run's.
"""

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).resolve().with_name("systemd-ns.sh")
PREFIX = "/opt/resourced-test-"
CGROUP_PREFIX = "systemd-ns-"  # + the directory's name: the run's cgroup2 directory
DEBIAN_PYTHON = Path("/usr/bin/python3")
SYSTEMD = Path("/lib/systemd/systemd")
POLKITD = Path("/usr/lib/polkit-1/polkitd")
INNER_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"

UNIT = "resourced.service"
BUS_NAME = "org.resourced"
MANAGER = ("org.resourced", "/org/resourced", "org.resourced.Manager")
CONFIG = "/etc/resourced/config.toml"
DROPIN_DIR = "/etc/systemd/system/resourced.service.d"
SIMULATED_DROPIN = f"{DROPIN_DIR}/50-simulated-gpus.conf"
NGPUS = 4
AUDIT_MESSAGE_ID = "3f5b3c2e9a0d4e61b1a7c4d2e8f90a17"  # resourced/linux/sd.py

# The test accounts inside. Their ids are pinned (the first free ones below 60000 on the
# host's account files, which the namespace starts from): processes inside are visible on
# the host with these uids, and another tier's teardown that kills "every process of its
# test users' uids" (tests/system) must never hit ours.
ACCESS_GROUP = "resourced"  # the config's default access_group; the service's own group
USERS = {
    "alice": ("sdt-alice", True),  # in the access group
    "bob": ("sdt-bob", False),  # outside it
    "carol": ("sdt-carol", False),  # runs the per-user service (a home, a user manager)
}

# Walks paths inside the namespace: {path: "kind digest-or-target mode uid:gid"}.
SNAPSHOT_PY = r"""
import hashlib, json, os, stat, sys
out = {}
for top in sys.argv[1:]:
    for d, dirs, files in os.walk(top):
        for n in dirs + files:
            p = os.path.join(d, n)
            try:
                st = os.lstat(p)
            except FileNotFoundError:
                continue
            if stat.S_ISLNK(st.st_mode):
                what = "link " + os.readlink(p)
            elif stat.S_ISREG(st.st_mode):
                with open(p, "rb") as f:
                    what = "file " + hashlib.sha256(f.read()).hexdigest()
            else:
                what = "dir" if stat.S_ISDIR(st.st_mode) else "other"
            out[p] = f"{what} {stat.S_IMODE(st.st_mode):04o} {st.st_uid}:{st.st_gid}"
json.dump(out, sys.stdout)
"""


class NamespaceError(RuntimeError):
    """Something inside did not do what it must; the message has its output."""


# -- prerequisites ----------------------------------------------------------------------
def cgroup2_root() -> Path | None:
    """Where cgroup2 is mounted on the host (hybrid: /sys/fs/cgroup/unified)."""
    for path in (Path("/sys/fs/cgroup/unified"), Path("/sys/fs/cgroup")):
        if (path / "cgroup.procs").exists() and (path / "cgroup.subtree_control").exists():
            return path
    return None


def missing_prerequisites() -> str | None:
    """Why systemd cannot be booted for the tests here, or None."""
    if os.geteuid() != 0:
        return "the systemd tests boot systemd in namespaces: they need root (CI runs them as root)"
    path = os.environ.get("PATH", "") + ":" + INNER_PATH
    need = ["unshare", "nsenter", "setpriv", "pgrep", "systemctl", "journalctl", "busctl",
            "systemd-analyze", "systemd-sysusers", "useradd", "groupadd", "loginctl"]
    absent = [tool for tool in need if shutil.which(tool, path=path) is None]
    for exe in (SYSTEMD, POLKITD):
        if not os.access(exe, os.X_OK):
            absent.append(str(exe))
    if absent:
        return f"missing {', '.join(absent)} (run scripts/system-deps.sh as root)"
    if not Path("/lib/systemd/system/dbus.socket").exists():
        return "the system bus's units are missing (dbus package)"
    if cgroup2_root() is None:
        return "no cgroup2 hierarchy at /sys/fs/cgroup/unified or /sys/fs/cgroup"
    # The overlay's lower layer is the root filesystem alone: what lives on another mount
    # (the venv under /opt, the system under /usr) would not be seen inside.
    if not os.path.isdir("/opt"):
        return "there is no /opt (the tests' venv goes there)"
    separate = [d for d in ("/opt", "/usr") if os.stat(d).st_dev != os.stat("/").st_dev]
    if separate:
        return f"{' and '.join(separate)} not on the root filesystem (the overlay shows / only)"
    check = subprocess.run([str(DEBIAN_PYTHON), "-c", "import venv"], capture_output=True,
                           timeout=30, check=False) if DEBIAN_PYTHON.exists() else None
    if check is None or check.returncode != 0:
        return f"{DEBIAN_PYTHON} lacks venv (run scripts/system-deps.sh: python3-venv)"
    return None


# -- processes ----------------------------------------------------------------------------
def start_time(pid: int) -> int | None:
    """Field 22 of /proc/<pid>/stat: with the pid, names one process for good."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, ValueError):
        return None
    return int(text.rsplit(")", 1)[1].split()[19])


def alive(pid_start) -> bool:
    return bool(pid_start) and start_time(pid_start[0]) == pid_start[1]


def _kill(pid_start, sig=signal.SIGKILL) -> None:
    if alive(pid_start):
        try:
            os.kill(pid_start[0], sig)
        except ProcessLookupError:
            pass


@contextlib.contextmanager
def sigterm_interrupts():
    """While in the block, SIGTERM raises KeyboardInterrupt, so the teardown in a
    ``finally`` runs (a handler someone else installed is left alone)."""
    previous = signal.getsignal(signal.SIGTERM)
    if previous == signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _interrupt)
    try:
        yield
    finally:
        if previous == signal.SIG_DFL:
            signal.signal(signal.SIGTERM, previous)


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


# -- the namespace --------------------------------------------------------------------------
class Namespace:
    """One booted systemd and the host directory it needs (``/opt/resourced-test-<pid>``)."""

    JOURNAL = "owner.json"

    def __init__(self, directory: Path | None = None):
        self.dir = directory or Path(f"{PREFIX}{os.getpid()}")
        self.venv = self.dir / "venv"
        self.base = self.dir / "ns"
        self.owner = (os.getpid(), start_time(os.getpid()))
        self.init: tuple[int, int] | None = None
        self.unshare: tuple[int, int] | None = None
        cg2 = cgroup2_root()
        self.cgroup = cg2 / f"{CGROUP_PREFIX}{self.dir.name}" if cg2 else None
        self.timings: dict[str, float] = {}
        self.ids: dict[str, int] = {}  # account name -> its pinned uid (and gid)
        self.launcher: subprocess.Popen | None = None
        self.notes: list[str] = []  # what the teardown said without failing

    # -- the journal of what to undo ----------------------------------------------------
    def save(self) -> None:
        state = {"owner": self.owner, "init": self.init, "unshare": self.unshare,
                 "cgroup": str(self.cgroup) if self.cgroup else None}
        tmp = self.dir / f".{self.JOURNAL}.tmp"
        tmp.write_text(json.dumps(state))
        os.replace(tmp, self.dir / self.JOURNAL)

    @classmethod
    def from_journal(cls, directory: Path) -> "Namespace":
        ns = cls(directory)
        try:
            state = json.loads((directory / cls.JOURNAL).read_text())
        except (FileNotFoundError, ValueError):
            # Killed before the journal was written: the pid is in the name.
            pid = directory.name[len(Path(PREFIX).name):]
            ns.owner = (int(pid), None) if pid.isdigit() else None
            return ns
        ns.owner = tuple(state["owner"]) if state["owner"] else None
        ns.init = tuple(state["init"]) if state["init"] else None
        ns.unshare = tuple(state["unshare"]) if state["unshare"] else None
        if state.get("cgroup"):
            ns.cgroup = Path(state["cgroup"])
        return ns

    @classmethod
    def recover_stale(cls) -> list[str]:
        """Undo what runs killed before their teardown left; returns what was undone."""
        undone = []
        for directory in sorted(Path(PREFIX).parent.glob(Path(PREFIX).name + "*")):
            if directory.is_symlink() or not directory.is_dir():
                continue
            ns = cls.from_journal(directory)
            if ns.owner and ns.owner[0] == os.getpid():
                continue
            if ns.owner and (alive(ns.owner) if ns.owner[1] is not None
                             else Path(f"/proc/{ns.owner[0]}").exists()):
                continue  # a live run's
            ns.stop(graceful=False)
            undone.append(str(directory))
        # A cgroup whose directory is gone: no live run's (the directory outlives it).
        cg2 = cgroup2_root()
        for cgroup in sorted(cg2.glob(f"{CGROUP_PREFIX}{Path(PREFIX).name}*") if cg2 else ()):
            if not (Path(PREFIX).parent / cgroup.name[len(CGROUP_PREFIX):]).exists():
                _remove_cgroup(cgroup)
                undone.append(str(cgroup))
        return undone

    # -- set-up -----------------------------------------------------------------------------
    def create(self) -> None:
        self.dir.mkdir(mode=0o755)
        self.dir.chmod(0o755)  # the service account runs the venv's interpreter
        self.save()

    def build_venv(self) -> None:
        """A venv of Debian's python with this tree installed (non-editable) into it.

        The venv is made without pip, and this interpreter's pip installs into it (pip's
        cache is reused; the build runs in pip's isolated environment). The source is
        copied first, so nothing is ever written into the checkout.
        """
        t = time.monotonic()
        src = self.dir / "src"
        shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(
            ".git", ".venv", "venv", "build", "dist", "*.egg-info", "__pycache__",
            ".pytest_cache", ".hypothesis", ".ruff_cache", "tests", "benchmarks"))
        env = {k: v for k, v in os.environ.items()
               if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV")}
        env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
        _checked([str(DEBIAN_PYTHON), "-m", "venv", "--without-pip", str(self.venv)],
                 timeout=120, env=env)
        self.timings["venv"] = time.monotonic() - t
        t = time.monotonic()
        if _pip_has_python_option():
            argv = [sys.executable, "-m", "pip", "--python", str(self.venv / "bin/python")]
        else:  # an old pip: the venv gets its own (slower)
            _checked([str(DEBIAN_PYTHON), "-m", "venv", "--upgrade-deps", str(self.venv)],
                     timeout=300, env=env)
            argv = [str(self.venv / "bin/python"), "-m", "pip"]
        _checked([*argv, "install", "-q", "--no-compile", str(src)], timeout=600, env=env)
        shutil.rmtree(src)
        for path in self.venv.rglob("*"):  # readable by the service account
            if not path.is_symlink():
                path.chmod(path.stat().st_mode | 0o444 | (0o111 if path.is_dir() else 0))
        self.timings["pip install"] = time.monotonic() - t

    def boot(self) -> None:
        """Boot systemd; the namespace dies with this process, however it ends: ``run``
        becomes unshare under ``setpriv --pdeathsig KILL`` (killed when we die), and
        unshare --kill-child takes the namespace's init with it."""
        t = time.monotonic()
        self.base.mkdir(exist_ok=True)
        self.launcher = subprocess.Popen(
            ["setpriv", "--pdeathsig", "KILL", "--", str(SCRIPT), "run"],
            env=self._script_env(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            cp = subprocess.run([str(SCRIPT), "wait"], env=self._script_env(), check=False,
                                capture_output=True, text=True, timeout=90,
                                stdin=subprocess.DEVNULL)
            failure = None if cp.returncode == 0 else f"({cp.returncode}): {cp.stderr.strip()}"
        except subprocess.TimeoutExpired:
            failure = "(timed out)"
        self._journal_pids()
        if failure:
            console = self.base / "console.log"
            raise NamespaceError(f"systemd did not boot {failure}\n"
                                 f"{console.read_text(errors='replace') if console.exists() else ''}")
        self.timings["boot"] = time.monotonic() - t

    def _journal_pids(self) -> None:
        for attr, name in (("init", "init.pid"), ("unshare", "unshare.pid")):
            try:
                pid = int((self.base / name).read_text())
            except (FileNotFoundError, ValueError):
                continue
            setattr(self, attr, (pid, start_time(pid)))
        self.save()

    def _script_env(self) -> dict[str, str]:
        return {"PATH": os.environ.get("PATH", "") + ":" + INNER_PATH, "LANG": "C.UTF-8",
                "SYSD_NS_BASE": str(self.base),
                "SYSD_NS_CGROUP": self.cgroup.name if self.cgroup else ""}

    # -- as an administrator --------------------------------------------------------------
    def scrub(self) -> None:
        """Start from a machine without resourced: the namespace begins as a copy of the
        host, which may have it installed (or have tests/system's account at this very
        moment). Removed inside only (the overlay): the files enable writes, the config,
        the state, the account and its group."""
        from resourced.linux import install

        paths = [str(p) for p in install.plan_disable(install.SYSTEM).remove]
        paths += ["/etc/resourced", DROPIN_DIR, "/var/lib/resourced",
                  f"/etc/systemd/system/multi-user.target.wants/{UNIT}"]
        self.run("rm", "-rf", "--", *paths)
        for kind, tool in (("passwd", "userdel"), ("group", "groupdel")):
            if self.run("getent", kind, ACCESS_GROUP, check=False).returncode == 0:
                self.run(tool, ACCESS_GROUP)

    def create_accounts(self) -> None:
        """The access group (as README's install says, before ``service enable``) and the
        test users, with pinned ids (see USERS)."""
        taken = self.run("sh", "-c", "getent passwd | cut -d: -f3; getent group | cut -d: -f3"
                         ).stdout.split()
        free = [n for n in range(59990, 59000, -1) if str(n) not in taken]
        names = [ACCESS_GROUP, *(login for login, _ in USERS.values())]
        self.ids = dict(zip(names, free))
        self.run("groupadd", "--system", "--gid", str(self.ids[ACCESS_GROUP]), ACCESS_GROUP)
        for key, (login, member) in USERS.items():
            argv = ["useradd", "--uid", str(self.ids[login]), "--user-group", "--no-log-init",
                    "--shell", "/usr/sbin/nologin", "--comment", "resourced systemd test"]
            argv += ["--create-home"] if key == "carol" else ["--no-create-home"]
            if member:
                argv += ["--groups", ACCESS_GROUP]
            self.run(*argv, login)

    def configure(self) -> None:
        """``gpuctl init --system`` on simulated GPUs, and a drop-in that gives the service
        the same simulated GPUs (the only thing the tests add to the unit)."""
        self.gpuctl("init", "--system", env={"RESOURCED_SIMULATED_GPUS": str(NGPUS)})
        self.write(SIMULATED_DROPIN,
                   "# tests/systemd: the service runs on simulated GPUs\n"
                   f"[Service]\nEnvironment=RESOURCED_SIMULATED_GPUS={NGPUS}\n")

    def enable(self) -> subprocess.CompletedProcess:
        return self.gpuctl("service", "enable", "--system", timeout=90)

    # -- inside -----------------------------------------------------------------------------
    def command(self, *argv: str, user: str | None = None, env: dict | None = None,
                session: bool = False) -> list[str]:
        """The host command line that runs ``argv`` inside: a clean environment, as root or
        as ``user`` (a login: its uid, its groups, its HOME); with ``session``, in a scope
        of that user's slice, as a login session's processes run (isolation moves no
        other process)."""
        if self.init is None:
            raise NamespaceError("the namespace is not booted")
        base = {"PATH": INNER_PATH, "LANG": "C.UTF-8", "HOME": "/root", "TERM": "dumb"}
        prefix = []
        if user is not None:
            home = "/home/" + user if user == USERS["carol"][0] else "/"
            base.update(HOME=home, USER=user, LOGNAME=user)
            prefix = ["setpriv", f"--reuid={user}", f"--regid={user}", "--init-groups", "--"]
            if session:
                prefix = ["systemd-run", "--scope", "--quiet", "--collect",
                          f"--slice=user-{self.ids[user]}.slice", "--", *prefix]
        merged = {**base, **(env or {})}
        return ["nsenter", "-t", str(self.init[0]), "-a", *prefix, "env", "-i",
                *(f"{k}={v}" for k, v in merged.items()), *argv]

    def run(self, *argv: str, user: str | None = None, env: dict | None = None,
            timeout: float = 30, check: bool = True, input: str | None = None,
            session: bool = False) -> subprocess.CompletedProcess:
        cp = subprocess.run(self.command(*argv, user=user, env=env, session=session),
                            capture_output=True,
                            text=True, timeout=timeout, input=input, check=False,
                            stdin=None if input is not None else subprocess.DEVNULL)
        if check and cp.returncode != 0:
            raise NamespaceError(f"{' '.join(argv)}{f' (as {user})' if user else ''} failed "
                                 f"({cp.returncode}):\n{cp.stdout}{cp.stderr}")
        return cp

    def gpuctl(self, *args: str, user: str | None = None, check: bool = True, **kw):
        return self.run(str(self.venv / "bin/gpuctl"), *args, user=user, check=check, **kw)

    def python(self, code: str, *args: str, **kw) -> subprocess.CompletedProcess:
        return self.run(str(self.venv / "bin/python"), "-c", code, *args, **kw)

    def write(self, path: str, text: str) -> None:
        self.run("sh", "-c", 'mkdir -p "$(dirname "$1")" && cat > "$1"', "sh", path, input=text)

    def systemctl(self, *args: str, check: bool = True, timeout: float = 60):
        return self.run("systemctl", *args, check=check, timeout=timeout)

    def show(self, unit: str = UNIT, *props: str, user_manager: str | None = None
             ) -> dict[str, str]:
        argv = ["systemctl", "show", unit]
        argv += [f"--property={','.join(props)}"] if props else []
        if user_manager:
            cp = self.run(*argv[:1], "--user", *argv[1:], user=user_manager,
                          env=self.user_session_env(user_manager))
        else:
            cp = self.run(*argv)
        return dict(line.split("=", 1) for line in cp.stdout.splitlines() if "=" in line)

    def journal(self, *matches: str) -> list[dict]:
        """``journalctl -o json MATCHES``: the entries, oldest first."""
        cp = self.run("journalctl", "--no-pager", "-o", "json", *matches)
        return [json.loads(line) for line in cp.stdout.splitlines() if line.strip()]

    def name_owned(self, name: str = BUS_NAME) -> bool:
        """NameHasOwner on the system bus (never activates anything)."""
        cp = self.run("busctl", "call", "org.freedesktop.DBus", "/org/freedesktop/DBus",
                      "org.freedesktop.DBus", "NameHasOwner", "s", name)
        return cp.stdout.strip() == "b true"

    def user_session_env(self, login: str) -> dict[str, str]:
        runtime = f"/run/user/{self.ids[login]}"
        return {"XDG_RUNTIME_DIR": runtime, "DBUS_SESSION_BUS_ADDRESS": f"unix:path={runtime}/bus"}

    def snapshot(self, *paths: str) -> dict[str, str]:
        return json.loads(self.python(SNAPSHOT_PY, *paths, timeout=60).stdout)

    def status(self, user: str | None = None) -> dict:
        return json.loads(self.gpuctl("status", "--json", user=user).stdout)

    def claims(self) -> dict[str, dict]:
        return {c["id"]: c for c in self.status()["claims"]}

    def wait_for(self, predicate, timeout: float, what: str, interval: float = 0.05):
        deadline = time.monotonic() + timeout
        last = None
        while True:
            try:
                value = predicate()
            except (NamespaceError, ValueError, KeyError, subprocess.TimeoutExpired) as exc:
                value, last = None, exc
            if value:
                return value
            if time.monotonic() > deadline:
                raise NamespaceError(f"timed out after {timeout:g} s waiting for {what}"
                                     + (f" (last error: {last})" if last else ""))
            time.sleep(interval)

    def host_pid(self, pid: int) -> int | None:
        """The host's pid of the namespace's process ``pid`` (NSpid in its status)."""
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                status = (entry / "status").read_text()
            except (FileNotFoundError, ProcessLookupError):
                continue
            for line in status.splitlines():
                if line.startswith("NSpid:"):
                    ids = line.split()[1:]
                    if len(ids) == 2 and int(ids[1]) == pid and self._in_our_pidns(entry):
                        return int(ids[0])
        return None

    def _in_our_pidns(self, proc_dir: Path) -> bool:
        try:
            return os.readlink(proc_dir / "ns/pid") == os.readlink(f"/proc/{self.init[0]}/ns/pid")
        except OSError:
            return False

    # -- teardown ----------------------------------------------------------------------------
    def stop(self, graceful: bool = True) -> list[str]:
        """Power the namespace off and remove everything made for it; returns the
        problems (empty when nothing is left). ``graceful=False`` (another run's leftovers)
        only SIGKILLs the processes its journal names, each checked by its start time."""
        problems = []
        if graceful and (self.init or self.unshare):
            try:
                cp = subprocess.run([str(SCRIPT), "stop"], env=self._script_env(), check=False,
                                    capture_output=True, text=True, timeout=60,
                                    stdin=subprocess.DEVNULL)
                if cp.returncode != 0:
                    problems.append(f"systemd-ns.sh stop failed: {cp.stderr.strip()}")
                elif cp.stderr.strip():
                    self.notes.append(cp.stderr.strip())
            except subprocess.TimeoutExpired:
                problems.append("systemd-ns.sh stop timed out")
        # Whatever the script could not do (no pid files: a run killed at boot).
        for pid_start in (self.init, self.unshare):
            _kill(pid_start)
        if self.launcher is not None:
            try:
                self.launcher.wait(10)
            except subprocess.TimeoutExpired:
                self.launcher.kill()
                self.launcher.wait(10)
        deadline = time.monotonic() + 10
        while any(alive(p) for p in (self.init, self.unshare)) and time.monotonic() < deadline:
            time.sleep(0.02)
        if self.cgroup is not None and self.cgroup.exists():
            _remove_cgroup(self.cgroup)
        if self.cgroup is not None and self.cgroup.exists():
            # The journal stays, for the next run's recover_stale to try again.
            for path in self.dir.iterdir() if self.dir.exists() else ():
                if path.name != self.JOURNAL:
                    _rm(path)
        elif self.dir.exists():
            shutil.rmtree(self.dir, ignore_errors=True)
        return problems + self.leftovers()

    def leftovers(self) -> list[str]:
        found = []
        for name, pid_start in (("init", self.init), ("unshare", self.unshare)):
            if alive(pid_start):
                found.append(f"the namespace's {name} (pid {pid_start[0]}) still runs")
        if self.cgroup is not None and self.cgroup.exists():
            found.append(f"{self.cgroup} still exists")
        if self.dir.exists():
            found.append(f"{self.dir} still exists")
        mounts = Path("/proc/self/mountinfo").read_text()
        if str(self.dir) in mounts:
            found.append(f"mounts under {self.dir} remain on the host")
        return found


def _remove_cgroup(path: Path) -> None:
    """Remove a run's cgroup2 directory, deepest first; what still runs in it (a run's
    namespace, whose processes only the run knew) is killed first."""
    with contextlib.suppress(OSError):
        (path / "cgroup.kill").write_text("1")  # Linux 5.14: the whole subtree
    deadline = time.monotonic() + 10
    while path.exists() and time.monotonic() < deadline:
        for d, _, _ in sorted(os.walk(path), key=lambda e: -e[0].count("/")):
            try:
                os.rmdir(d)
            except OSError:
                pass
        if path.exists():
            time.sleep(0.05)


def _rm(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def _checked(argv: list[str], timeout: float, env: dict | None = None) -> None:
    """Run a host command that must succeed; it dies with us (a killed run's pip does
    not write on into a directory the next run removes)."""
    argv = ["setpriv", "--pdeathsig", "KILL", "--", *argv]
    cp = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env,
                        stdin=subprocess.DEVNULL, check=False)
    if cp.returncode != 0:
        raise NamespaceError(f"{' '.join(argv)} failed ({cp.returncode}):\n{cp.stdout}{cp.stderr}")


def _pip_has_python_option() -> bool:
    """pip >= 22.3 installs into another interpreter's environment (--python)."""
    cp = subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True,
                        text=True, timeout=60, stdin=subprocess.DEVNULL, check=False)
    if cp.returncode != 0:
        return False
    try:
        major, minor = (int(x) for x in cp.stdout.split()[1].split(".")[:2])
    except (IndexError, ValueError):
        return False
    return (major, minor) >= (22, 3)


def boot_with_resourced(ns: Namespace) -> None:
    """The whole set-up, as README's system-wide install says, short of ``service
    enable`` (which the caller runs, to snapshot what it changes)."""
    ns.create()
    ns.build_venv()
    ns.boot()
    t = time.monotonic()
    ns.scrub()
    ns.create_accounts()
    ns.configure()
    ns.timings["accounts and config"] = time.monotonic() - t
