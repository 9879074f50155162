"""Colour for what a person must notice: --color=always|never|auto, and NO_COLOR."""

import subprocess

import pytest

from resourced.client.sync import Client

from ..conftest import eventually, gpuctl

RED_DEAD = "\x1b[31mDEAD\x1b[0m"


@pytest.fixture
def dead_claim(daemon):
    """A development claim whose owner is gone: status shows it DEAD."""
    owner = subprocess.Popen(["sleep", "60"])
    with Client() as c:
        c.claim(owner_pid=owner.pid)
    owner.kill()
    owner.wait(5)
    eventually(lambda: "DEAD" in gpuctl("status").stdout)


@pytest.mark.parametrize("args, env, coloured", [
    (["--color=always"], {}, True),
    (["--color=always"], {"NO_COLOR": "1"}, True),   # the command line wins
    (["--color=never"], {}, False),
    ([], {}, False),                                   # auto, and not a terminal
])
def test_dead_is_red_only_when_colour_is_wanted(dead_claim, args, env, coloured):
    r = gpuctl(*args, "status", env=env)
    assert r.returncode == 0
    assert (RED_DEAD in r.stdout) == coloured
    assert ("\x1b[" in r.stdout) == coloured


def test_colour_never_shifts_the_columns(dead_claim):
    def dead_at(out: str) -> list[int]:
        return [line.replace("\x1b[31m", "").index("DEAD") for line in out.splitlines()
                if "DEAD" in line]

    assert dead_at(gpuctl("--color=always", "status").stdout) == \
        dead_at(gpuctl("--color=never", "status").stdout)
