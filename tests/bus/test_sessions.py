"""Agent sessions end to end: ``--session`` and ``$RESOURCED_SESSION``, the default Unix
session, ``gpuctl sessions``, the stop switch (``gpuctl stop``) and dry runs, against a real
private daemon with gpuctl as a process.

The tests run as root, who is exempt from the limits: those are tested in the engine
(tests/unit/test_session_limits.py).
"""

import contextlib
import json
import os
import subprocess
import sys
import time

import pytest
from jeepney import MatchRule
from jeepney.bus_messages import message_bus
from jeepney.io.blocking import open_dbus_connection
from jeepney.low_level import HeaderFields

from resourced.client.sync import Client
from resourced.errors import NoSuchClaim

from ..conftest import eventually, gpuctl
from .forgery import connections_of, forge

MANAGER_IFACE, CLAIM_IFACE = "org.resourced.Manager", "org.resourced.Claim"


def ok(*args: str, env=None) -> str:
    """gpuctl succeeds; its stdout."""
    r = gpuctl(*args, env=env)
    assert r.returncode == 0, (args, r.stdout, r.stderr)
    return r.stdout


def ok_json(*args: str, env=None):
    return json.loads(ok(*args, "--json", env=env))


def claim(owner_pid: int, *options: str, env=None) -> str:
    """``gpuctl claim``, which must succeed; the reference."""
    return ok("claim", "--owner-pid", str(owner_pid), *options, env=env).strip()


def book(*options: str, env=None) -> str:
    """A booking an hour from now (real clock), which must succeed; the reference.  (A
    claim without an end holds its GPUs forever as far as the calendar knows: claims in
    tests with bookings end in 30 minutes, ``--for 30m``.)"""
    return ok("book", "--for", "1h", "--at", "+1h", *options, env=env).strip()


def status() -> dict:
    with Client() as c:
        return c.status()


def claims() -> dict:
    """The daemon's claim records by id."""
    return {c["id"]: c for c in status()["claims"]}


def bookings() -> dict:
    """My booking records by id, as ``gpuctl bookings --json`` lists them."""
    return {b["id"]: b for b in ok_json("bookings")}


def free() -> int:
    return int(ok("free"))


def one_gpuctl_line(stderr: str) -> str:
    lines = stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpuctl: "), stderr
    return lines[0]


class Signals:
    """Records the daemon's ClaimRemoved and claims' StopRequested signals from the moment
    it is created (a connection of its own to the private bus)."""

    def __init__(self):
        self.conn = open_dbus_connection("SESSION")
        self.rules = [MatchRule(type="signal", interface=MANAGER_IFACE, member="ClaimRemoved"),
                      MatchRule(type="signal", interface=CLAIM_IFACE, member="StopRequested")]
        for rule in self.rules:
            self.conn.send_and_get_reply(message_bus.AddMatch(rule), timeout=5)
        self._filter = self.conn.filter(MatchRule(type="signal"), bufsize=256)
        self.queue = self._filter.__enter__()
        self.seen: list[tuple] = []  # (member, path, body), in order

    def wait_for(self, predicate, timeout: float = 5.0) -> list[tuple]:
        """Receive until ``predicate(self.seen)``; what was seen."""
        deadline = time.monotonic() + timeout
        while not predicate(self.seen):
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"signals not seen within {timeout}s: {self.seen}")
            try:
                msg = self.conn.recv_until_filtered(self.queue, timeout=left)
            except TimeoutError:
                continue
            if any(rule.matches(msg) for rule in self.rules):
                fields = msg.header.fields
                self.seen.append((fields[HeaderFields.member], fields[HeaderFields.path],
                                  msg.body))
        return self.seen

    def removed(self) -> dict:
        """claim id -> the reason of its ClaimRemoved."""
        return {body[0]: body[2] for member, _, body in self.seen if member == "ClaimRemoved"}

    def close(self) -> None:
        self._filter.__exit__(None, None, None)
        self.conn.close()


def signals_until_a_sentinel(signals: Signals, owner) -> list[tuple]:
    """The signals seen before a claim made and released now is removed: the daemon sends
    its signals in order, so anything due earlier came before that one."""
    sentinel = claim(owner.pid, "--gpus", "1")
    ok("release", "--allocation", sentinel)
    seen = signals.wait_for(lambda seen: sentinel in signals.removed())
    return [s for s in seen if s[0] != "ClaimRemoved" or s[2][0] != sentinel]


@pytest.fixture
def signals(daemon):
    listener = Signals()
    yield listener
    listener.close()


# == naming a session =======================================================================


def test_session_by_option_or_environment_shows_in_status_and_sessions(daemon, owner):
    a1 = claim(owner.pid, "--gpus", "1", "--session", "alpha")
    a2 = claim(owner.pid, "--gpus", "1", env={"RESOURCED_SESSION": "alpha"})
    b1 = claim(owner.pid, "--gpus", "1", env={"RESOURCED_SESSION": "beta"})
    g1 = claim(owner.pid, "--vram", "1G", "--session", "gamma",  # the option wins
               env={"RESOURCED_SESSION": "beta"})

    records = ok_json("status")["claims"]
    assert {c["id"]: c["session"] for c in records} == {
        a1: "alpha", a2: "alpha", b1: "beta", g1: "gamma"}
    seen = ok_json("sessions")
    assert [(s["session"], sorted(s["claims"]), s["waiting"], s["bookings"], s["uid"])
            for s in seen] == [
        ("alpha", sorted([a1, a2]), 0, [], os.getuid()),
        ("beta", [b1], 0, [], os.getuid()),
        ("gamma", [g1], 0, [], os.getuid())]
    gpus = {c["id"]: c["gpus"] for c in records}
    assert sorted(seen[0]["gpus"]) == sorted(gpus[a1] + gpus[a2])
    assert seen[2]["gpus"] == gpus[g1] and len(gpus[g1]) == 1  # a share: its one GPU
    assert {s["user"] for s in seen} == {records[0]["user"]}


def test_the_grant_carries_the_session(daemon, owner):
    result = ok_json("claim", "--owner-pid", str(owner.pid), "--gpus", "1",
                     "--session", "agent-7")
    assert (result["schema"], result["allocation"]["session"]) == (2, "agent-7")
    with Client() as c:
        granted = c.claim(mode="dev", gpus=1, owner_pid=owner.pid, session="agent-8")
        assert granted["allocation"]["session"] == "agent-8"
        assert c.allocation(granted["allocation"]["ref"])["allocation"]["session"] == "agent-8"


def test_the_default_session_is_the_owners_unix_session(daemon):
    alone = subprocess.Popen(["sleep", "60"], start_new_session=True)  # a session of its own
    try:
        mine = claim(os.getpid(), "--gpus", "1")
        theirs = claim(alone.pid, "--gpus", "1")
        records = claims()
        assert records[mine]["session"] == f"sid:{os.getsid(0)}"
        assert records[theirs]["session"] == f"sid:{os.getsid(alone.pid)}" == f"sid:{alone.pid}"
        assert {s["session"] for s in ok_json("sessions")} == {
            f"sid:{os.getsid(0)}", f"sid:{alone.pid}"}
    finally:
        alone.kill()
        alone.wait(timeout=10)


def test_an_empty_environment_variable_names_no_session(daemon, owner):
    ref = claim(owner.pid, "--gpus", "1", env={"RESOURCED_SESSION": ""})
    assert claims()[ref]["session"] == f"sid:{os.getsid(owner.pid)}"


@pytest.mark.parametrize("how", ["option", "environment"])
def test_run_exports_its_claims_session_to_the_command(daemon, how):
    given = (["--session", "alpha"], None) if how == "option" else \
        ([], {"RESOURCED_SESSION": "alpha"})
    out = ok("run", *given[0], "--", "sh", "-c", 'echo "$RESOURCED_SESSION"', env=given[1])
    assert out == "alpha\n"


def test_run_exports_the_default_session_too(daemon):
    # the command owns the claim; it runs in gpuctl's Unix session, which is ours
    out = ok("run", "--", "sh", "-c", 'echo "$RESOURCED_SESSION"')
    assert out == f"sid:{os.getsid(0)}\n"


def test_a_sub_process_of_a_run_claims_in_the_same_session(daemon, owner):
    # what an agent's sub-agent does: gpuctl inside gpuctl run, inheriting the session
    inner = (f"{sys.executable} -m resourced.cli claim --gpus 1 --owner-pid {owner.pid}")
    ref = ok("run", "--session", "parent", "--", "sh", "-c", inner).strip()
    assert claims()[ref]["session"] == "parent"


def test_a_64_character_session_is_accepted(daemon, owner):
    name = "s" * 64
    ref = claim(owner.pid, "--gpus", "1", "--session", name)
    assert claims()[ref]["session"] == name


@pytest.mark.parametrize("name", ["two words", "x" * 65, "", "a/b", "a:b", "sid:x"],
                         ids=["space", "65-chars", "empty", "slash", "colon", "sid-not-a-number"])
@pytest.mark.parametrize("command", ["claim", "run", "book", "stop"])
def test_an_invalid_session_name_exits_2_and_changes_nothing(daemon, owner, tmp_path, name,
                                                             command):
    marker = tmp_path / "ran"
    args = {"claim": ["claim", "--owner-pid", str(owner.pid), "--gpus", "1"],
            "run": ["run", "--gpus", "1"],
            "book": ["book", "--gpus", "1", "--for", "1h", "--at", "+1h"],
            "stop": ["stop"]}[command]
    tail = ["--", "touch", str(marker)] if command == "run" else []

    r = gpuctl(*args, "--session", name, *tail)

    assert (r.returncode, r.stdout) == (2, ""), r.stderr
    assert "session" in one_gpuctl_line(r.stderr)
    assert not marker.exists()
    assert status()["claims"] == [] and bookings() == {}


def test_an_invalid_session_in_the_environment_exits_2(daemon, owner):
    r = gpuctl("claim", "--owner-pid", str(owner.pid), "--gpus", "1",
               env={"RESOURCED_SESSION": "no spaces please"})
    assert r.returncode == 2
    assert "session" in one_gpuctl_line(r.stderr)
    assert status()["claims"] == []


# == bookings ===============================================================================


def test_bookings_carry_their_session(daemon):
    named = book("--gpus", "1", "--session", "planner")
    from_env = book("--gpus", "1", env={"RESOURCED_SESSION": "planner"})
    default = book("--gpus", "1")

    records = bookings()
    assert {k: b["session"] for k, b in records.items()} == {
        named: "planner", from_env: "planner", default: f"sid:{os.getsid(0)}"}
    assert ok_json("book", "--gpus", "1", "--for", "1h", "--at", "+1h", "--session", "x",
                   "--dry-run")["booking"]["session"] == "x"
    seen = {s["session"]: s for s in ok_json("sessions")}
    assert sorted(seen["planner"]["bookings"]) == sorted([named, from_env])
    assert seen["planner"]["claims"] == [] and seen["planner"]["gpus"] == []
    assert seen[f"sid:{os.getsid(0)}"]["bookings"] == [default]
    assert set(bookings()) == set(records)  # the dry run booked nothing


# == the stop switch ========================================================================


def test_stop_ends_every_claim_and_booking_of_the_session_and_nothing_else(daemon, owner,
                                                                          signals):
    a1 = claim(owner.pid, "--gpus", "1", "--session", "A", "--for", "30m")
    a2 = claim(owner.pid, "--vram", "1G", "--session", "A", "--for", "30m")
    b1 = claim(owner.pid, "--gpus", "1", "--session", "B", "--for", "30m")
    booked_a = book("--gpus", "1", "--session", "A")
    booked_b = book("--gpus", "1", "--session", "B")

    stopped = ok_json("stop", "--session", "A", "--reason", "over budget")

    assert stopped["dry_run"] is False
    assert sorted(stopped["claims"]) == sorted([a1, a2])
    assert stopped["bookings"] == [booked_a]
    assert set(claims()) == {b1}
    after = bookings()
    assert (after[booked_a]["state"], after[booked_a]["ended"]) == ("ended", "cancelled")
    assert after[booked_a]["reason"] == "over budget"
    assert after[booked_b]["state"] == "scheduled"
    seen = signals.wait_for(lambda seen: {a1, a2} <= set(signals.removed()))
    assert {k: v for k, v in signals.removed().items() if k in (a1, a2)} == {
        a1: "stopped", a2: "stopped"}
    told = [(path.rsplit("/", 1)[-1], body) for member, path, body in seen
            if member == "StopRequested"]
    assert sorted(told) == sorted([(a1, (0, "over budget")), (a2, (0, "over budget"))])
    for ref in (a1, a2):  # each was told before it was removed
        order = [member for member, path, body in seen
                 if path.endswith("/" + ref) or (member == "ClaimRemoved" and body[0] == ref)]
        assert order == ["StopRequested", "ClaimRemoved"], (ref, seen)
    assert [s["session"] for s in ok_json("sessions")] == ["B"]


def test_stop_in_text_names_what_it_stopped(daemon, owner):
    a1 = claim(owner.pid, "--gpus", "1", "--session", "A", "--for", "30m")
    booked = book("--gpus", "1", "--session", "A")

    r = gpuctl("stop", "--session", "A")

    assert (r.returncode, r.stdout) == (0, "")
    line = one_gpuctl_line(r.stderr)
    assert "session A" in line and "stopped" in line
    assert f"1 claim(s): {a1}" in line and f"1 booking(s): {booked}" in line
    assert claims() == {}


def test_stop_also_ends_a_waiting_claim_of_the_session(daemon, owner, signals):
    holder = claim(owner.pid, "--gpus", "4", "--session", "B")
    waiter = subprocess.Popen(
        [sys.executable, "-m", "resourced.cli", "claim", "--owner-pid", str(owner.pid),
         "--gpus", "1", "--wait", "--quiet", "--session", "A"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        queued = eventually(lambda: [c["id"] for c in status()["claims"]
                                     if c["session"] == "A" and c["state"] == "queued"])
        assert ok_json("sessions")[0]["waiting"] == 1

        stopped = ok_json("stop", "--session", "A")

        assert stopped["claims"] == queued
        assert set(claims()) == {holder}
        signals.wait_for(lambda seen: queued[0] in signals.removed())
        assert signals.removed()[queued[0]] == "stopped"
        assert not any(member == "StopRequested" for member, _, _ in signals.seen)
        out, err = waiter.communicate(timeout=10)
        assert (waiter.returncode, out) == (6, "")  # it left the queue ungranted, and says why
        assert "stopped" in one_gpuctl_line(err)
    finally:
        if waiter.poll() is None:
            waiter.kill()
            waiter.wait(timeout=10)


@contextlib.contextmanager
def trapping_run(tmp_path, *gpuctl_args: str, signame: str = "USR1"):
    """``gpuctl run ARGS -- sh`` whose command writes DIR/got and exits 0 on ``signame``
    (DIR/ready once its trap is set); it ends by itself, exit 1, when DIR/stop appears
    (afterwards) or after 20 s.  Yields the gpuctl process, once its command is ready."""
    got, ready, stop = tmp_path / "got", tmp_path / "ready", tmp_path / "stop"
    script = (f'trap "echo got >{got}; exit 0" {signame}; echo >{ready}; i=0; '
              f"while [ $i -lt 400 ] && [ ! -e {stop} ]; do sleep 0.05; i=$((i+1)); done; exit 1")
    proc = subprocess.Popen([sys.executable, "-m", "resourced.cli", "run", *gpuctl_args, "--",
                             "sh", "-c", script],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        eventually(ready.exists, timeout=10)
        yield proc
    finally:
        stop.touch()
        try:
            proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate(timeout=10)


@pytest.mark.parametrize("reclaim_signal", [None, "USR2"])
def test_a_run_in_the_stopped_session_gets_the_reclaim_signal_and_ends(daemon, tmp_path,
                                                                      reclaim_signal):
    options = ["--reclaim-signal", reclaim_signal] if reclaim_signal else []
    with trapping_run(tmp_path, "--session", "A", *options,
                      signame=reclaim_signal or "USR1") as run:
        [record] = status()["claims"]
        assert (record["session"], record["mode"]) == ("A", "run")

        stopped = ok_json("stop", "--session", "A")
        started = time.monotonic()

        assert stopped["claims"] == [record["id"]]
        _, err = run.communicate(timeout=8)  # well before SIGTERM (10 s after the signal)
        assert time.monotonic() - started < 8
        assert (tmp_path / "got").read_text() == "got\n"
        assert run.returncode == 0, err  # the command's own exit status
        assert "Traceback" not in err
        assert status()["claims"] == []


def test_a_stop_or_reclaim_forged_by_another_connection_is_ignored(daemon, tmp_path):
    """Anyone can send a signal to one connection; the run acts on the daemon's alone."""
    with trapping_run(tmp_path, "--session", "A") as run:
        [record] = status()["claims"]
        path = f"/org/resourced/claim/{record['id']}"
        victims = eventually(lambda: connections_of(run.pid))
        forge(victims, path, CLAIM_IFACE, "ReclaimRequested", "si", ("c0000000", 5))
        forge(victims, path, CLAIM_IFACE, "StopRequested", "us", (0, "forged"))
        time.sleep(1)  # the forged stop ended the run within 0.25 s when it was obeyed
        assert not (tmp_path / "got").exists() and run.poll() is None

        assert ok_json("stop", "--session", "A")["claims"] == [record["id"]]  # the real one
        run.communicate(timeout=8)
        assert (tmp_path / "got").read_text() == "got\n" and run.returncode == 0


def test_a_run_in_another_session_is_left_alone(daemon, tmp_path, signals):
    with trapping_run(tmp_path, "--session", "B") as run:
        other = claim(os.getpid(), "--gpus", "1", "--session", "A")
        assert ok_json("stop", "--session", "A")["claims"] == [other]
        signals.wait_for(lambda seen: other in signals.removed())
        assert [member for member, path, _ in signals.seen if member == "StopRequested"
                and not path.endswith("/" + other)] == []  # B's claim was not told
        assert not (tmp_path / "got").exists() and run.poll() is None
        (tmp_path / "stop").touch()
        assert run.wait(timeout=10) == 1  # it ran to its own end
    assert status()["claims"] == []


def test_stop_dry_run_lists_and_changes_nothing(daemon, owner, signals):
    a1 = claim(owner.pid, "--gpus", "2", "--session", "A", "--for", "30m")
    booked = book("--gpus", "1", "--session", "A")
    before = (status(), bookings(), free())

    would = ok_json("stop", "--session", "A", "--dry-run")
    r = gpuctl("stop", "--session", "A", "--dry-run")

    assert would == {"schema": 2, "dry_run": True, "claims": [a1], "bookings": [booked]}
    assert (r.returncode, r.stdout) == (0, "")
    line = one_gpuctl_line(r.stderr)
    assert "would stop" in line and a1 in line and booked in line and "dry run" in line
    assert (status(), bookings(), free()) == before
    assert signals_until_a_sentinel(signals, owner) == []


def test_stop_needs_a_session_or_a_user(daemon, owner):
    ref = claim(owner.pid, "--gpus", "1", "--session", "A")
    r = gpuctl("stop")
    assert (r.returncode, r.stdout) == (2, "")
    assert "--session" in r.stderr
    assert set(claims()) == {ref}


def test_stop_of_a_session_that_holds_nothing_is_refused_naming_those_that_do(daemon, owner):
    ref = claim(owner.pid, "--gpus", "1", "--session", "A")

    for args in (["--session", "nobody"], ["--session", "nobody", "--json"]):
        r = gpuctl("stop", *args)
        assert r.returncode == 6
        assert "no session 'nobody' holds anything (sessions: A;" in one_gpuctl_line(r.stderr)
    assert json.loads(r.stdout)["error"]["code"] == "NoSuchClaim"  # (--json: as JSON too)
    assert set(claims()) == {ref}


def test_stop_of_all_my_sessions_by_user(daemon, owner):
    a1 = claim(owner.pid, "--gpus", "1", "--session", "A")
    b1 = claim(owner.pid, "--gpus", "1", "--session", "B")
    me = status()["claims"][0]["user"]

    stopped = ok_json("stop", "--user", me)

    assert sorted(stopped["claims"]) == sorted([a1, b1])
    assert claims() == {}


def test_the_client_stop(daemon, owner):
    a1 = claim(owner.pid, "--gpus", "1", "--session", "A")
    b1 = claim(owner.pid, "--gpus", "1", "--session", "B")
    with Client() as c:
        assert c.stop(session="A", dry_run=True) == {"claims": [a1], "bookings": []}
        assert set(claims()) == {a1, b1}
        assert c.stop(session="A") == {"claims": [a1], "bookings": []}
        assert c.stop(session="A") == {"claims": [], "bookings": []}
    assert set(claims()) == {b1}


def test_sessions_with_nothing_held(daemon):
    assert ok_json("sessions") == []
    assert "no sessions" in ok("sessions")


def test_sessions_as_a_table(daemon, owner):
    claim(owner.pid, "--gpus", "2", "--session", "table-test")
    out = ok("sessions")
    header, row = out.splitlines()[:2]
    assert header.split() == ["SESSION", "USER", "CLAIMS", "WAITING", "GPUS", "BOOKINGS"]
    assert row.split()[0] == "table-test" and row.split()[2:4] == ["1", "0"]
    assert ok_json("sessions", "--all") == ok_json("sessions")  # only root's here


# == dry runs ===============================================================================


def test_claim_dry_run_claims_nothing_and_prints_no_reference(daemon, owner):
    before = (status()["claims"], free())

    r = gpuctl("claim", "--owner-pid", str(owner.pid), "--gpus", "2", "--dry-run")
    result = ok_json("claim", "--owner-pid", str(owner.pid), "--gpus", "2", "--dry-run",
                     "--session", "dry")

    assert (r.returncode, r.stdout) == (0, "")
    line = one_gpuctl_line(r.stderr)
    assert "would be granted" in line and "nothing claimed" in line
    assert result["dry_run"] is True
    held = result["allocation"]
    assert (held["ref"], held["state"], held["session"]) == ("", "granted", "dry")
    assert len(held["gpu_uuids"]) == 2
    assert (status()["claims"], free()) == before == ([], 4)


def test_claim_dry_run_that_does_not_fit_exits_3_like_a_real_claim(daemon, owner):
    claim(owner.pid, "--gpus", "3")
    before = (status(), free())

    dry = gpuctl("claim", "--owner-pid", str(owner.pid), "--gpus", "2", "--dry-run")
    real = gpuctl("claim", "--owner-pid", str(owner.pid), "--gpus", "2")
    never = gpuctl("claim", "--owner-pid", str(owner.pid), "--gpus", "5", "--dry-run")

    assert (dry.returncode, dry.stdout) == (3, "")
    assert real.returncode == 3 and dry.stderr == real.stderr
    assert (never.returncode, never.stdout) == (3, "")
    assert (status(), free()) == before


def test_claim_dry_run_with_wait_reports_queued_and_queues_nothing(daemon, owner):
    claim(owner.pid, "--gpus", "4")
    before = status()

    started = time.monotonic()
    result = ok_json("claim", "--owner-pid", str(owner.pid), "--gpus", "1", "--wait",
                     "--dry-run")
    r = gpuctl("claim", "--owner-pid", str(owner.pid), "--gpus", "1", "--wait", "--dry-run")

    assert time.monotonic() - started < 10  # answered, not waited
    assert result["dry_run"] is True
    assert (result["allocation"]["state"], result["allocation"]["ref"]) == ("queued", "")
    assert (r.returncode, r.stdout) == (0, "")
    assert "would wait" in one_gpuctl_line(r.stderr)
    after = status()
    assert after["claims"] == before["claims"] and after["queue"] == []


def test_the_client_claim_dry_run(daemon, owner):
    with Client() as c:
        result = c.claim(mode="dev", gpus=1, owner_pid=owner.pid, session="py", dry_run=True)
        assert result["dry_run"] is True
        assert (result["allocation"]["ref"], result["allocation"]["session"]) == ("", "py")
        assert c.free() == 4 and c.status()["claims"] == []


def test_run_dry_run_runs_nothing(daemon, tmp_path):
    marker = tmp_path / "ran"

    r = gpuctl("run", "--gpus", "2", "--dry-run", "--", "touch", str(marker))

    assert (r.returncode, r.stdout) == (0, "")
    line = one_gpuctl_line(r.stderr)
    assert "would be granted" in line and f"touch {marker}" in line
    assert not marker.exists()
    assert status()["claims"] == [] and free() == 4


def test_run_dry_run_that_does_not_fit_exits_3(daemon, owner, tmp_path):
    claim(owner.pid, "--gpus", "4")
    marker = tmp_path / "ran"

    r = gpuctl("run", "--gpus", "1", "--dry-run", "--", "touch", str(marker))

    assert (r.returncode, r.stdout) == (3, "")
    assert not marker.exists()
    assert len(status()["claims"]) == 1 and free() == 0


def test_run_dry_run_on_an_allocation_is_bad_usage(daemon, owner, tmp_path):
    ref = claim(owner.pid, "--gpus", "1")
    marker = tmp_path / "ran"

    r = gpuctl("run", "--allocation", ref, "--dry-run", "--", "touch", str(marker))

    assert (r.returncode, r.stdout) == (2, "")
    assert not marker.exists()
    assert set(claims()) == {ref}


def test_release_dry_run_releases_nothing(daemon, owner):
    ref = claim(owner.pid, "--gpus", "2")
    before = (status(), free())

    r = gpuctl("release", "--allocation", ref, "--dry-run")
    result = ok_json("release", "--allocation", ref, "--dry-run")

    assert (r.returncode, r.stdout) == (0, "")
    assert "would release" in one_gpuctl_line(r.stderr)
    assert result == {"schema": 2, "ref": ref, "released": False, "dry_run": True,
                      "warnings": []}
    assert (status(), free()) == before == (before[0], 2)
    with Client() as c:
        assert c.release(ref, dry_run=True) == []
    assert set(claims()) == {ref}
    ok("release", "--allocation", ref)  # and a real one still works
    assert claims() == {} and free() == 4


def test_release_dry_run_of_an_unknown_claim_exits_6(daemon):
    r = gpuctl("release", "--allocation", "cnosuch", "--dry-run")
    assert r.returncode == 6
    one_gpuctl_line(r.stderr)
    with Client() as c, pytest.raises(NoSuchClaim):
        c.release("cnosuch", dry_run=True)


def test_release_dry_run_by_gpu_is_bad_usage(daemon, owner):
    ref = claim(owner.pid, "--gpus", "1")
    gpu = claims()[ref]["gpus"][0]
    r = gpuctl("release", "--gpu", gpu, "--force", "--dry-run")
    assert r.returncode == 2
    assert set(claims()) == {ref}


# == more of the stop switch ================================================================


def test_stop_of_the_default_session_by_its_name(daemon, owner):
    mine = claim(owner.pid, "--gpus", "1")
    named = claim(owner.pid, "--gpus", "1", "--session", "named")
    default = f"sid:{os.getsid(owner.pid)}"
    assert claims()[mine]["session"] == default

    assert ok_json("stop", "--session", default)["claims"] == [mine]
    assert set(claims()) == {named}


def test_stopping_another_users_sessions_needs_a_reason(daemon, owner):
    ref = claim(owner.pid, "--gpus", "1", "--session", "A")

    r = gpuctl("stop", "--user", "1", "--session", "A")  # uid 1 (daemon): not me
    reasoned = gpuctl("stop", "--user", "1", "--session", "A", "--reason", "maintenance")
    unknown = gpuctl("stop", "--user", "no-such-user-x9q")

    assert r.returncode == 2 and "reason" in one_gpuctl_line(r.stderr)
    assert reasoned.returncode == 6  # with a reason, past the check: uid 1 holds no "A"
    assert "no session 'A' holds anything" in one_gpuctl_line(reasoned.stderr)
    assert unknown.returncode == 2
    assert set(claims()) == {ref}


def test_run_on_an_allocation_exports_the_allocations_session(daemon, owner):
    ref = claim(owner.pid, "--gpus", "1", "--session", "dev-s")
    out = ok("run", "--allocation", ref, "--", "sh", "-c", 'echo "$RESOURCED_SESSION"',
             env={"RESOURCED_SESSION": "elsewhere"})
    assert out == "dev-s\n"


def test_run_on_an_allocation_with_a_session_is_bad_usage(daemon, owner, tmp_path):
    ref = claim(owner.pid, "--gpus", "1", "--session", "dev-s")
    r = gpuctl("run", "--allocation", ref, "--session", "other", "--", "touch",
               str(tmp_path / "ran"))
    assert r.returncode == 2
    assert not (tmp_path / "ran").exists()


def test_a_run_on_a_dev_claim_of_the_stopped_session_gets_the_reclaim_signal(daemon, owner,
                                                                            tmp_path):
    ref = claim(owner.pid, "--gpus", "1", "--session", "A")
    with trapping_run(tmp_path, "--allocation", ref) as run:
        assert ok_json("stop", "--session", "A")["claims"] == [ref]
        assert run.wait(timeout=5) == 0  # the signal comes at once, SIGTERM 10 s later
        assert (tmp_path / "got").read_text() == "got\n"


def test_claims_and_bookings_keep_their_session_across_a_restart(start_daemon, owner):
    first = start_daemon()
    ref = claim(owner.pid, "--gpus", "1", "--session", "kept", "--for", "30m")
    booked = book("--gpus", "1", "--session", "kept")
    first.stop()

    start_daemon(runtime_dir=first.runtime_dir)

    assert claims()[ref]["session"] == "kept"
    assert bookings()[booked]["session"] == "kept"
    assert ok_json("stop", "--session", "kept") == {
        "schema": 2, "dry_run": False, "claims": [ref], "bookings": [booked]}


def active_booking(session: str) -> str:
    """A booking of 1 GPU for an hour from now, in ``session``, once it is active."""
    ref = ok("book", "--gpus", "1", "--for", "1h", "--session", session).strip()
    eventually(lambda: bookings()[ref]["state"] == "active", timeout=5)
    return ref


def test_stop_releases_an_active_booking_and_the_command_run_on_it_ends(daemon, tmp_path):
    ref = active_booking("A")
    with trapping_run(tmp_path, "--allocation", ref) as run:
        assert ok_json("stop", "--session", "A") == {
            "schema": 2, "dry_run": False, "claims": [], "bookings": [ref]}
        assert bookings()[ref]["state"] == "ended"
        assert status()["claims"] == []
        run.wait(timeout=8)  # its end watcher sees the booking gone (SIGTERM)


def test_a_run_on_an_active_booking_of_the_stopped_session_gets_the_reclaim_signal(
        daemon, tmp_path):
    ref = active_booking("A")
    with trapping_run(tmp_path, "--allocation", ref) as run:
        ok("stop", "--session", "A")
        run.wait(timeout=8)
        assert (tmp_path / "got").exists()
        assert run.returncode == 0


# == limits: configured, shown, and root under them ========================================


SESSION_LIMITS = {"max_gpus_per_user": 1, "max_claims_per_session": 1,
                  "max_gpus_per_session": 1, "max_booked_gpu_hours_per_user": 1,
                  "max_booked_gpu_hours_per_session": 0.5}


def test_the_session_limits_are_shown_and_hold_for_root_too(start_daemon, tmp_path, owner):
    """An agent swarm run as root, as in most containers, is capped by its session's
    limits; ``exempt_users`` spares root the per-user ones only."""
    config = tmp_path / "config.toml"
    config.write_text("[daemon]\nexempt_users = [\"root\"]\n"
                      + "".join(f"{k} = {v}\n" for k, v in SESSION_LIMITS.items()))
    start_daemon(args=["--config", str(config)])

    limits = ok_json("status")["limits"]
    assert {k: limits[k] for k in SESSION_LIMITS} == SESSION_LIMITS

    # root (these tests) is under each session limit, and past the per-user ones
    claim(owner.pid, "--gpus", "1", "--session", "A", "--for", "30m")
    over = gpuctl("claim", "--owner-pid", str(owner.pid), "--gpus", "1", "--session", "A")
    assert over.returncode == 12 and "max_claims_per_session" in over.stderr
    claim(owner.pid, "--gpus", "1", "--session", "B", "--for", "30m")  # 2 GPUs: exempt user
    found = {s["session"]: s for s in ok_json("sessions")}
    assert len(found["A"]["claims"]) == 1 and len(found["B"]["claims"]) == 1
