"""Isolation on a bus where it cannot work: a user's (or a shared) daemon cannot restrict
devices, so --isolate is refused in words, before anything is claimed or run; the rest of
the surface (Features, the claim's Isolated, status) says the claims are not isolated.
The real thing runs under the real systemd (tests/systemd/test_isolation.py)."""

import json
import re
import subprocess

import pytest

from resourced.client.sync import Client
from resourced.errors import InvalidArgs

from ..conftest import gpuctl

REFUSAL = "isolation needs the system service (gpuctl service enable --system)"


def test_isolate_is_refused_on_the_session_bus_before_anything_runs(start_daemon, owner,
                                                                     tmp_path):
    start_daemon()
    marker = tmp_path / "ran"

    ran = gpuctl("run", "--isolate", "--", "touch", str(marker))
    claimed = gpuctl("claim", "--isolate", "--owner-pid", str(owner.pid))

    for done in (ran, claimed):
        assert done.returncode == 2, done.stderr
        assert REFUSAL in done.stderr and len(done.stderr.splitlines()) == 1
    assert not marker.exists()
    assert json.loads(gpuctl("status", "--json").stdout)["claims"] == []


def _properties(address: str, path: str, interface: str, *names: str) -> list:
    out = subprocess.run(["busctl", f"--address={address}", "--json=short", "get-property",
                          "org.resourced", path, interface, *names],
                         check=True, capture_output=True, text=True, timeout=10).stdout
    return [json.loads(line)["data"] for line in out.splitlines()]


def test_claims_here_say_they_are_not_isolated(start_daemon, owner):
    daemon = start_daemon()
    ref = gpuctl("claim", "--no-isolate", "--owner-pid", str(owner.pid)).stdout.strip()

    [features] = _properties(daemon.bus.address, "/org/resourced", "org.resourced.Manager",
                             "Features")
    [isolated] = _properties(daemon.bus.address, f"/org/resourced/claim/{ref}",
                             "org.resourced.Claim", "Isolated")
    assert "isolation" not in features and "claims" in features
    assert isolated is False
    with Client() as c:
        assert c.allocation(ref)["allocation"]["isolated"] is False
    assert json.loads(gpuctl("status", "--json").stdout)["claims"][0]["isolated"] is False
    for args in (("--allocation", ref), ("--no-isolate",)):  # nothing to confine
        done = gpuctl("run", *args, "--", "true")
        assert done.returncode == 0, done.stderr


def test_confine_says_why_it_cannot_work_here(start_daemon, owner):
    start_daemon()
    ref = gpuctl("claim", "--owner-pid", str(owner.pid)).stdout.strip()

    with Client() as c, pytest.raises(InvalidArgs, match=re.escape(REFUSAL)):
        c.confine(ref, owner.pid)
