"""The wrong answers a new user met (one dialect), each pinned by what the user sees."""

import json
import os
import re
import subprocess
import sys

import pytest

from resourced.client.sync import Client
from resourced.errors import InvalidArgs

from ..conftest import gpuctl


def claims() -> list[dict]:
    return json.loads(gpuctl("status", "--json").stdout)["claims"]


@pytest.mark.parametrize("command", [
    ["claim", "--owner-pid", "{pid}"], ["run"], ["book", "--for", "1h", "--at", "+1h"]])
@pytest.mark.parametrize("option, value, says", [
    ("--vram", "4000", "4000 what? 4000M or 4G"),
    ("--ram", "4000", "4000 what? 4000M or 4G"),
    ("--vram", "24", "24 what? 24M or 24G"),
    ("--cpu", "1.5", "--cpu is a whole number greater than 0, without a unit, not '1.5'"),
    ("--cpu", "0.5", "--cpu is a whole number greater than 0, without a unit, not '0.5'"),
    ("--cpu", "2G", "--cpu is a whole number greater than 0, without a unit, not '2G'"),
])
def test_memory_needs_a_unit_and_a_count_is_whole(daemon, command, option, value, says):
    args = [a.format(pid=os.getpid()) for a in command] + [option, value]
    if command == ["run"]:
        args += ["--", "true"]
    r = gpuctl(*args)
    assert r.returncode == 2, r.stderr
    assert says in r.stderr and "Traceback" not in r.stderr
    assert claims() == []


def test_python_memory_is_bytes_of_at_least_a_mib_or_megabytes_by_name(daemon):
    with Client(bus="session") as c:
        with pytest.raises(InvalidArgs, match="4000 what\\? 4000M or 4G"):
            c.claim(gpus=0, vram=4000, owner_pid=os.getpid())
        with pytest.raises(InvalidArgs, match="give vram or vram_mb, not both"):
            c.claim(gpus=0, vram="1G", vram_mb=1024, owner_pid=os.getpid())
        lease = c.claim(mode="run", gpus=0, vram_mb=4096, ram_mb=512, owner_pid=os.getpid())
        assert lease["allocation"]["vram_bytes"] == 4 << 30
        assert lease["allocation"]["pools"]["ram"] == 512 << 20
        c.release(lease["allocation"]["ref"])
        exact = c.claim(mode="run", gpus=0, vram=3 << 30, owner_pid=os.getpid())
        assert exact["allocation"]["vram_bytes"] == 3 << 30
        c.release(exact["allocation"]["ref"])


def test_a_python_claim_of_vram_alone_is_a_share_as_acquire_and_mcp_read_it(daemon):
    """claim(vram=...) and the README's vram_mb= were refused: gpus defaulted to 1."""
    with Client(bus="session") as c:
        for memory in ({"vram": "4G"}, {"vram_mb": 4096}):
            lease = c.claim(mode="dev", owner_pid=os.getpid(), **memory)
            got = lease["allocation"]
            assert (got["vram_bytes"], len(got["gpu_uuids"])) == (4 << 30, 1)  # a share of one
            c.release(lease["allocation"]["ref"])
        whole = c.claim(owner_pid=os.getpid())  # and with neither, one whole GPU, as before
        assert (whole["allocation"]["vram_bytes"], len(whole["allocation"]["gpu_uuids"])) \
            == (0, 1)
        c.release(whole["allocation"]["ref"])
        with pytest.raises(InvalidArgs, match="not both"):
            c.claim(gpus=1, vram="4G", owner_pid=os.getpid())


@pytest.mark.parametrize("args, says", [
    (["--for", "2", "hours"], "2 what? Give the unit: 2s, 2m or 2h"),  # (the bare number first)
    (["--for", "2h", "more"], "unexpected argument 'more' before --"),
    (["--label", "my", "job"], "unexpected argument 'job' before --"),
])
def test_a_stray_word_before_the_dashes_is_refused_before_anything_is_claimed(daemon, tmp_path,
                                                                              args, says):
    ran = tmp_path / "ran"
    r = gpuctl("run", *args, "--", "touch", str(ran))
    assert r.returncode == 2 and says in r.stderr
    assert not ran.exists() and claims() == []
    assert json.loads(gpuctl("usage", "--json").stdout) == []  # nothing was ever held
    dashes = gpuctl("run", "--", "sh", "-c", 'echo "$0 $1"', "--", "x")
    assert dashes.returncode == 0 and dashes.stdout.strip() == "-- x"  # -- inside the command


def test_the_jax_fraction_of_a_share_is_exact(daemon):
    r = gpuctl("run", "--vram", "1.5G", "--", "sh", "-c", "echo $XLA_PYTHON_CLIENT_MEM_FRACTION")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "0.01875"  # of an 80G GPU; it was 0.01, half the share


@pytest.mark.parametrize("gpus, says", [
    ("four", "RESOURCED_SIMULATED_GPUS=four: neither a number of GPUs nor a simulation file"),
    ("99999", "RESOURCED_SIMULATED_GPUS=99999: a number of GPUs is from 0 to 4096"),
])
def test_an_environment_that_names_no_gpus_refuses_to_start(start_daemon, gpus, says):
    d = start_daemon(gpus=gpus, wait=False)
    assert d.proc.wait(10) == 2
    assert says in d.log()


def test_a_huge_interval_is_refused_by_config_check_and_the_daemon(start_daemon, tmp_path):
    config = tmp_path / "config.toml"
    config.write_text("[daemon]\nsample_interval = 1e308\n")
    checked = gpuctl("config", "check", str(config))
    assert checked.returncode == 2 and "daemon.sample_interval" in checked.stderr
    d = start_daemon(args=("--config", str(config)), wait=False)
    assert d.proc.wait(10) == 2 and "at most 86400" in d.log()


@pytest.mark.parametrize("args, says", [
    (["book", "--for", "10m", "--at", "08:30"], "08:30 has passed today (it is 09:00)"),
    (["book", "--for", "10m", "--at", "09:00"], "09:00 is this very minute"),
])
def test_a_time_of_day_never_adds_a_day_silently(clocked_daemon, args, says):
    clocked_daemon(gpus=1)
    r = gpuctl(*args)
    assert r.returncode == 2 and says in r.stderr
    assert json.loads(gpuctl("bookings", "--json").stdout) == []
    # every form it suggests books (today HH:MM, which was, is named as past)
    suggested = re.search(r"say (now), (\+DURATION) or (tomorrow \d\d:\d\d) \(today "
                          r"\d\d:\d\d is past\)", r.stderr)
    assert suggested, r.stderr
    now, _, tomorrow = suggested.groups()
    for when in (now, "+1h", tomorrow):
        assert gpuctl("book", "--for", "10m", "--at", when).returncode == 0, when


def test_extend_until_a_time_that_passed_is_refused(clocked_daemon):
    clocked_daemon(gpus=1)
    ref = gpuctl("book", "--for", "1h", "--at", "+1h").stdout.strip()
    r = gpuctl("extend", ref, "--until", "08:59")
    assert r.returncode == 2 and "08:59 has passed today" in r.stderr
    [booking] = json.loads(gpuctl("bookings", "--json").stdout)
    assert booking["end"] == "2026-12-01T11:00:00Z"  # unchanged


@pytest.mark.parametrize("typed, says", [
    ("stauts", "No such command 'stauts'. Did you mean 'status'?"),
    ("bookingz", "Did you mean 'bookings' or 'book'?"),
    ("xyzzy", "No such command 'xyzzy'. (see"),
])
def test_a_mistyped_command_says_what_it_may_have_meant(typed, says):
    r = gpuctl(typed)
    assert r.returncode == 2 and says in r.stderr


def test_the_daemons_help_lists_the_environment_it_reads():
    r = subprocess.run([sys.executable, "-m", "resourced.daemon", "--help"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0
    for name in ("RESOURCED_CONFIG", "RESOURCED_RUNTIME_DIR", "RESOURCED_STATE_DIR",
                 "RESOURCED_SIMULATED_GPUS", "RESOURCED_SIMULATED_CLOCK"):
        assert name in r.stdout


@pytest.mark.parametrize("command", [["claim", "--gpus", "1", "--owner-pid", "1"],
                                     ["run", "--gpus", "1"]])
def test_a_timeout_without_wait_is_refused_not_ignored(daemon, command):
    args = [*command, "--timeout", "5m", *(["--", "true"] if command[0] == "run" else [])]
    r = gpuctl(*args)
    assert r.returncode == 2 and "--timeout is how long --wait waits: add --wait" in r.stderr
    with Client(bus="session") as c:
        assert c.status()["claims"] == []
