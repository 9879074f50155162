"""The rules of one dialect where they need the daemon: what a user types, and sees."""

import json

import pytest

from ..conftest import gpuctl


def bookings() -> list[dict]:
    return json.loads(gpuctl("bookings", "--json").stdout)


def hours(booking: dict) -> float:
    return (booking["end_usec"] - booking["start_usec"]) / 3600e6


def test_book_takes_gpubks_count_and_duration_first(clocked_daemon):
    clocked_daemon(gpus=4)
    r = gpuctl("book", "2", "30m", "--json")
    assert r.returncode == 0, r.stderr
    booking = json.loads(r.stdout)["booking"]
    assert (booking["gpus_requested"], hours(booking)) == (2, 0.5)
    r = gpuctl("book", "-G", "1", "-t", "1:00:00", "--at", "+1h", "--json")
    assert r.returncode == 0, r.stderr
    booking = json.loads(r.stdout)["booking"]
    assert (booking["gpus_requested"], hours(booking)) == (1, 1.0)
    assert len(bookings()) == 2


@pytest.mark.parametrize("args, says", [
    (["2", "30"], "30 what? Give the unit: 30s, 30m or 30h"),
    (["2", "30m", "--gpus", "1"], "both say how many GPUs"),
    (["30m", "--for", "1h"], "both say how long"),
    (["2"], "how long? --for 2h, or the DURATION word"),
    (["2", "30m", "soon"], "unexpected argument 'soon'"),
])
def test_book_refuses_a_positional_form_it_cannot_read(clocked_daemon, args, says):
    clocked_daemon(gpus=4)
    r = gpuctl("book", *args)
    assert r.returncode == 2 and says in r.stderr, r.stderr
    assert bookings() == []


def test_bus_may_come_before_the_subcommand(daemon):
    assert gpuctl("--bus", "session", "free", "--json").returncode == 0
    r = gpuctl("--bus", "session", "free", "--bus", "nosuch")
    assert r.returncode == 2 and "'nosuch' is not one of" in r.stderr


def test_since_takes_a_duration_and_the_timeline_a_span(clocked_daemon):
    clocked_daemon(gpus=2)
    assert gpuctl("usage", "--since", "1h", "--json").returncode == 0
    r = gpuctl("timeline", "--span", "4h", "--json")
    assert r.returncode == 0, r.stderr
    drawn = json.loads(r.stdout)
    assert drawn["until_usec"] - drawn["now_usec"] == 4 * 3600 * 10**6
    r = gpuctl("timeline", "--span", "4")
    assert r.returncode == 2 and "4 what?" in r.stderr


def claim(pid: int) -> str:
    r = gpuctl("claim", "--gpus", "1", "--owner-pid", str(pid))
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def live_claims() -> list[str]:
    return [c["id"] for c in json.loads(gpuctl("status", "--json").stdout)["claims"]]


def test_release_takes_several_refs_and_goes_on_past_one_refused(clocked_daemon, owner):
    clocked_daemon(gpus=4)
    a, b, c = claim(owner.pid), claim(owner.pid), claim(owner.pid)
    assert gpuctl("release", a, b).returncode == 0
    assert live_claims() == [c]
    r = gpuctl("release", "nosuch", c)
    assert r.returncode == 6 and "gpuctl: nosuch: " in r.stderr and "1 of 2 failed" in r.stderr
    assert live_claims() == []


def test_with_several_refs_json_names_the_one_that_failed_and_times_stay_local(
        clocked_daemon, owner):
    """release A B --json with one failure named neither it on stdout nor its time in
    local time on stderr (ISO there, local with one REF)."""
    clocked_daemon(gpus=4)
    a, b = claim(owner.pid), claim(owner.pid)
    assert gpuctl("release", a).returncode == 0  # a is gone: "ended today 09:00"
    r = gpuctl("release", a, b, "--json")
    assert r.returncode == 6
    lines = [json.loads(line) for line in r.stdout.splitlines()]
    failed = [line for line in lines if line.get("ref") == a]
    assert [f["error"]["code"] for f in failed] == ["NoSuchClaim"]
    assert any(line.get("ref") == b and line.get("released") for line in lines), lines
    assert lines[-1]["error"]["message"] == f"1 of 2 failed: {a}"
    assert f"gpuctl: {a}: claim {a} ended today 09:00" in r.stderr, r.stderr
    assert "T09:00" not in r.stderr


def test_env_takes_the_ref_as_its_argument(clocked_daemon, owner):
    clocked_daemon(gpus=2)
    ref = claim(owner.pid)
    by_argument = gpuctl("env", ref, "--json")
    assert by_argument.returncode == 0, by_argument.stderr
    assert json.loads(by_argument.stdout) == json.loads(
        gpuctl("env", "--allocation", ref, "--json").stdout)
    r = gpuctl("env")
    assert r.returncode == 2 and "name the claim: REF" in r.stderr


def test_a_booking_not_started_is_named_as_such(clocked_daemon):
    clocked_daemon(gpus=2)
    ref = gpuctl("book", "1", "1h", "--at", "+2h").stdout.strip()
    for args in (["env", ref], ["release", ref], ["run", "--allocation", ref, "--", "true"]):
        r = gpuctl(*args)
        assert r.returncode == 6, (args, r.stderr)
        assert f"{ref} is a booking that starts today 11:00" in r.stderr, r.stderr
    shown = json.loads(gpuctl("bookings", ref, "--json").stdout)
    assert (shown["id"], shown["state"]) == (ref, "scheduled")


def test_cancel_takes_several_refs(clocked_daemon):
    clocked_daemon(gpus=2)
    refs = [gpuctl("book", "1", "1h", "--at", at).stdout.strip() for at in ("+1h", "+3h")]
    assert gpuctl("cancel", *refs).returncode == 0
    assert {b["state"] for b in bookings()} <= {"ended"}


# --- rule 6: retries are safe, typos are loud ----------------------------------------------


def test_a_second_release_says_when_and_how_the_claim_ended(clocked_daemon, owner):
    clocked_daemon(gpus=1)
    ref = claim(owner.pid)
    assert gpuctl("release", ref).returncode == 0
    r = gpuctl("release", ref)
    assert r.returncode == 6  # the predecessor's "unknown or stale allocation"
    assert f"claim {ref} ended today 09:00 (released)" in r.stderr, r.stderr
    assert "T09:00" not in r.stderr  # a person's time, not ISO (rule 5)


def test_the_owner_repeating_a_cancel_is_told_it_happened(clocked_daemon, clock):
    clocked_daemon(gpus=1)
    ref = gpuctl("book", "1", "1h", "--at", "+1h").stdout.strip()
    assert gpuctl("cancel", ref).returncode == 0
    clock.set("2026-12-01T09:05:00Z")
    r = gpuctl("cancel", ref)
    assert r.returncode == 0, r.stderr
    assert f"{ref} was cancelled already, today 09:00 (nothing changed)" in r.stderr


def test_logs_of_a_ref_without_a_command_lists_those_with_one(clocked_daemon, tmp_path):
    clocked_daemon(gpus=1)
    state = {"XDG_STATE_HOME": str(tmp_path)}
    r = gpuctl("logs", "nosuch", env=state)
    assert r.returncode == 6 and "no command for nosuch (none has one yet" in r.stderr
    ref = gpuctl("book", "1", "1h", "--at", "+1h", "--", "true", env=state).stdout.strip()
    r = gpuctl("logs", "nosuch", env=state)
    assert r.returncode == 6 and f"no command for nosuch (those with one: {ref};" in r.stderr


# --- rule 7: what the product suggests works when pasted -----------------------------------


def test_a_slot_starting_now_is_offered_as_now_and_books_when_pasted(clocked_daemon, clock):
    import shlex

    clocked_daemon(gpus=1)
    r = gpuctl("slots", "--gpus", "1", "--for", "10m", "--count", "1")
    assert r.returncode == 0, r.stderr
    command = shlex.split(r.stdout.split(":  ", 1)[1])
    assert command[-2:] == ["--at", "now"]
    clock.set("2026-12-01T09:00:03Z")  # pasted a moment later: 09:00:00 has passed
    made = gpuctl(*command[1:])
    assert made.returncode == 0, made.stderr


def test_agent_context_offers_an_owner_that_outlives_the_shell_it_ran_in(daemon):
    """An agent's tool runs gpuctl through `sh -c`, which is gone when the agent pastes
    the command: the owner offered is the agent's own process (here, this test's)."""
    import os
    import subprocess
    import sys

    r = subprocess.run(["sh", "-c", f"{sys.executable} -m resourced.cli agent context --json"],
                       capture_output=True, text=True, timeout=30, check=False)
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["me"]["owner_pid"] == os.getpid()
    assert f"--owner-pid {os.getpid()} " in data["commands"]["claim"]
    claimed = gpuctl(*data["commands"]["claim"].split()[1:-2], "--task-name", "pasted")
    assert claimed.returncode == 0, claimed.stderr
    assert gpuctl("release", claimed.stdout.strip()).returncode == 0


# --- rule 9: short bookings ----------------------------------------------------------------


def test_book_says_when_the_runners_grace_is_cut_for_a_short_booking(clocked_daemon, tmp_path):
    clocked_daemon(gpus=1)
    state = {"XDG_STATE_HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path)}
    r = gpuctl("book", "1", "20s", "--", "sleep", "5", env=state)
    assert r.returncode == 0, r.stderr
    assert "the runner's grace (30s) is more than a quarter of this booking: its command " \
           "gets SIGTERM 5s before the end" in r.stderr
    r = gpuctl("book", "1", "1h", "--at", "+1h", "--", "true", env=state)
    assert "grace" not in r.stderr


# --- rule 5: amounts and times as a person reads them --------------------------------------


def test_amounts_are_shown_with_their_unit_in_tables_and_refusals(clocked_daemon, owner):
    clocked_daemon(gpus=1)
    assert gpuctl("book", "1", "1h", "--at", "+1h", "--ram", "4G").returncode == 0
    table = gpuctl("bookings").stdout
    assert "ram 4G" in table and "4294967296" not in table
    r = gpuctl("claim", "--ram", "100T", "--owner-pid", str(owner.pid))
    assert r.returncode == 3, r.stderr
    assert not any(len(word) > 9 and word.isdigit() for word in r.stderr.split()), r.stderr


# --- rule 8: trying it outside the demo ----------------------------------------------------


def test_the_demo_shell_is_on_a_private_bus_where_examples_can_be_typed(tmp_path):
    import os
    import subprocess
    import sys

    script = "gpuctl free\ngpuctl book 1 30m --json >/dev/null && echo booked\nexit 3\n"
    bin_dir = os.path.dirname(sys.executable)
    r = subprocess.run([sys.executable, "-m", "resourced.cli", "demo", "--shell"], input=script,
                       capture_output=True, text=True, timeout=60, check=False,
                       env={**os.environ, "SHELL": "/bin/sh",
                            "PATH": f"{bin_dir}:{os.environ['PATH']}",
                            "XDG_STATE_HOME": str(tmp_path)})
    assert r.returncode == 3, r.stderr  # the shell's own exit code
    lines = r.stdout.splitlines()
    assert "4" in lines and "booked" in lines, r.stdout


def test_with_no_session_bus_the_daemon_says_how_to_get_one():
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items()
           if k not in ("DBUS_SESSION_BUS_ADDRESS", "XDG_RUNTIME_DIR")}
    r = subprocess.run([sys.executable, "-m", "resourced.daemon", "--session"], env=env,
                       capture_output=True, text=True, timeout=30, check=False)
    assert r.returncode != 0
    assert "there is no session bus here" in r.stderr and "dbus-run-session -- bash" in r.stderr


# --- rule 2: one request vocabulary ----------------------------------------------------------


def test_a_share_on_a_named_gpu_is_booked_as_gpubk_books_it(clocked_daemon):
    """GPUBK's `bk 1 2h --gpu 1 --mem 24g`: 24G of GPU 1, for 2 hours."""
    clocked_daemon(gpus=4)
    r = gpuctl("book", "1", "2h", "--gpu", "1", "--vram", "24G", "--json")
    assert r.returncode == 0, r.stderr
    booking = json.loads(r.stdout)["booking"]
    assert (booking["gpu_indices"], booking["vram_bytes"], booking["shared"]) == ([1], 24 << 30,
                                                                                 True)
    assert hours(booking) == 2.0
    again = json.loads(gpuctl("book", "2h", "--gpu", "1", "--vram", "24G", "--json").stdout)
    assert again["booking"]["gpu_indices"] == [1]  # beside the first: 48G of its 80G


@pytest.mark.parametrize("command", [["run", "--", "true"], ["claim", "--owner-pid", "1"],
                                     ["book", "--for", "1h"]])
def test_more_gpus_than_there_are_exits_3_on_every_command(clocked_daemon, command):
    clocked_daemon(gpus=4)
    at = command.index("--") if "--" in command else len(command)
    r = gpuctl(*command[:at], "--gpus", "5", *command[at:])
    assert r.returncode == 3, (command, r.returncode, r.stderr)


def test_run_and_claim_take_gpu_and_exclude_as_book_does(clocked_daemon, owner):
    clocked_daemon(gpus=4)
    r = gpuctl("claim", "--gpu", "2", "--owner-pid", str(owner.pid), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["allocation"]["gpu_indices"] == [2]
    r = gpuctl("claim", "--gpu", "1", "--vram", "20G", "--owner-pid", str(owner.pid), "--json")
    assert json.loads(r.stdout)["allocation"]["gpu_indices"] == [1]
    ran = gpuctl("run", "--exclude", "0,1,2", "--index", "--", "sh", "-c",
                 'echo "$CUDA_VISIBLE_DEVICES"')
    assert (ran.returncode, ran.stdout.strip()) == (0, "3"), ran.stderr  # gpu3, the one left
    r = gpuctl("claim", "--gpu", "2", "--owner-pid", str(owner.pid))
    assert r.returncode == 3, r.stderr  # its one GPU is taken
    r = gpuctl("claim", "--gpus", "2", "--gpu", "1", "--owner-pid", str(owner.pid))
    assert r.returncode == 2 and "2 GPU(s) asked and 1 named" in r.stderr


# --- rule 11: the Python client ------------------------------------------------------------


def test_a_lease_granted_until_a_booking_carries_the_warning_gpuctl_prints(clocked_daemon):
    from resourced import Client

    clocked_daemon(gpus=1)
    gpuctl("book", "1", "1h", "--at", "+15m")
    with Client() as c, c.acquire(gpus=1) as lease:
        assert lease.warnings == ["granted until today 09:15 only: booked from then by root; "
                                  "you will be asked to give it back then"]


def test_with_no_session_bus_gpuctl_says_how_to_get_one():
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items()
           if k not in ("DBUS_SESSION_BUS_ADDRESS", "XDG_RUNTIME_DIR")}
    r = subprocess.run([sys.executable, "-m", "resourced.cli", "free", "--bus", "session"],
                       env=env, capture_output=True, text=True, timeout=30, check=False)
    assert r.returncode == 5
    assert "there is no session bus here" in r.stderr and "dbus-run-session -- bash" in r.stderr


def test_the_advice_with_no_session_bus_works_when_followed_as_written(tmp_path):
    """resourced --session with neither a session bus nor $XDG_RUNTIME_DIR (a bare ssh
    login, a container) says what to type; typed as said, a daemon starts and gpuctl
    reaches it (the advice once ended in 'XDG_RUNTIME_DIR is not set')."""
    import os
    import re
    import shlex
    import subprocess
    import sys
    from pathlib import Path

    bin_dir = Path(sys.executable).parent
    env = {k: v for k, v in os.environ.items()
           if k not in ("DBUS_SESSION_BUS_ADDRESS", "XDG_RUNTIME_DIR")}
    env |= {"PATH": f"{bin_dir}:{env.get('PATH', '')}", "RESOURCED_SIMULATED_GPUS": "2",
            "RESOURCED_STATE_DIR": str(tmp_path / "state"), "TMPDIR": str(tmp_path)}
    said = subprocess.run(["resourced", "--session"], env=env, capture_output=True, text=True,
                          timeout=30, check=False)
    assert said.returncode != 0
    advice = re.search(r"start one for a shell: (dbus-run-session -- bash), and in it "
                       r"(export XDG_RUNTIME_DIR=\$\(mktemp -d\)); then: (resourced --session)",
                       said.stderr)
    assert advice, said.stderr
    start_shell, runtime, daemon = advice.groups()
    # the shell the advice starts, given the rest as a script (bash -c, not a terminal)
    script = (f"{runtime}; {daemon} & daemon=$!; i=0; "
              "until gpuctl free >/dev/null 2>&1 || [ $i -ge 100 ]; do sleep 0.1; i=$((i+1)); "
              "done; gpuctl free; code=$?; kill $daemon; wait $daemon; exit $code")
    done = subprocess.run([*shlex.split(start_shell), "-c", script], env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip() == "2"
