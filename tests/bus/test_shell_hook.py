"""The shell hook end to end: a real interactive bash (and zsh, where installed) on a pty,
after ``eval "$(gpuctl shell init bash)"``, against a daemon on the simulated clock.

The shell is driven as a person would: a line is typed, and what the shell prints is read
back.  Each value is printed as ``V<n>=[value]`` by a ``printf`` whose format holds ``%s``,
so the echo of the typed line never matches; every wait is bounded.
"""

import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from resourced.cli.shell import (
    MANAGED,
    choose,
    foreign_claim,
    read_state,
    shell_lines,
    transition,
    valid_until,
)
from resourced.client.sync import Client
from resourced.linux.shell_stamp import stamp_path, touch_stamp

from ..conftest import eventually, gpuctl

UNSET = "<unset>"
INIT = f"{sys.executable} -m resourced.cli shell init"
SHELLS = {
    "bash": ["bash", "--norc", "--noprofile", "--noediting", "-i"],
    "zsh": ["zsh", "-f", "-i", "+Z"],  # no rc files, no line editor
}


class Shell:
    """An interactive shell on a pty that this test types into."""

    def __init__(self, kind: str, env: dict, cwd: Path):
        import termios

        master, slave = os.openpty()
        attrs = termios.tcgetattr(slave)
        attrs[3] &= ~termios.ECHO  # the typed lines are not echoed back
        termios.tcsetattr(slave, termios.TCSANOW, attrs)
        # A session of its own with the pty as its controlling terminal, as in a terminal
        # emulator (util-linux setsid; without it the shell only warns: no job control).
        argv = (["setsid", "--ctty"] if shutil.which("setsid") else []) + SHELLS[kind]
        self.kind = kind
        self.proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=env,
                                     cwd=cwd, start_new_session=argv[0] != "setsid")
        os.close(slave)
        self.fd = master
        self.out = ""
        self.pos = 0
        self.n = 0

    def type(self, line: str) -> None:
        os.write(self.fd, (line + "\n").encode())

    def expect(self, pattern: str, timeout: float = 20.0) -> re.Match:
        deadline = time.monotonic() + timeout
        regex = re.compile(pattern)
        while True:
            found = regex.search(self.out, self.pos)
            if found:
                self.pos = found.end()
                return found
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"{self.kind}: no {pattern!r} within {timeout}s; "
                                     f"it printed:\n{self.out[self.pos:]}")
            ready, _, _ = select.select([self.fd], [], [], min(left, 0.5))
            if ready:
                try:
                    chunk = os.read(self.fd, 65536)
                except OSError:  # the shell is gone
                    chunk = b""
                if not chunk and self.proc.poll() is not None:
                    raise AssertionError(f"{self.kind} exited ({self.proc.returncode}):\n"
                                         f"{self.out[self.pos:]}")
                self.out += chunk.decode(errors="replace")

    def run(self, command: str, timeout: float = 20.0) -> tuple[int, str]:
        """Type ``command``; its exit status and what it printed."""
        self.n += 1
        start = f"S{self.n}"
        self.type(f"printf '%s\\n' {start}:; {command}; printf 'R{self.n}=[%s]\\n' $?")
        begin = self.expect(rf"{start}:\r?\n", timeout).end()
        done = self.expect(rf"R{self.n}=\[(\d+)\]", timeout)
        return int(done[1]), self.out[begin:done.start()]

    def value(self, name: str) -> str | None:
        """The variable as the next command typed at the prompt sees it (the prompt hook
        runs before): one prompt passes first."""
        self.type(":")
        self.n += 1
        self.type(f"printf 'V{self.n}=[%s]\\n' \"${{{name}-{UNSET}}}\"")
        got = self.expect(rf"V{self.n}=\[([^\]]*)\]")[1]
        return None if got == UNSET else got

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.type("exit")
                self.proc.wait(5)
            except (OSError, subprocess.TimeoutExpired):
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        os.close(self.fd)


@pytest.fixture
def user_dirs(tmp_path, monkeypatch) -> Path:
    """A private XDG_RUNTIME_DIR (where the stamp lives) and HOME, for gpuctl and shells."""
    runtime = tmp_path / "xdg"
    runtime.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    monkeypatch.setenv("HOME", str(tmp_path))
    return runtime


@pytest.fixture(params=["bash", "zsh"])
def hooked(request, user_dirs, tmp_path):
    """Start an interactive shell of the param's kind with the hook: ``hooked(**env)``."""
    kind = request.param
    if not shutil.which(kind):
        pytest.skip(f"{kind} is not installed")
    shells: list[Shell] = []

    def start(before: str = "", **env) -> Shell:
        sh = Shell(kind, {**os.environ, "TERM": "dumb", "PS1": "$ ", "PROMPT": "$ ", **env},
                   tmp_path)
        shells.append(sh)
        if before:
            assert sh.run(before)[0] == 0
        code, said = sh.run(f'eval "$({INIT} {kind})"')
        assert (code, said) == (0, "")
        return sh

    yield start
    for sh in shells:
        sh.close()


def claim(*amounts) -> str:
    """A development claim of this test's (one GPU unless ``amounts`` say otherwise)."""
    r = gpuctl("claim", *(amounts or ("--gpus", "1")), "--owner-pid", str(os.getpid()))
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def active_modes() -> list[str]:
    with Client(timeout=5) as c:
        return [x["mode"] for x in c.status()["claims"] if x["state"] == "granted"]


def uuids_of(ref: str) -> str:
    r = gpuctl("env", "--allocation", ref, "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["CUDA_VISIBLE_DEVICES"]


# -- in a real shell -----------------------------------------------------------------------
def test_a_booking_shows_only_from_its_start_to_its_end(clocked_daemon, clock, hooked):
    clocked_daemon()
    r = gpuctl("book", "--gpus", "2", "--for", "1h", "--at", "2026-12-01T10:00:00Z")
    assert r.returncode == 0, r.stderr
    sh = hooked()
    assert sh.value("CUDA_VISIBLE_DEVICES") is None  # booked for later: nothing yet
    assert sh.value("_GPUCTL_REF") == ""

    clock.set("2026-12-01T10:00:00Z")
    eventually(lambda: active_modes() == ["booking"], 10)
    assert sh.run("gpuctl_refresh") == (0, "")
    visible = sh.value("CUDA_VISIBLE_DEVICES")
    assert visible and len(visible.split(",")) == 2
    ref = sh.value("RESOURCED_ALLOCATION")
    assert sh.value("_GPUCTL_REF") == ref and uuids_of(ref) == visible
    assert sh.value("CUDA_DEVICE_ORDER") == "PCI_BUS_ID"
    assert sh.value("RESOURCED_GPU_UUIDS") == visible

    clock.set("2026-12-01T11:00:00Z")
    eventually(lambda: active_modes() == [], 10)
    assert sh.run("gpuctl_refresh") == (0, "")
    for name in ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "RESOURCED_ALLOCATION",
                 "RESOURCED_GPU_UUIDS", "_GPUCTL_STATE"):
        assert sh.value(name) is None, name


def test_the_prompt_alone_follows_the_booking_when_the_recheck_is_short(
        clocked_daemon, clock, hooked):
    clocked_daemon()
    r = gpuctl("book", "--gpus", "1", "--for", "1h", "--at", "2026-12-01T10:00:00Z")
    assert r.returncode == 0, r.stderr
    sh = hooked(RESOURCED_SHELL_RECHECK="1")
    assert sh.value("CUDA_VISIBLE_DEVICES") is None
    clock.set("2026-12-01T10:00:00Z")
    eventually(lambda: sh.value("CUDA_VISIBLE_DEVICES"), 15, 0.3)
    clock.set("2026-12-01T11:00:00Z")
    eventually(lambda: sh.value("CUDA_VISIBLE_DEVICES") is None, 15, 0.3)


def test_a_claim_from_another_terminal_shows_at_the_next_prompt(daemon, hooked):
    sh = hooked()
    assert sh.value("CUDA_VISIBLE_DEVICES") is None
    ref = claim()  # gpuctl, elsewhere: it rewrites the stamp
    assert sh.value("CUDA_VISIBLE_DEVICES") == uuids_of(ref)  # long before the 60 s recheck
    assert sh.value("RESOURCED_ALLOCATION") == ref
    r = gpuctl("release", "--allocation", ref)
    assert r.returncode == 0, r.stderr
    assert sh.value("CUDA_VISIBLE_DEVICES") is None
    assert sh.value("RESOURCED_ALLOCATION") is None


def test_the_users_own_values_come_back_when_the_claim_goes(daemon, hooked):
    sh = hooked("export CUDA_VISIBLE_DEVICES=7 OMP_NUM_THREADS=3")
    assert sh.value("CUDA_VISIBLE_DEVICES") == "7"
    ref = claim("--gpus", "1", "--cpu", "2")
    assert sh.value("CUDA_VISIBLE_DEVICES") == uuids_of(ref)
    assert sh.value("OMP_NUM_THREADS") == "2"
    code, said = sh.run("env | grep '^CUDA_VISIBLE_DEVICES='")  # exported to programs
    assert code == 0 and uuids_of(ref) in said
    assert gpuctl("release", "--allocation", ref).returncode == 0
    assert sh.value("CUDA_VISIBLE_DEVICES") == "7"
    assert sh.value("OMP_NUM_THREADS") == "3"
    assert sh.value("RESOURCED_POOLS") is None


def test_an_existing_prompt_command_still_runs_and_sees_the_exit_status(daemon, hooked):
    sh = hooked("PROMPT_COMMAND='echo pc=$?'; precmd() { echo pc=$?; }")
    if sh.kind == "bash":
        code, _ = sh.run("eval \"$(" + INIT + " bash)\"")  # evaluated twice: hooked once
        assert code == 0
        assert sh.run('printf "%s" "$PROMPT_COMMAND" | grep -c _gpuctl_prompt')[1].split() \
            == ["1"]
    sh.type("false")
    sh.expect(r"pc=1\r?\n")
    sh.type("true")
    sh.expect(r"pc=0\r?\n")


def test_without_a_daemon_the_prompt_stays_quiet_and_refresh_says_why(
        private_bus, monkeypatch, hooked):
    monkeypatch.setenv("DBUS_SESSION_BUS_ADDRESS", private_bus.address)
    monkeypatch.setenv("RESOURCED_BUS", "session")
    sh = hooked()
    code, said = sh.run(":")
    assert (code, said.strip()) == (0, "")
    code, said = sh.run("gpuctl_refresh")
    assert code == 5 and "not running" in said
    assert sh.value("CUDA_VISIBLE_DEVICES") is None


def test_a_prompt_with_nothing_changed_starts_no_process(daemon, hooked):
    sh = hooked()
    claim()
    assert sh.value("CUDA_VISIBLE_DEVICES")
    # A process start costs milliseconds (gpuctl: tens): 300 prompts in well under a second.
    code, said = sh.run("_gpuctl_s=$EPOCHREALTIME; for i in {1..300}; do _gpuctl_prompt; "
                        "done; echo $(( ${EPOCHREALTIME/./} - ${_gpuctl_s/./} ))"
                        if sh.kind == "bash" else
                        "zmodload zsh/datetime; _gpuctl_s=$EPOCHREALTIME; "
                        "for i in {1..300}; do _gpuctl_prompt; done; "
                        "printf '%d\\n' $(( (EPOCHREALTIME - _gpuctl_s) * 1000000 ))")
    assert code == 0
    assert int(said.split()[-1]) < 1_000_000, said


def test_a_shell_put_on_a_claim_by_gpuctl_env_is_left_alone(daemon, hooked):
    mine = claim()
    other = claim()  # the newest: the hook would choose it
    sh = hooked(f'eval "$({sys.executable} -m resourced.cli env --allocation {mine})"')
    assert sh.value("RESOURCED_ALLOCATION") == mine
    assert sh.value("CUDA_VISIBLE_DEVICES") == uuids_of(mine)
    code, said = sh.run("gpuctl_refresh")
    assert code == 0 and f"on claim {mine}" in said
    assert sh.value("CUDA_VISIBLE_DEVICES") == uuids_of(mine) != uuids_of(other)
    assert sh.value("RESOURCED_ALLOCATION") == mine


# -- the stamp -----------------------------------------------------------------------------
def test_the_stamp_is_per_user_and_new_at_each_change(tmp_path):
    env = {"XDG_RUNTIME_DIR": str(tmp_path)}
    assert stamp_path(env) == tmp_path / "resourced-shell.stamp"
    assert touch_stamp(env)
    first = stamp_path(env).read_text()
    assert touch_stamp(env) and stamp_path(env).read_text() != first
    assert first.endswith("\n") and os.listdir(tmp_path) == ["resourced-shell.stamp"]
    home = {"HOME": str(tmp_path / "home"), "XDG_RUNTIME_DIR": str(tmp_path / "missing")}
    fallback = tmp_path / "cache"
    assert stamp_path({**home, "XDG_CACHE_HOME": str(fallback)}) == \
        fallback / "resourced" / "shell.stamp"
    assert touch_stamp({**home, "XDG_CACHE_HOME": str(fallback)})
    assert (fallback / "resourced").stat().st_mode & 0o777 == 0o700
    assert not touch_stamp({"XDG_RUNTIME_DIR": "/proc"})  # cannot: says so, raises nothing


def test_changes_made_with_gpuctl_rewrite_the_stamp_and_reads_do_not(daemon, user_dirs):
    stamp = user_dirs / "resourced-shell.stamp"
    assert gpuctl("status").returncode == 0 and not stamp.exists()
    ref = claim()
    first = stamp.read_text()
    assert gpuctl("env", "--allocation", ref).returncode == 0
    assert stamp.read_text() == first
    assert gpuctl("release", "--allocation", ref).returncode == 0
    assert stamp.read_text() != first
    second = stamp.read_text()
    assert gpuctl("release", "--allocation", ref).returncode == 6  # failed: no change
    assert stamp.read_text() == second


def test_fish_is_refused_and_says_so():
    r = gpuctl("shell", "init", "fish")
    assert r.returncode == 2 and "bash and zsh" in r.stderr


# -- the decisions, without a daemon --------------------------------------------------------
def record(id_, mode="dev", created=1, uid=1000, alive=True, until=0, state="granted"):
    return {"id": id_, "mode": mode, "created_usec": created, "uid": uid, "owner_alive": alive,
            "until_usec": until, "state": state}


def test_the_active_booking_wins_then_the_newest_live_claim():
    claims = [record("a", created=5), record("b", created=9, alive=False),
              record("r", mode="run", created=20), record("q", created=30, state="queued"),
              record("x", created=40, uid=1001)]
    assert choose(claims, 1000)["id"] == "a"
    assert choose([*claims, record("c", created=7)], 1000)["id"] == "c"
    assert choose([record("b", alive=False)], 1000)["id"] == "b"
    both = [*claims, record("k1", mode="booking", created=2), record("k2", mode="booking",
                                                                    created=3)]
    assert choose(both, 1000)["id"] == "k2"
    assert choose(claims, 1002) is None


def test_validity_is_the_earliest_change_on_the_daemons_clock_capped():
    now, wall = 10_000_000_000, 1_000.4
    assert valid_until(None, None, now, wall, 60) == 1_060
    assert valid_until(None, now + 30_000_000, now, wall, 60) == 1_030
    assert valid_until(record("a", until=now + 2_500_000), None, now, wall, 60) == 1_003
    assert valid_until(record("a", until=now - 5), now + 9, now, wall, 60) == 1_001
    assert valid_until(record("a", until=0), now + 600_000_000, now, wall, 60) == 1_060


def test_taking_back_restores_what_was_there_and_unsets_the_rest():
    wanted = {"CUDA_VISIBLE_DEVICES": "GPU-1", "RESOURCED_ALLOCATION": "c1"}
    user = {"CUDA_VISIBLE_DEVICES": "7", "PATH": "/bin"}
    export, unset, state = transition(user, read_state({}), wanted)
    assert export == wanted and unset == [] and state["old"] == {"CUDA_VISIBLE_DEVICES": "7"}
    hooked = {**user, **wanted, "_GPUCTL_STATE": json.dumps(state)}
    export, unset, after = transition(hooked, read_state(hooked), {})
    assert export == {"CUDA_VISIBLE_DEVICES": "7"} and unset == ["RESOURCED_ALLOCATION"]
    assert after == {"set": {}, "old": {}}
    # Changed by hand meanwhile: the user's value stays when the hook lets go.
    changed = {**hooked, "CUDA_VISIBLE_DEVICES": "5"}
    export, unset, _ = transition(changed, read_state(changed), {})
    assert export == {} and unset == ["RESOURCED_ALLOCATION"]
    lines = shell_lines(hooked, read_state(hooked), {}, "", 99)
    assert lines == ["export CUDA_VISIBLE_DEVICES=7", "unset RESOURCED_ALLOCATION",
                     "unset _GPUCTL_STATE", "_GPUCTL_REF=''", "_GPUCTL_VALID_UNTIL=99"]
    assert set(wanted) <= set(MANAGED)


def test_a_claim_set_by_other_means_is_foreign_unless_it_is_the_one_chosen():
    empty = read_state({})
    assert foreign_claim({"RESOURCED_ALLOCATION": "c9"}, empty, "c1") == "c9"
    assert foreign_claim({"RESOURCED_ALLOCATION": "c1"}, empty, "c1") is None
    assert foreign_claim({}, empty, "c1") is None
    state = {"set": {"RESOURCED_ALLOCATION": "c9"}, "old": {}}
    assert foreign_claim({"RESOURCED_ALLOCATION": "c9"}, state, None) is None
    assert read_state({"_GPUCTL_STATE": "not json"}) == empty
