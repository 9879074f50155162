"""With no daemon anywhere, gpuctl says which buses it tried and how to start one (exit 5)."""

import pytest

from ..conftest import gpuctl


@pytest.fixture
def no_daemon(private_bus, monkeypatch):
    """The private session bus with nobody owning org.resourced, and no system bus."""
    monkeypatch.setenv("DBUS_SESSION_BUS_ADDRESS", private_bus.address)
    monkeypatch.setenv("DBUS_SYSTEM_BUS_ADDRESS", "unix:path=/nonexistent/system_bus_socket")


def test_asked_for_the_session_bus_it_says_the_daemon_is_not_running_there(no_daemon):
    r = gpuctl("status", "--bus", "session")
    assert r.returncode == 5
    assert r.stderr == ("gpuctl: the resourced daemon is not running on the session bus; start "
                        "it: `systemctl --user start resourced` (after `gpuctl service enable "
                        "--user`), or `resourced --session`\n")


def test_looking_everywhere_it_names_both_buses_and_both_ways_to_start(no_daemon):
    r = gpuctl("free")
    assert r.returncode == 5
    assert r.stderr.startswith("gpuctl: cannot reach the system bus (No such file or directory), "
                               "and no daemon runs on the session bus; start the daemon: ")
    assert "`sudo systemctl start resourced`" in r.stderr and "`resourced --session`" in r.stderr
    assert "`systemctl --user start resourced`" in r.stderr
    assert r.stderr.count("\n") == 1
    # each way once, and short enough to read (it ran to 350 characters, naming
    # `resourced --session` twice)
    assert r.stderr.count("resourced --session") == 1 and len(r.stderr) < 300, r.stderr


def test_a_wait_for_a_claim_with_no_daemon_fails_at_once(no_daemon):
    """The bus's ServiceUnknown is no daemon at all, not one that went away holding the
    call (NoReply), which a waiting client would sit out."""
    r = gpuctl("run", "--bus", "session", "--wait", "--", "true", timeout=10)
    assert r.returncode == 5, r.stderr
    assert "the resourced daemon is not running on the session bus" in r.stderr


def test_looking_everywhere_it_takes_the_session_bus_that_can_start_one(tmp_path, monkeypatch):
    """The one order: a session bus with resourced's activation file (as `gpuctl service
    enable --user` installs) is the bus, though no daemon runs there yet: the call starts
    it, rather than failing on the system bus."""
    import json
    import sys

    from resourced.linux.privatebus import PrivateBus

    services = tmp_path / "services"
    services.mkdir()
    run = tmp_path / "run"
    (services / "org.resourced.service").write_text(
        "[D-BUS Service]\nName=org.resourced\n"
        f"Exec=/usr/bin/env RESOURCED_SIMULATED_GPUS=3 RESOURCED_RUNTIME_DIR={run} "
        f"RESOURCED_STATE_DIR={tmp_path}/state XDG_CONFIG_HOME={tmp_path}/config "
        f"{sys.executable} -m resourced.daemon --session\n")
    with PrivateBus(servicedirs=(services,)) as bus:
        monkeypatch.setenv("DBUS_SESSION_BUS_ADDRESS", bus.address)
        monkeypatch.setenv("DBUS_SYSTEM_BUS_ADDRESS", "unix:path=/nonexistent/system_bus_socket")
        monkeypatch.delenv("RESOURCED_BUS", raising=False)
        r = gpuctl("free", "--json", timeout=30)
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["free"] == 3
