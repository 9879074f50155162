"""Which bus a client uses (resourced.client.discovery): the one order, how a shared bus is
found and trusted; and the daemon's --shared options."""

import os
from pathlib import Path

import pytest

from resourced.client import discovery
from resourced.client import discovery as shared_address
from resourced.daemon.main import parse_args
from resourced.errors import AccessDenied, DaemonUnreachable, InvalidArgs


def env(tmp_path, **more):
    return {"XDG_CONFIG_HOME": str(tmp_path / "config"), "HOME": str(tmp_path), **more}


def test_a_named_bus_comes_first_then_the_variable(tmp_path):
    e = env(tmp_path, RESOURCED_BUS="system")
    discovery.write_connection(tmp_path, e)
    assert discovery.preset_bus("session", e) == "session"
    assert discovery.preset_bus(None, e) == "system"


def test_then_the_shared_bus_this_account_is_connected_to(tmp_path):
    e = env(tmp_path)
    assert discovery.preset_bus(None, e) is None   # the session bus is asked
    discovery.write_connection(tmp_path, e)
    assert discovery.preset_bus(None, e) == "shared"


def test_the_session_bus_serves_where_the_daemon_runs_or_can_start():
    assert discovery.serves(True, [])
    assert discovery.serves(False, ["org.freedesktop.DBus", "org.resourced"])
    assert not discovery.serves(False, ["org.freedesktop.Notifications"])


def test_a_bus_with_another_name_is_refused(tmp_path):
    with pytest.raises(InvalidArgs, match="'session', 'system' or 'shared'"):
        discovery.named_bus(None, env(tmp_path, RESOURCED_BUS="sesion"))


def test_connect_writes_what_the_client_reads_back(tmp_path):
    e = env(tmp_path)
    assert not shared_address.configured(e) and shared_address.connected_dir(e) is None
    path = shared_address.write_connection(tmp_path / 'a "quoted" dir', e)
    assert path == tmp_path / "config/resourced/client.toml"
    assert shared_address.configured(e)
    assert shared_address.connected_dir(e) == str(tmp_path / 'a "quoted" dir')


def test_the_target_is_the_recorded_directory_hosted_by_its_owner(tmp_path):
    e = env(tmp_path)
    shared_address.write_connection(tmp_path, e)
    target = shared_address.target(e)
    assert target == (f"unix:path={tmp_path}/bus", str(tmp_path), os.stat(tmp_path).st_uid)


def test_the_address_variable_wins_and_names_the_directory(tmp_path):
    e = env(tmp_path, RESOURCED_BUS_ADDRESS=f"unix:path={tmp_path}/bus")
    shared_address.write_connection(tmp_path / "elsewhere", e)
    assert shared_address.target(e).directory == str(tmp_path)


@pytest.mark.parametrize("address", ["tcp:host=localhost,port=1", "unix:abstract=x"])
def test_only_a_socket_path_is_a_shared_bus(tmp_path, address):
    with pytest.raises(DaemonUnreachable, match="unix:path="):
        shared_address.target(env(tmp_path, RESOURCED_BUS_ADDRESS=address))


def test_without_a_setting_the_message_says_how_to_make_one(tmp_path):
    with pytest.raises(DaemonUnreachable, match="gpuctl connect DIR"):
        shared_address.target(env(tmp_path))


def test_a_broken_client_file_is_reported_not_a_traceback(tmp_path):
    e = env(tmp_path)
    path = Path(shared_address.client_file(e))
    path.parent.mkdir(parents=True)
    path.write_text("shared_dir = [unclosed\n")
    with pytest.raises(DaemonUnreachable, match="not valid TOML"):
        shared_address.connected_dir(e)


@pytest.mark.parametrize("exc, kind, words", [
    (PermissionError(13, "Permission denied"), AccessDenied, "only members of"),
    (ConnectionRefusedError(111, "Connection refused"), DaemonUnreachable, "is down"),
    (FileNotFoundError(2, "No such file"), DaemonUnreachable, "no shared bus runs"),
    (ConnectionResetError(104, "reset"), AccessDenied, "refused this account"),
])
def test_each_failure_to_connect_says_what_happened(tmp_path, exc, kind, words):
    target = shared_address.SharedTarget(f"unix:path={tmp_path}/bus", tmp_path, os.getuid())
    error = shared_address.unreachable(target, exc)
    assert isinstance(error, kind) and words in str(error)


def test_a_service_owned_by_anyone_but_the_host_is_not_trusted(tmp_path):
    target = shared_address.SharedTarget(f"unix:path={tmp_path}/bus", tmp_path, 1500)
    shared_address.check_host(target, 1500)
    with pytest.raises(AccessDenied, match="not trusting it"):
        shared_address.check_host(target, 1600)


def test_the_daemon_options_for_a_shared_bus():
    args = parse_args(["--shared", "/srv/lab", "--group", "lab"])
    assert (args.mode, args.shared, args.group) == ("shared", "/srv/lab", "lab")
    assert parse_args([]).mode is None  # settled by the config: shared_dir, else session


@pytest.mark.parametrize("argv", [["--system", "--group", "lab"], ["--shared", "/x", "--replace"],
                                  ["--session", "--shared", "/x"]])
def test_the_daemon_refuses_shared_options_that_do_not_go_together(argv, capsys):
    with pytest.raises(SystemExit) as exit_:
        parse_args(argv)
    assert exit_.value.code == 2
