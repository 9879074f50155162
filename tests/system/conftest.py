"""Tier 4 of the testing guide: the multi-user truth, with real parts.

One set-up for the directory (a package-scoped fixture) makes, as root, a private
"system" bus (our real ``dbus/org.resourced.conf`` inside the default-deny policy of
Debian's ``system.conf``), the real polkitd with our real ``.policy`` and ``.rules``, test
users and groups, and the daemon running as the ``resourced`` account; the tests then run
``gpuctl`` and a small D-Bus client as those users.

Why the detours:

* The project's own venv may live where other users cannot go (a pyenv build in root's
  0700 home, a checkout under /root), so everything other users run is a venv made from
  Debian's ``/usr/bin/python3`` in a world-readable (0755) temporary directory, with the
  project installed into it non-editably from a copy of the source tree. The copy is
  deleted once installed: the daemon and the clients never touch the checkout.
* The bus socket lives in the same 0755 directory, so every user reaches it.

Nothing is left behind: every process started is killed by its pid; the installed polkit
files are removed (or the machine's own put back); the users and groups are deleted, and
the twelve account files (/etc/{passwd,group,shadow,gshadow,subuid,subgid} and their ``-``
backups) are put back byte for byte, with their times. The teardown then checks all of
that and fails the run (an error at teardown) if anything remains. SIGINT and SIGTERM end
the run through that teardown; after a SIGKILL, the next run undoes what was left, from
the journal (recovery.json) kept in the temporary directory.

It all needs root and Debian's dbus-daemon, polkitd, setpriv/runuser and useradd
(``scripts/system-deps.sh`` installs them); without them the directory skips itself,
unless RESOURCED_TESTS_REQUIRE_SYSTEM=1 (set by .ci/run) makes that a failure. One run
at a time per machine: a second waits for the first.
"""

import base64
import grp
import hashlib
import json
import os
import pwd
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import pytest

from resourced.daemon.shared_bus import SYSTEM_BUS_DEFAULTS

ROOT = Path(__file__).resolve().parents[2]

PREFIX = "rdt-"
ACCESS_GROUP = PREFIX + "gpu"
ADMIN_GROUP = PREFIX + "admin"
# key -> (login, supplementary groups)
USERS = {
    "alice": (PREFIX + "alice", (ACCESS_GROUP,)),  # in the access group
    "dave": (PREFIX + "dave", (ACCESS_GROUP,)),  # in the access group too
    "bob": (PREFIX + "bob", ()),  # outside it
    "carol": (PREFIX + "carol", (ADMIN_GROUP,)),  # an administrator
}
SERVICE_ACCOUNT = "resourced"
SERVICE_COMMENT = "resourced daemon (made by tests/system)"  # tells a stale one of ours
NGPUS = 4

POLKITD = Path("/usr/lib/polkit-1/polkitd")
DEBIAN_PYTHON = Path("/usr/bin/python3")
POLICY_DEST = Path("/usr/share/polkit-1/actions/org.resourced.policy")
RULES_DEST = Path("/etc/polkit-1/rules.d/50-resourced.rules")
ADMIN_RULES_DEST = Path("/etc/polkit-1/rules.d/49-rdt-test-admin.rules")
POLKIT_FILES = (POLICY_DEST, RULES_DEST, ADMIN_RULES_DEST)
ADMIN_RULES = f"""\
// resourced system tests only (tests/system/conftest.py): administrators may release
// other users' claims and manage the daemon. Removed when the tests end.
polkit.addRule(function(action, subject) {{
    if ((action.id == "org.resourced.release-other" ||
         action.id == "org.resourced.manage") &&
        subject.isInGroup("{ADMIN_GROUP}")) {{
        return polkit.Result.YES;
    }}
}});
"""

ACCOUNT_FILES = tuple(
    Path(f"/etc/{name}{suffix}")
    for name in ("passwd", "group", "shadow", "gshadow", "subuid", "subgid")
    for suffix in ("", "-")
)
# useradd -l keeps these untouched; checked, never rewritten.
LOG_FILES = (Path("/var/log/lastlog"), Path("/var/log/faillog"))

BUS_NAME = "org.resourced"
MANAGER_PATH = "/org/resourced"
MANAGER_IFACE = "org.resourced.Manager"
POLKIT_NAME = "org.freedesktop.PolicyKit1"

REQUIRED = os.environ.get("RESOURCED_TESTS_REQUIRE_SYSTEM") == "1"
"""Set by .ci/run: fail rather than skip when these tests cannot run (read at import,
before the suite's autouse fixture clears RESOURCED_* variables)."""

LOCK_NAME = "\0resourced-system-tests"
"""An abstract socket name: one run at a time per machine; gone when its holder dies."""
LOCK_WAIT = 600.0

TIMINGS: dict[str, float] = {}
"""Seconds per set-up step, shown at the end of the run."""

# The D-Bus client the users run (from the test venv): one call, then one line of JSON,
# {"ok": <reply body>} or {"error": <D-Bus error name>, "message": ...}; exit 0 / 1.
CALL_PY = '''\
import ast, json, sys
from jeepney import DBusAddress, MessageType, new_method_call
from jeepney.io.blocking import open_dbus_connection
from jeepney.low_level import HeaderFields

dest, path, iface, member, signature, body = sys.argv[1:7]
conn = open_dbus_connection("SYSTEM")
msg = new_method_call(DBusAddress(path, bus_name=dest, interface=iface), member,
                      signature or None, ast.literal_eval(body) if body else ())
reply = conn.send_and_get_reply(msg, timeout=25)
if reply.header.message_type is MessageType.error:
    text = reply.body[0] if reply.body and isinstance(reply.body[0], str) else ""
    print(json.dumps({"error": reply.header.fields.get(HeaderFields.error_name), "message": text}))
    sys.exit(1)
print(json.dumps({"ok": list(reply.body)}, default=repr))
'''


# -- prerequisites ------------------------------------------------------------------------
def missing_prerequisites() -> str | None:
    """Why the system tests cannot run here, or None."""
    if os.geteuid() != 0:
        return "the multi-user system tests need root (CI runs them as root)"
    need = ["dbus-daemon", "setpriv", "runuser", "useradd", "userdel", "groupadd", "groupdel"]
    path = os.environ.get("PATH", "") + ":/usr/sbin:/sbin:/usr/bin:/bin"
    absent = [tool for tool in need if shutil.which(tool, path=path) is None]
    if not os.access(POLKITD, os.X_OK):
        absent.append(str(POLKITD))
    if absent:
        return f"missing {', '.join(absent)} (run scripts/system-deps.sh as root)"
    check = subprocess.run([str(DEBIAN_PYTHON), "-c", "import venv, ensurepip"],
                           capture_output=True) if DEBIAN_PYTHON.exists() else None
    if check is None or check.returncode != 0:
        return f"{DEBIAN_PYTHON} lacks venv/ensurepip (run scripts/system-deps.sh: python3-venv)"
    try:
        pwd.getpwnam("polkitd")
    except KeyError:
        return "polkitd's account is missing (reinstall the polkitd package)"
    return None


# -- small helpers --------------------------------------------------------------------------
def _tool(name: str) -> str:
    found = shutil.which(name, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin")
    if found is None:
        raise RuntimeError(f"{name} not found")
    return found


def _run(*argv: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """Run a root command that must succeed."""
    cp = subprocess.run([_tool(argv[0]), *argv[1:]], capture_output=True, text=True,
                        timeout=timeout, stdin=subprocess.DEVNULL)
    if cp.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({cp.returncode}): {cp.stderr.strip()}")
    return cp


def _digest(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except FileNotFoundError:
        return None


def _ours(name: str, extra: frozenset[str]) -> bool:
    return name.startswith(PREFIX) or name in extra


def our_accounts(extra: frozenset[str] = frozenset()) -> list[str]:
    """Users and groups of ours (prefix ``rdt-``, plus ``extra``) that exist now."""
    found = [f"user {p.pw_name}" for p in pwd.getpwall() if _ours(p.pw_name, extra)]
    found += [f"group {g.gr_name}" for g in grp.getgrall() if _ours(g.gr_name, extra)]
    return found


def _pids_of_uids(uids: set[int]) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if entry.stat().st_uid in uids:
                    pids.append(int(entry.name))
            except FileNotFoundError:
                pass
    return pids


def _kill_pids(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


class FileState:
    """One file as it was: its bytes, mode and owner; ``data is None`` when absent."""

    def __init__(self, path: Path):
        self.path = path
        try:
            st = path.stat()
        except FileNotFoundError:
            self.data = None
            return
        self.data = path.read_bytes()
        self.mode, self.uid, self.gid = stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid
        self.times = (st.st_atime_ns, st.st_mtime_ns)

    def same_now(self) -> bool:
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return self.data is None
        return (self.data == self.path.read_bytes() and
                (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid) ==
                (self.mode, self.uid, self.gid))

    def put_back(self) -> None:
        if self.data is None:
            self.path.unlink(missing_ok=True)
            return
        tmp = self.path.with_name(f".{self.path.name}.rdt-restore")
        tmp.write_bytes(self.data)
        os.chown(tmp, self.uid, self.gid)
        os.chmod(tmp, self.mode)
        os.utime(tmp, ns=self.times)
        os.replace(tmp, self.path)

    def restore_times(self) -> None:
        """Same content, but rewritten (userdel does): give it back its old times."""
        if self.data is not None and self.same_now():
            os.utime(self.path, ns=self.times)

    def to_json(self) -> dict:
        if self.data is None:
            return {"path": str(self.path), "data": None}
        return {"path": str(self.path), "data": base64.b64encode(self.data).decode(),
                "mode": self.mode, "uid": self.uid, "gid": self.gid, "times": self.times}

    @classmethod
    def from_json(cls, d: dict) -> "FileState":
        state = cls.__new__(cls)
        state.path = Path(d["path"])
        state.data = None if d["data"] is None else base64.b64decode(d["data"])
        if state.data is not None:
            state.mode, state.uid, state.gid = d["mode"], d["uid"], d["gid"]
            state.times = tuple(d["times"])
        return state


def _dir_times(paths) -> dict[Path, tuple[int, int]]:
    times = {}
    for path in paths:
        try:
            st = path.stat()
        except FileNotFoundError:
            continue
        times[path] = (st.st_atime_ns, st.st_mtime_ns)
    return times


def _without_ours(data: bytes | None, extra: frozenset[str]) -> list[str]:
    """An account file's lines with our entries dropped and our names out of member lists."""
    lines = []
    for line in (data or b"").decode(errors="replace").splitlines():
        fields = line.split(":")
        if _ours(fields[0], extra):
            continue
        if len(fields) == 4:  # group (gid, members) and gshadow (admins, members)
            for i in (2, 3):
                fields[i] = ",".join(m for m in fields[i].split(",") if not _ours(m, extra))
        lines.append(":".join(fields))
    return lines


# -- the rig ----------------------------------------------------------------------------
class Rig:
    """Everything one session sets up, and how to use it from the tests."""

    def __init__(self):
        self.dir: Path | None = None
        self.venv: Path | None = None
        self.socket: Path | None = None
        self.address = ""
        self.procs: dict[str, subprocess.Popen] = {}
        self.pids: dict[str, tuple[int, int]] = {}  # name -> (pid, start time): the journal's
        self.user_uids: set[int] = set()
        self.logs: dict[str, Path] = {}
        self.users: dict[str, pwd.struct_passwd] = {}
        self.sleepers: dict[str, int] = {}  # user key (or "root") -> pid of a long-lived process
        self.groups_created: list[str] = []
        self.users_created: list[str] = []
        self.created_service_account = False
        self.created_service_group = False
        self.service: pwd.struct_passwd | None = None
        self.account_files: list[FileState] = []
        self.log_digests: dict[Path, str | None] = {}
        self.polkit_files: list[FileState] = []
        self.dir_times: dict[Path, tuple[int, int]] = {}
        self.cleanup_errors: list[str] = []

    # -- the journal: what a killed run leaves for the next one to undo -------------------
    JOURNAL = "recovery.json"

    def save(self) -> None:
        """Write down what to undo, so that a run killed with SIGKILL is undone by the next."""
        if self.dir is None:
            return
        state = {
            "dir": str(self.dir), "pids": self.pids, "user_uids": sorted(self.user_uids),
            "users_created": self.users_created, "groups_created": self.groups_created,
            "created_service_account": self.created_service_account,
            "created_service_group": self.created_service_group,
            "service_uid": self.service.pw_uid if self.service else None,
            "account_files": [f.to_json() for f in self.account_files],
            "log_digests": {str(k): v for k, v in self.log_digests.items()},
            "polkit_files": [f.to_json() for f in self.polkit_files],
            "dir_times": {str(k): v for k, v in self.dir_times.items()},
        }
        tmp = self.dir / f".{self.JOURNAL}.tmp"
        with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
            json.dump(state, f)  # 0600: it holds /etc/shadow
        os.replace(tmp, self.dir / self.JOURNAL)

    @classmethod
    def from_journal(cls, path: Path) -> "Rig":
        state = json.loads(path.read_text())
        r = cls()
        r.dir = Path(state["dir"])
        r.pids = {name: tuple(v) for name, v in state["pids"].items()}
        r.user_uids = set(state["user_uids"])
        r.users_created = state["users_created"]
        r.groups_created = state["groups_created"]
        r.created_service_account = state["created_service_account"]
        r.created_service_group = state["created_service_group"]
        if state["service_uid"] is not None and r.created_service_account:
            r.user_uids.add(state["service_uid"])
        r.account_files = [FileState.from_json(d) for d in state["account_files"]]
        r.log_digests = {Path(k): v for k, v in state["log_digests"].items()}
        r.polkit_files = [FileState.from_json(d) for d in state["polkit_files"]]
        r.dir_times = {Path(k): tuple(v) for k, v in state["dir_times"].items()}
        return r

    @classmethod
    def recover_killed_runs(cls) -> None:
        """Undo what runs killed before their teardown left (we hold the lock: they are dead)."""
        for journal in Path("/tmp").glob(f"{PREFIX}*/{cls.JOURNAL}"):
            try:
                cls.from_journal(journal).teardown()
                warnings.warn(f"undid what a killed run of tests/system left ({journal.parent})")
            except Exception as exc:  # noqa: BLE001 - report, and go on with this run
                warnings.warn(f"undoing a killed run of tests/system ({journal.parent}): {exc}")
                shutil.rmtree(journal.parent, ignore_errors=True)

    # -- set-up -------------------------------------------------------------------------
    def setup(self) -> None:
        t0 = time.monotonic()
        self.recover_killed_runs()
        self._remove_stale_accounts()
        self.account_files = [FileState(p) for p in ACCOUNT_FILES]
        self.log_digests = {p: _digest(p) for p in LOG_FILES}
        self.polkit_files = [FileState(p) for p in POLKIT_FILES]
        # Their directories get their times back too (best effort: /etc is busy).
        self.dir_times = _dir_times({p.parent for p in (*ACCOUNT_FILES, *POLKIT_FILES)})

        self.dir = Path(tempfile.mkdtemp(prefix=PREFIX, dir="/tmp"))
        self.dir.chmod(0o755)
        self.socket = self.dir / "system_bus_socket"
        self.address = f"unix:path={self.socket}"
        self.venv = self.dir / "venv"
        self.save()
        (self.dir / "call.py").write_text(CALL_PY)
        (self.dir / "call.py").chmod(0o644)
        (self.dir / "config.toml").write_text("# resourced system tests: all defaults\n")
        (self.dir / "config.toml").chmod(0o644)

        # The venv builds in the background while the users, polkit and the bus come up.
        src = self.dir / "src"
        shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(
            ".git", ".venv", "venv", "build", "dist", "*.egg-info", "__pycache__",
            ".pytest_cache", ".hypothesis", "tests", "benchmarks"))
        t_venv = time.monotonic()
        venv_proc = self._start_venv(src)

        t = time.monotonic()
        self._create_accounts()
        TIMINGS["users and groups"] = time.monotonic() - t

        t = time.monotonic()
        self._install_polkit_files()
        self._start_bus()
        TIMINGS["dbus-daemon"] = time.monotonic() - t
        t = time.monotonic()
        self.start_polkitd()
        TIMINGS["polkitd"] = time.monotonic() - t

        for key in (*USERS, "root"):
            self.sleepers[key] = self._start_sleeper(key)

        t = time.monotonic()
        try:
            rc = venv_proc.wait(timeout=600)
        except subprocess.TimeoutExpired:
            rc = "timeout"
        self._stop("venv")
        marks = dict(line.split()[:2] for line in self.log("venv").splitlines()
                     if line.startswith("rdt-time-"))
        if len(marks) == 3:
            start, venv, pip = (float(marks[f"rdt-time-{k}"]) for k in ("start", "venv", "pip"))
            TIMINGS["python3 -m venv"] = venv - start
            TIMINGS["pip install"] = pip - venv
        TIMINGS["venv and pip (in the background)"] = time.monotonic() - t_venv
        TIMINGS["waited for the venv"] = time.monotonic() - t
        if rc != 0:
            raise RuntimeError(f"creating the test venv failed ({rc}):\n"
                               f"{self.logs['venv'].read_text()}")
        shutil.rmtree(src)  # from here on, nothing needs a source tree

        t = time.monotonic()
        self._start_daemon()
        TIMINGS["resourced daemon"] = time.monotonic() - t
        TIMINGS["set-up in all"] = time.monotonic() - t0

    def _remove_stale_accounts(self) -> None:
        """Users and groups of ours left by a run that was killed: remove them first."""
        stale_users = [p for p in pwd.getpwall() if p.pw_name.startswith(PREFIX)
                       or (p.pw_name == SERVICE_ACCOUNT and p.pw_gecos == SERVICE_COMMENT)]
        if stale_users:
            _kill_pids(_pids_of_uids({p.pw_uid for p in stale_users}))
        for p in stale_users:
            print(f"removing {p.pw_name}, left by an earlier run", file=sys.stderr)
            _run("userdel", p.pw_name)
        for g in grp.getgrall():
            if g.gr_name.startswith(PREFIX) or (
                    g.gr_name == SERVICE_ACCOUNT and any(
                        p.pw_name == SERVICE_ACCOUNT for p in stale_users)):
                print(f"removing group {g.gr_name}, left by an earlier run", file=sys.stderr)
                _run("groupdel", g.gr_name)
        ADMIN_RULES_DEST.unlink(missing_ok=True)

    def _start_venv(self, src: Path) -> subprocess.Popen:
        self.logs["venv"] = self.dir / "venv.log"
        env = {k: v for k, v in os.environ.items()
               if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV")}
        env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
        # Debian's python (0755 all the way), its ensurepip; pip's cache is reused;
        # --no-compile: nothing to byte-compile up front (a few hundred ms per run instead).
        script = (
            f"set -e\necho rdt-time-start $(date +%s.%N)\n"
            f"{DEBIAN_PYTHON} -m venv {self.venv}\n"
            f"echo rdt-time-venv $(date +%s.%N)\n"
            f"{self.venv}/bin/python -m pip install -q --no-compile '{src}'\n"
            f"echo rdt-time-pip $(date +%s.%N)\n"
        )
        with open(self.logs["venv"], "w") as log:
            proc = subprocess.Popen(["/bin/sh", "-c", script], env=env, cwd=self.dir,
                                    stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        self.procs["venv"] = proc  # stopped with the rest if set-up goes no further
        self._journal_pid("venv", proc.pid)
        return proc

    def _create_accounts(self) -> None:
        for group in (ACCESS_GROUP, ADMIN_GROUP):
            _run("groupadd", group)
            self.groups_created.append(group)
            self.save()
        for key, (login, groups) in USERS.items():
            # -M: no home; -l: leave lastlog/faillog alone; a user group of the same name.
            argv = ["useradd", "-M", "-l", "-s", "/usr/sbin/nologin", "-c", "resourced test"]
            if groups:
                argv += ["-G", ",".join(groups)]
            _run(*argv, login)
            self.users_created.append(login)
            self.users[key] = pwd.getpwnam(login)
            self.user_uids.add(self.users[key].pw_uid)
            self.save()
        try:
            self.service = pwd.getpwnam(SERVICE_ACCOUNT)
        except KeyError:
            # As gpuctl service enable --system would (resourced/linux/install.py).
            argv = ["useradd", "--system", "-M", "-l", "--home-dir", "/",
                    "--shell", "/usr/sbin/nologin", "--comment", SERVICE_COMMENT]
            try:
                grp.getgrnam(SERVICE_ACCOUNT)
                argv += ["--gid", SERVICE_ACCOUNT]
            except KeyError:
                argv += ["--user-group"]
                self.created_service_group = True
            _run(*argv, SERVICE_ACCOUNT)
            self.created_service_account = True
            self.service = pwd.getpwnam(SERVICE_ACCOUNT)
            self.user_uids.add(self.service.pw_uid)
            self.save()

    def _install_polkit_files(self) -> None:
        POLICY_DEST.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ROOT / "polkit/org.resourced.policy", POLICY_DEST)
        POLICY_DEST.chmod(0o644)
        rules = (ROOT / "polkit/50-resourced.rules").read_text().replace("@GROUP@", ACCESS_GROUP)
        assert "@" not in rules.replace("@GROUP", ""), "50-resourced.rules has another placeholder"
        RULES_DEST.write_text(rules)
        RULES_DEST.chmod(0o644)
        ADMIN_RULES_DEST.write_text(ADMIN_RULES)
        ADMIN_RULES_DEST.chmod(0o644)

    def _bus_config(self) -> str:
        return f"""<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<!-- resourced system tests: a private system bus (tests/system/conftest.py) -->
<busconfig>
  <type>system</type>
  <auth>EXTERNAL</auth>
  <listen>unix:path={self.socket}</listen>
  <!-- the default-deny policy of Debian's system.conf -->
  <policy context="default">
    <allow user="*"/>
{SYSTEM_BUS_DEFAULTS}
    <deny send_destination="org.freedesktop.DBus"
          send_interface="org.freedesktop.systemd1.Activator"/>
  </policy>
  <policy user="root">
    <allow send_destination="org.freedesktop.DBus"
           send_interface="org.freedesktop.DBus.Monitoring"/>
  </policy>
  <!-- polkit's own bus policy (and the machine's other services') -->
  <includedir>/usr/share/dbus-1/system.d</includedir>
  <!-- ours, from the source tree -->
  <include>{ROOT / "dbus/org.resourced.conf"}</include>
</busconfig>
"""

    def _start_bus(self) -> None:
        conf = self.dir / "bus.conf"
        conf.write_text(self._bus_config())
        proc = self._spawn("dbus-daemon", [_tool("dbus-daemon"), f"--config-file={conf}",
                                           "--nofork", "--nopidfile"],
                           env={"PATH": "/usr/bin:/bin"})
        deadline = time.monotonic() + 20
        while not self.socket.exists():
            if proc.poll() is not None:
                raise RuntimeError(f"dbus-daemon exited with {proc.returncode}:\n"
                                   f"{self.log('dbus-daemon')}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"dbus-daemon made no socket:\n{self.log('dbus-daemon')}")
            time.sleep(0.02)
        self.socket.chmod(0o777)  # dbus-daemon makes it so; be sure
        self.wait_for(lambda: self.name_owner("org.freedesktop.DBus") is not None, 20,
                      "the private bus answering")

    def start_polkitd(self) -> None:
        self._spawn("polkitd", [str(POLKITD), "--no-debug"],
                    env={"PATH": "/usr/bin:/bin", "DBUS_SYSTEM_BUS_ADDRESS": self.address})
        self.wait_for(lambda: self.name_owner(POLKIT_NAME) is not None, 30, "polkitd on the bus",
                      proc="polkitd")

    def stop_polkitd(self) -> None:
        self._stop("polkitd")
        self.wait_for(lambda: self.name_owner(POLKIT_NAME) is None, 10, "polkitd gone")

    def _start_sleeper(self, key: str) -> int:
        proc = self._spawn(f"sleeper-{key}", [*self._as_user(key), "/bin/sleep", "infinity"],
                           env={"PATH": "/usr/bin:/bin"})
        expected = 0 if key == "root" else self.users[key].pw_uid
        self.wait_for(lambda: _proc_uid(proc.pid) == expected and _proc_comm(proc.pid) == "sleep",
                      10, f"{key}'s sleeper")
        return proc.pid

    def _start_daemon(self) -> None:
        runtime, state = self.dir / "run", self.dir / "state"
        for directory in (runtime, state):  # as systemd's RuntimeDirectory=, StateDirectory=
            directory.mkdir(mode=0o700)
            os.chown(directory, self.service.pw_uid, self.service.pw_gid)
        env = {
            "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": "/",
            "DBUS_SYSTEM_BUS_ADDRESS": self.address,
            "RESOURCED_SIMULATED_GPUS": str(NGPUS),
            "RESOURCED_RUNTIME_DIR": str(runtime),
            "RESOURCED_STATE_DIR": str(state),
            "RESOURCED_CONFIG": str(self.dir / "config.toml"),
            "PYTHONUNBUFFERED": "1",
        }
        s = self.service
        self._spawn("resourced", [
            _tool("setpriv"), f"--reuid={s.pw_uid}", f"--regid={s.pw_gid}", "--init-groups", "--",
            str(self.venv / "bin/python"), "-m", "resourced.daemon", "--system"], env=env)
        self.wait_for(lambda: self.name_owner(BUS_NAME) is not None, 30, "resourced on the bus",
                      proc="resourced")

    def _spawn(self, name: str, argv: list[str], env: dict):
        log_path = self.dir / f"{name}.log"
        self.logs[name] = log_path
        with open(log_path, "w") as log:
            proc = subprocess.Popen(argv, env=env, cwd=self.dir, stdout=log,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True)
        self.procs[name] = proc
        self._journal_pid(name, proc.pid)
        return proc

    def _journal_pid(self, name: str, pid: int) -> None:
        self.pids[name] = (pid, _start_time(pid))
        self.save()

    def _stop(self, name: str) -> None:
        self.pids.pop(name, None)
        proc = self.procs.pop(name, None)
        if proc is None or proc.poll() is not None:
            return
        # Each runs in a session of its own: signal its whole group (pip under sh, say).
        _signal_group(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            _signal_group(proc.pid, signal.SIGKILL)
            proc.wait(10)

    # -- teardown -----------------------------------------------------------------------
    def teardown(self) -> None:
        """Undo everything, whatever state set-up got to; then check nothing is left."""
        started = dict(self.pids)
        steps = [
            ("stop the processes", self._stop_all),
            ("remove the polkit files", self._restore_polkit_files),
            ("delete the users and groups", self._delete_accounts),
            ("restore the account files", self._restore_account_files),
            ("remove the temporary directory", self._remove_dir),
            ("restore the files' and directories' times", self._restore_times),
        ]
        for what, step in steps:
            try:
                step()
            except Exception as exc:  # noqa: BLE001 - every step runs; all failures reported
                self.cleanup_errors.append(f"{what}: {exc!r}")
        self.cleanup_errors += self.leftovers(started)
        if self.cleanup_errors:
            raise AssertionError("the system tests left things behind:\n  "
                                 + "\n  ".join(self.cleanup_errors))

    def _stop_all(self) -> None:
        # The daemon first (it talks to the bus), the bus last.
        order = sorted(self.procs, key=lambda n: (n == "dbus-daemon", n != "resourced"))
        for name in order:
            self._stop(name)
        # Processes of a killed run (from its journal): only if still the very same ones.
        for name, (pid, start) in list(self.pids.items()):
            if _start_time(pid) == start:
                _signal_group(pid, signal.SIGKILL)
                _kill_pids([pid])
        # Anything else our test users still run (a stray child of a test).
        uids = set(self.user_uids)
        _kill_pids(_pids_of_uids(uids))
        deadline = time.monotonic() + 10
        while _pids_of_uids(uids) and time.monotonic() < deadline:
            time.sleep(0.05)

    def _restore_polkit_files(self) -> None:
        for state in self.polkit_files:
            if not state.same_now():
                state.put_back()

    def _delete_accounts(self) -> None:
        errors = []
        logins = list(reversed(self.users_created))
        if self.created_service_account:
            logins.append(SERVICE_ACCOUNT)
        for login in logins:
            try:
                pwd.getpwnam(login)
            except KeyError:
                continue  # never made, or gone already (a killed run's teardown)
            try:
                _run("userdel", login)
            except Exception as exc:  # noqa: BLE001
                errors.append(str(exc))
        groups = list(self.groups_created)
        if self.created_service_group:
            groups.append(SERVICE_ACCOUNT)
        for group in groups:
            try:
                grp.getgrnam(group)
            except KeyError:
                continue  # userdel removed it (a user group)
            try:
                _run("groupdel", group)
            except Exception as exc:  # noqa: BLE001
                errors.append(str(exc))
        if errors:
            raise RuntimeError("; ".join(errors))

    def _extra_names(self) -> frozenset[str]:
        return frozenset({SERVICE_ACCOUNT}) if self.created_service_account else frozenset()

    def _restore_account_files(self) -> None:
        """Put the twelve files back as they were, unless someone else changed them meanwhile."""
        extra = self._extra_names()
        for state in self.account_files:
            if state.same_now():
                continue
            if not state.path.name.endswith("-"):
                now = state.path.read_bytes() if state.path.exists() else None
                if _without_ours(now, extra) != _without_ours(state.data, extra):
                    self.cleanup_errors.append(
                        f"{state.path} changed during the tests beyond our own entries; "
                        "left as it is")
                    continue
            state.put_back()

    def _restore_times(self) -> None:
        for state in (*self.account_files, *self.polkit_files):
            state.restore_times()
        for path, times in self.dir_times.items():
            os.utime(path, ns=times)

    def _remove_dir(self) -> None:
        if self.dir is not None and self.dir.exists():
            shutil.rmtree(self.dir)

    def leftovers(self, started: dict[str, tuple[int, int]]) -> list[str]:
        """What is still there that should not be (empty when all is clean)."""
        found = []
        found += [f"{a} still exists" for a in our_accounts(self._extra_names())]
        found += [f"{state.path} differs from before the tests" for state in self.account_files
                  if not state.same_now()]
        found += [f"{state.path}: its modification time was not put back"
                  for state in (*self.account_files, *self.polkit_files)
                  if state.data is not None and state.path.exists()
                  and state.path.stat().st_mtime_ns != state.times[1]]
        found += [f"{path} differs from before the tests" for path, digest
                  in self.log_digests.items() if _digest(path) != digest]
        found += [f"{state.path} differs from before the tests" for state in self.polkit_files
                  if not state.same_now()]
        for name, (pid, start) in started.items():
            if _start_time(pid) == start and _proc_state(pid) not in ("Z", None):
                found.append(f"{name} (pid {pid}) still runs")
        found += [f"{p} exists" for p in Path("/var/mail").glob(PREFIX + "*")]
        if self.dir is not None and self.dir.exists():
            found.append(f"{self.dir} still exists")
        return found

    # -- used by the tests --------------------------------------------------------------
    def wait_for(self, predicate, timeout: float, what: str, proc: str | None = None):
        deadline = time.monotonic() + timeout
        while True:
            if proc and self.procs[proc].poll() is not None:
                raise RuntimeError(f"{proc} exited with {self.procs[proc].returncode} while "
                                   f"waiting for {what}:\n{self.log(proc)}")
            try:
                value = predicate()
            except Exception:  # noqa: BLE001 - not ready yet
                value = None
            if value:
                return value
            if time.monotonic() > deadline:
                extra = f":\n{self.log(proc)}" if proc else ""
                raise RuntimeError(f"timed out after {timeout}s waiting for {what}{extra}")
            time.sleep(0.05)

    def log(self, name: str) -> str:
        path = self.logs.get(name)
        return path.read_text(errors="replace") if path and path.exists() else ""

    def root_call(self, dest, path, iface, member, signature=None, body=()):
        """A call as root from this process; returns the reply body or raises RuntimeError."""
        from jeepney import DBusAddress, MessageType, new_method_call
        from jeepney.io.blocking import open_dbus_connection
        from jeepney.low_level import HeaderFields

        with open_dbus_connection(self.address) as conn:
            reply = conn.send_and_get_reply(
                new_method_call(DBusAddress(path, bus_name=dest, interface=iface), member,
                                signature, body), timeout=10)
        if reply.header.message_type is MessageType.error:
            raise RuntimeError(f"{reply.header.fields.get(HeaderFields.error_name)}: {reply.body}")
        return reply.body

    def bus_call(self, member, signature=None, body=()):
        return self.root_call("org.freedesktop.DBus", "/org/freedesktop/DBus",
                              "org.freedesktop.DBus", member, signature, body)

    def name_owner(self, name: str) -> str | None:
        """The unique name owning ``name``, or None."""
        try:
            return self.bus_call("GetNameOwner", "s", (name,))[0]
        except RuntimeError as exc:
            if "NameHasNoOwner" in str(exc):
                return None
            raise

    def _as_user(self, key: str | None) -> list[str]:
        if key in (None, "root"):
            return []
        u = self.users[key]
        return [_tool("setpriv"), f"--reuid={u.pw_uid}", f"--regid={u.pw_gid}", "--init-groups",
                "--"]

    def user_env(self) -> dict[str, str]:
        # No RESOURCED_BUS and no session bus: gpuctl finds the system bus by itself.
        return {"PATH": f"{self.venv}/bin:/usr/bin:/bin", "LANG": "C.UTF-8",
                "HOME": str(self.dir), "DBUS_SYSTEM_BUS_ADDRESS": self.address}

    def run_as(self, key: str | None, argv: list[str], timeout: float = 60,
               env: dict[str, str] | None = None):
        """Run ``argv`` as test user ``key`` (None or "root": as root), with ``env`` added
        to the users' environment; stdin is not a TTY."""
        return subprocess.run([*self._as_user(key), *argv], env={**self.user_env(), **(env or {})},
                              cwd=self.dir, capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL, check=False)

    def gpuctl(self, key: str | None, *args: str, timeout: float = 60,
               env: dict[str, str] | None = None):
        return self.run_as(key, [str(self.venv / "bin/gpuctl"), *map(str, args)], timeout, env)

    def call(self, key: str | None, member: str, signature: str = "", body: tuple = (), *,
             dest: str = BUS_NAME, path: str = MANAGER_PATH, iface: str = MANAGER_IFACE) -> dict:
        """One D-Bus call as user ``key``: {"ok": body} or {"error": name, "message": text}."""
        cp = self.run_as(key, [str(self.venv / "bin/python"), str(self.dir / "call.py"),
                               dest, path, iface, member, signature, repr(body)])
        try:
            result = json.loads(cp.stdout.strip().splitlines()[-1])
        except (IndexError, ValueError):
            raise AssertionError(f"call.py {member} as {key} printed no result "
                                 f"(exit {cp.returncode}):\n{cp.stdout}\n{cp.stderr}") from None
        assert cp.returncode == (1 if "error" in result else 0), cp
        return result

    def uid(self, key: str) -> int:
        return 0 if key == "root" else self.users[key].pw_uid

    def login(self, key: str) -> str:
        return "root" if key == "root" else self.users[key].pw_name


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def _proc_status(pid: int) -> dict[str, str]:
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return {}
    return dict(line.split(":\t", 1) for line in text.splitlines() if ":\t" in line)


def _start_time(pid: int) -> int | None:
    """Field 22 of /proc/<pid>/stat: with the pid, names one process for good."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return int(text.rsplit(")", 1)[1].split()[19])


def _proc_uid(pid: int) -> int | None:
    uid = _proc_status(pid).get("Uid")
    return int(uid.split()[0]) if uid else None


def _proc_comm(pid: int) -> str:
    return _proc_status(pid).get("Name", "")


def _proc_state(pid: int) -> str | None:
    state = _proc_status(pid).get("State")
    return state.split()[0] if state else None


def proc_ids(pid: int) -> tuple[list[int], list[int]]:
    """(real, effective, saved, fs uids), (same for gids) of a process."""
    status = _proc_status(pid)
    return ([int(x) for x in status["Uid"].split()], [int(x) for x in status["Gid"].split()])


def machine_lock(wait: float = LOCK_WAIT) -> socket.socket:
    """Wait until no other run of these tests is going on on this machine, then hold it.

    Two runs at once (two checkouts, two people) would share the users, the polkit files
    and the account files. The lock is an abstract Unix socket: no file to leave behind,
    and the kernel frees it when the holder exits, however it exits.
    """
    lock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    deadline = time.monotonic() + wait
    told = False
    while True:
        try:
            lock.bind(LOCK_NAME)
            return lock
        except OSError:
            if time.monotonic() > deadline:
                lock.close()
                raise RuntimeError(f"another run of tests/system held the machine for {wait:g} s")
            if not told:
                print("waiting for another run of tests/system to finish", file=sys.stderr)
                told = True
            time.sleep(0.05)


# -- fixtures -----------------------------------------------------------------------------
@pytest.fixture(scope="package")
def rig():
    """The whole multi-user set-up, for this directory's tests (torn down once they are
    done, not at the end of the whole suite); skips unless root with the tools (module doc)."""
    reason = missing_prerequisites()
    if reason and REQUIRED:
        pytest.fail(f"{reason}; RESOURCED_TESTS_REQUIRE_SYSTEM=1 says they must run")
    if reason:
        pytest.skip(reason)
    t = time.monotonic()
    lock = machine_lock()
    TIMINGS["waited for another run"] = time.monotonic() - t
    # SIGTERM (timeout(1), CI) would end pytest without a teardown: make it an interrupt,
    # which pytest turns into an orderly stop. SIGKILL is undone by the next run.
    previous = signal.getsignal(signal.SIGTERM)
    if previous == signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _interrupt)
    r = Rig()
    try:
        r.setup()
        yield r
    finally:
        try:
            r.teardown()
        finally:
            lock.close()
            if previous == signal.SIG_DFL:
                signal.signal(signal.SIGTERM, previous)


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def ok(cp) -> str:
    """The stdout of a command that must have succeeded."""
    assert cp.returncode == 0, f"exit {cp.returncode}\nstdout: {cp.stdout}\nstderr: {cp.stderr}"
    return cp.stdout


def refused(cp, code: int) -> None:
    """A gpuctl refusal: exit ``code``, a one-line message, no traceback."""
    assert cp.returncode == code, f"exit {cp.returncode}, wanted {code}\n{cp.stdout}\n{cp.stderr}"
    assert cp.stderr.startswith("gpuctl: ") and "Traceback" not in cp.stderr, cp.stderr


@pytest.fixture
def clean_claims(rig):
    """Each test starts with every GPU free, and leaves none claimed (root releases all)."""
    def release_all():
        describe = json.loads(rig.root_call(BUS_NAME, MANAGER_PATH, MANAGER_IFACE, "Describe")[0])
        for claim in describe["claims"]:
            try:
                rig.root_call(BUS_NAME, MANAGER_PATH, MANAGER_IFACE, "Release", "st",
                              (claim["id"], 1))
            except RuntimeError as exc:  # ended meanwhile (a Slurm job's, at its epilog)
                if "org.resourced.Error.NoSuchClaim" not in str(exc):
                    raise
        return describe

    release_all()
    yield
    release_all()


def pytest_terminal_summary(terminalreporter):
    if TIMINGS:
        parts = ", ".join(f"{k} {v:.1f} s" for k, v in TIMINGS.items())
        terminalreporter.write_line(f"tests/system set-up: {parts}")
