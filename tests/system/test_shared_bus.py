"""A shared bus without root (``resourced --shared DIR --group G``), with real users: dave
hosts it (an ordinary account), alice is a member of G, bob is not.

| who         | reach the bus | claim, run, book | release another's claim | own org.resourced |
|-------------|---------------|------------------|-------------------------|-------------------|
| dave (host) | yes           | yes              | yes                     | yes               |
| alice       | yes           | yes              | 8                       | refused by the bus|
| bob         | 8 (the dir)   | -                | -                       | -                 |

The daemon is started as dave by the test, with no privilege at all; its bus runs as its
child. Everything runs in the rig of conftest (users made and removed, files put back).
"""

import grp
import json
import os
import signal
from pathlib import Path

import pytest

from .conftest import ACCESS_GROUP, BUS_NAME, MANAGER_IFACE, MANAGER_PATH, NGPUS, ok, refused

EXIT_NAME_TAKEN, EXIT_UNREACHABLE, EXIT_ACCESS_DENIED = 3, 5, 8
REQUEST_NAME = """\
import sys
from jeepney.bus_messages import message_bus
from jeepney.io.blocking import open_dbus_connection
conn = open_dbus_connection(sys.argv[1])
reply = conn.send_and_get_reply(message_bus.RequestName("org.resourced", 4), timeout=10)
print(reply.header.fields.get(4) or reply.body[0])
"""


class Host:
    """dave's shared resourced: its directory, how to start it, and the users' side."""

    def __init__(self, rig):
        self.rig = rig
        self.home = rig.dir / "shared-host"
        self.dir = self.home / "gpus"
        self.address = f"unix:path={self.dir}/bus"
        dave = rig.users["dave"]
        self.home.mkdir(mode=0o755)
        (self.home / "run").mkdir(mode=0o700)  # as logind's XDG_RUNTIME_DIR
        for path in (self.home, self.home / "run"):
            os.chown(path, dave.pw_uid, dave.pw_gid)
        for key in ("dave", "alice", "bob"):
            config = rig.dir / f"shared-config-{key}"
            config.mkdir(mode=0o700)
            os.chown(config, rig.users[key].pw_uid, rig.users[key].pw_gid)

    def start(self, name: str = "shared-resourced"):
        home = str(self.home)
        env = {"PATH": f"{self.rig.venv}/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": home,
               "XDG_RUNTIME_DIR": f"{home}/run", "XDG_STATE_HOME": f"{home}/state",
               "XDG_CONFIG_HOME": f"{home}/config",
               "RESOURCED_SIMULATED_GPUS": str(NGPUS), "PYTHONUNBUFFERED": "1"}
        return self.rig._spawn(name, [*self.rig._as_user("dave"), str(self.rig.venv / "bin/python"),
                                      "-m", "resourced.daemon", "--shared", str(self.dir),
                                      "--group", ACCESS_GROUP], env=env)

    def wait_up(self, timeout: float = 30) -> None:
        self.rig.wait_for(lambda: self.gpuctl("dave", "free").returncode == 0, timeout,
                          "the shared daemon", proc="shared-resourced")

    def env(self, key: str) -> dict[str, str]:
        """A user whose gpuctl finds the shared bus through `gpuctl connect`."""
        return {"XDG_CONFIG_HOME": str(self.rig.dir / f"shared-config-{key}")}

    def gpuctl(self, key: str, *args, address: str | None = None):
        env = self.env(key) | {"RESOURCED_BUS_ADDRESS": address or self.address}
        return self.rig.gpuctl(key, *args, env=env, timeout=30)

    def claims(self) -> dict[str, dict]:
        return {c["id"]: c for c in json.loads(ok(self.gpuctl("dave", "status", "--json")))["claims"]}

    def bus_pid(self) -> int:
        daemon = self.rig.procs["shared-resourced"].pid
        children = Path(f"/proc/{daemon}/task/{daemon}/children").read_text().split()
        (pid,) = [int(c) for c in children if Path(f"/proc/{c}/comm").read_text().strip() == "dbus-daemon"]
        return pid


@pytest.fixture(scope="module")
def host(rig):
    host = Host(rig)
    host.start()
    host.wait_up()
    yield host
    rig._stop("shared-resourced")


@pytest.fixture
def released(host):
    """Each test starts and ends with no claims on the shared daemon (the host releases)."""
    def release_all():
        for ref in host.claims():
            ok(host.gpuctl("dave", "release", "--force", "--allocation", ref))

    release_all()
    yield
    release_all()


def test_the_host_runs_it_without_privilege_and_the_directory_keeps_outsiders_out(host):
    info = host.dir.stat()
    assert (info.st_mode & 0o777, info.st_uid) == (0o750, host.rig.uid("dave"))
    assert info.st_gid == grp.getgrnam(ACCESS_GROUP).gr_gid
    status = json.loads(ok(host.gpuctl("dave", "status", "--json")))
    assert len(status["gpus"]) == NGPUS


def test_a_member_connects_once_then_claims_runs_and_releases_with_plain_gpuctl(host, released):
    rig = host.rig
    connected = json.loads(ok(rig.gpuctl("alice", "connect", host.dir, "--json",
                                         env=host.env("alice"))))
    assert connected["host"] == rig.login("dave") and connected["gpu_count"] == NGPUS
    ref = ok(rig.gpuctl("alice", "claim", "--gpus", 1, "--owner-pid", rig.sleepers["alice"],
                        env=host.env("alice"))).strip()
    assert host.claims()[ref]["user"] == rig.login("alice")
    run = rig.gpuctl("alice", "run", "--gpus", 1, "--", "sh", "-c", "echo $CUDA_VISIBLE_DEVICES",
                     env=host.env("alice"))
    assert ok(run).strip().startswith("GPU-")
    ok(rig.gpuctl("alice", "release", "--allocation", ref, env=host.env("alice")))
    assert host.claims() == {}
    ok(rig.gpuctl("alice", "connect", "--forget", env=host.env("alice")))


def test_a_member_claims_and_releases_with_busctl(host, released):
    rig = host.rig
    busctl = ["busctl", f"--address={host.address}", "--json=short", "call", BUS_NAME,
              MANAGER_PATH, MANAGER_IFACE]
    reply = json.loads(ok(rig.run_as("alice", [*busctl, "Claim", "ua{sv}", "1", "1", "OwnerPID",
                                               "u", str(rig.sleepers["alice"])])))
    ref = reply["data"][0]
    assert host.claims()[ref]["user"] == rig.login("alice")
    ok(rig.run_as("alice", [*busctl, "Release", "st", ref, "0"]))
    assert ref not in host.claims()


def test_an_outsider_is_refused_at_the_directory(host):
    cp = host.gpuctl("bob", "status")
    refused(cp, EXIT_ACCESS_DENIED)
    assert "permission denied" in cp.stderr and ACCESS_GROUP in cp.stderr
    cp = host.rig.run_as("bob", ["busctl", f"--address={host.address}", "list"])
    assert cp.returncode != 0 and "ermission denied" in cp.stderr


def test_a_member_cannot_release_the_hosts_claim_and_the_host_can_release_the_members(host,
                                                                                     released):
    rig = host.rig
    daves = ok(host.gpuctl("dave", "claim", "--gpus", 1, "--owner-pid", rig.sleepers["dave"])).strip()
    alices = ok(host.gpuctl("alice", "claim", "--gpus", 1, "--owner-pid",
                            rig.sleepers["alice"])).strip()
    cp = host.gpuctl("alice", "release", "--force", "--allocation", daves)
    refused(cp, EXIT_ACCESS_DENIED)
    assert "host account" in cp.stderr
    assert daves in host.claims()
    ok(host.gpuctl("dave", "release", "--allocation", alices))
    assert set(host.claims()) == {daves}


def test_a_client_refuses_a_bus_whose_service_belongs_to_someone_else(host):
    """alice's own directory with a link to dave's bus: the service is not hers, so not
    to be trusted there (it stands for someone taking the name of a stopped service)."""
    rig = host.rig
    mine = rig.dir / "alices-bus"
    mine.mkdir(mode=0o755)
    os.chown(mine, rig.uid("alice"), -1)
    (mine / "bus").symlink_to(host.dir / "bus")
    cp = host.gpuctl("alice", "status", address=f"unix:path={mine}/bus")
    refused(cp, EXIT_ACCESS_DENIED)
    assert "not trusting it" in cp.stderr and rig.login("dave") in cp.stderr


def test_a_second_host_of_the_same_directory_refuses_to_start(host):
    second = host.start("shared-resourced-2")
    assert second.wait(30) == EXIT_NAME_TAKEN
    assert "already hosted" in host.rig.log("shared-resourced-2")
    ok(host.gpuctl("dave", "free"))  # the first one still serves


def test_a_killed_bus_is_started_again_and_clients_reconnect_and_claims_survive(host, released):
    rig = host.rig
    ref = ok(host.gpuctl("alice", "claim", "--gpus", 1, "--owner-pid",
                         rig.sleepers["alice"])).strip()
    old = host.bus_pid()
    os.kill(old, signal.SIGKILL)
    rig.wait_for(lambda: host.gpuctl("alice", "free").returncode == 0, 15,
                 "the shared bus again", proc="shared-resourced")
    assert host.bus_pid() != old
    assert ref in host.claims()
    assert "started it again" in rig.log("shared-resourced")


def test_with_the_daemon_down_nobody_else_takes_the_name_and_clients_say_it_is_down(host):
    rig = host.rig
    rig._stop("shared-resourced")
    try:
        cp = host.gpuctl("alice", "status")
        refused(cp, EXIT_UNREACHABLE)
        assert "resourced --shared" in cp.stderr
        # The bus alone, as its host would leave it under a socket unit: the policy still
        # gives the name to dave only.
        bus = rig._spawn("shared-bus-alone", [*rig._as_user("dave"), "dbus-daemon",
                                              f"--config-file={host.dir}/bus.conf", "--nofork"],
                         env={"PATH": "/usr/bin:/bin"})
        rig.wait_for(lambda: (host.dir / "bus").exists(), 10, "the bus alone")
        request = [str(rig.venv / "bin/python"), "-c", REQUEST_NAME, host.address]
        assert "AccessDenied" in rig.run_as("alice", request).stdout
        cp = host.gpuctl("alice", "status")
        refused(cp, EXIT_UNREACHABLE)
        assert "not running" in cp.stderr
        rig._stop("shared-bus-alone")
        assert bus.poll() is not None
    finally:
        host.start()
        host.wait_up()


def test_the_host_finds_it_through_connect_too(host):
    rig = host.rig
    ok(rig.gpuctl("dave", "connect", host.dir, env=host.env("dave")))
    assert ok(rig.gpuctl("dave", "free", env=host.env("dave"))).strip() == str(NGPUS)
    ok(rig.gpuctl("dave", "connect", "--forget", env=host.env("dave")))
    cp = rig.gpuctl("dave", "free", "--bus", "shared", env=host.env("dave"))
    refused(cp, EXIT_UNREACHABLE)
    assert "gpuctl connect DIR" in cp.stderr
