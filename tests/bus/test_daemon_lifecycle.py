"""The daemon's life on the bus (one owner of org.resourced, --replace, SIGTERM) and gpuctl's
own edges: no daemon, help and version without the bus libraries, an example in every help."""

import json
import re
import signal
import subprocess
import sys

import pytest
from jeepney import DBusAddress, new_method_call
from jeepney.io.blocking import open_dbus_connection

from resourced.client.sync import Client

from ..conftest import eventually, gpuctl

_DBUS = DBusAddress("/org/freedesktop/DBus", bus_name="org.freedesktop.DBus",
                    interface="org.freedesktop.DBus")


def bus_call(address: str, method: str, signature: str, *body):
    conn = open_dbus_connection(address)
    try:
        reply = conn.send_and_get_reply(new_method_call(_DBUS, method, signature, body), timeout=10)
    finally:
        conn.close()
    return reply.body[0]


def name_owner_pid(address: str) -> int | None:
    if not bus_call(address, "NameHasOwner", "s", "org.resourced"):
        return None
    return bus_call(address, "GetConnectionUnixProcessID", "s", "org.resourced")


def assert_one_gpuctl_line(stderr: str) -> None:
    lines = stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpuctl: "), stderr
    assert "Traceback" not in stderr


def test_a_second_daemon_exits_because_the_name_is_owned(start_daemon):
    first = start_daemon()

    second = start_daemon(wait=False)

    assert second.proc.wait(timeout=15) != 0
    assert "org.resourced is already owned" in second.log()
    assert first.proc.poll() is None
    assert name_owner_pid(first.bus.address) == first.proc.pid


def test_a_second_daemon_on_the_same_runtime_dir_says_the_name_is_owned(start_daemon, tmp_path):
    first = start_daemon(runtime_dir=tmp_path / "run")

    second = start_daemon(runtime_dir=tmp_path / "run", wait=False)

    assert second.proc.wait(timeout=15) != 0
    assert "org.resourced is already owned" in second.log()
    assert name_owner_pid(first.bus.address) == first.proc.pid


def test_replace_takes_over_and_the_first_daemon_exits(start_daemon):
    first = start_daemon()

    second = start_daemon(args=["--replace"], wait=False)

    assert first.proc.wait(timeout=15) == 0
    assert "taken over" in first.log()
    second.wait_ready()
    assert name_owner_pid(second.bus.address) == second.proc.pid
    assert gpuctl("free").stdout == "4\n"


def test_replace_takes_over_a_daemon_on_the_same_runtime_dir(start_daemon, tmp_path):
    first = start_daemon(runtime_dir=tmp_path / "run")

    second = start_daemon(args=["--replace"], runtime_dir=tmp_path / "run", wait=False)

    eventually(lambda: first.proc.poll() is not None or second.proc.poll() is not None, timeout=15)
    assert second.proc.poll() is None, second.log()
    assert first.proc.wait(timeout=15) == 0
    second.wait_ready()
    assert name_owner_pid(second.bus.address) == second.proc.pid


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_daemon_exits_0_on_a_stop_signal(start_daemon, signum):
    d = start_daemon()
    with Client() as c:
        c.claim(mode="dev", gpus=1, owner_pid=d.proc.pid)

    d.proc.send_signal(signum)

    assert d.proc.wait(timeout=15) == 0
    assert "Traceback" not in d.log()
    eventually(lambda: name_owner_pid(d.bus.address) is None)


@pytest.mark.parametrize("args", [["status"], ["free"], ["claim", "--owner-pid", "1"],
                                  ["release", "--allocation", "cabc"], ["run", "--", "true"]],
                         ids=lambda a: a[0])
def test_gpuctl_without_a_daemon_exits_5(private_bus, monkeypatch, tmp_path, args):
    for name, value in private_bus.env().items():
        monkeypatch.setenv(name, value)
    # Daemons of earlier tests are stopped by then; the bus may take a moment to notice.
    eventually(lambda: name_owner_pid(private_bus.address) is None)
    marker = tmp_path / "ran"

    r = gpuctl(*args, *(["touch", str(marker)] if args[0] == "run" else []))

    assert (r.returncode, r.stdout) == (5, "")
    assert_one_gpuctl_line(r.stderr)
    assert not marker.exists()


BUS_LIBRARIES = ("dbus_fast", "jeepney", "asyncio")
IMPORT_PROBE = """
import json, sys
from resourced.cli import main
code = main(sys.argv[1:])
loaded = sorted({m.split(".")[0] for m in sys.modules} & set(%r))
print("PROBE " + json.dumps({"code": code, "loaded": loaded}))
""" % (BUS_LIBRARIES,)


def _subcommands() -> list[str]:
    """The subcommands `gpuctl --help` lists."""
    text = gpuctl("--help").stdout
    section = text.split("\nCommands:\n", 1)[1]
    return [m.group(1) for m in re.finditer(r"^  (\S+)", section, re.M)]


@pytest.mark.parametrize("argv", [["--help"], ["--version"], ["-h"]])
def test_help_and_version_load_no_bus_library(argv):
    r = subprocess.run([sys.executable, "-c", IMPORT_PROBE, *argv], capture_output=True,
                       text=True, timeout=30)
    [probe] = [line for line in r.stdout.splitlines() if line.startswith("PROBE ")]
    assert json.loads(probe[len("PROBE "):]) == {"code": 0, "loaded": []}, r.stderr


def test_subcommand_help_loads_no_bus_library():
    for name in _subcommands():
        r = subprocess.run([sys.executable, "-c", IMPORT_PROBE, name, "--help"],
                           capture_output=True, text=True, timeout=30)
        [probe] = [line for line in r.stdout.splitlines() if line.startswith("PROBE ")]
        assert json.loads(probe[len("PROBE "):]) == {"code": 0, "loaded": []}, (name, r.stderr)


def test_version_prints_the_version():
    r = gpuctl("--version")
    assert (r.returncode, r.stderr) == (0, "")
    assert re.fullmatch(r"gpuctl, version \d+\.\d+\.\d+\S*\n", r.stdout)


def test_every_help_ends_its_text_with_an_example():
    names = _subcommands()
    assert {"run", "claim", "release", "env", "status", "free"} <= set(names)
    for argv in [[], *([name] for name in names)]:
        r = gpuctl(*argv, "--help")
        assert (r.returncode, r.stderr) == (0, ""), argv
        description = r.stdout.split("\nOptions:\n", 1)[0].rstrip()
        last_paragraph = description.split("\n\n")[-1].strip()
        assert last_paragraph.startswith("Example: "), (argv, r.stdout)
