"""Installing over the predecessor (a socket daemon also called resourced, with gpuctl):
its documented configuration, commands, unit name and agent templates keep working."""

import os
import socket
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

from resourced.backends.simulated import simulated_uuid

from ..conftest import gpuctl

ROOT = Path(__file__).resolve().parents[2]

# The [daemon] table and the [[gpu]] and [[check]] entries as the predecessor's README
# prints them, with real values where it prints placeholders ("...").
PREDECESSOR_CONFIG = textwrap.dedent("""\
    [daemon]
    runtime_dir = "{runtime_dir}"        # default: $XDG_RUNTIME_DIR/resourced (system unit: /run/resourced)
    socket_group = "gpuusers"  # shared installs: group allowed to use the socket
    sample_interval = 30       # seconds between resource samples
    probe_timeout = 10         # seconds before nvidia-smi / a disk probe counts as failed
    nvidia_smi = "nvidia-smi"

    [[gpu]]                    # only listed GPUs are managed
    uuid = "{uuid}"           # authoritative
    alias = "gpu0"             # optional, default gpuN
    index = 0                  # optional display hint

    [[check]]
    name = "ram"
    type = "ram"               # or "disk" (then also: path = "/some/mount")
    warn_free_pct = 15         # any of warn_/stop_ free_gib, free_pct, used_pct
    stop_free_pct = 10
    """)


def _predecessor_config(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text(PREDECESSOR_CONFIG.format(runtime_dir=tmp_path / "run",
                                              uuid=simulated_uuid(0)))
    return path


def test_the_predecessors_config_passes_check_and_says_what_changed(tmp_path):
    path = _predecessor_config(tmp_path)
    r = gpuctl("config", "check", str(path))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == f"{path}: ok"
    assert f"{path}: note: daemon.socket_group is read as daemon.access_group, the name it " \
           "has now" in lines
    assert any(line.startswith(f"{path}: note: daemon.nvidia_smi is not used: ")
               for line in lines)
    assert len(lines) == 3


def test_the_daemon_starts_on_the_predecessors_config(tmp_path, start_daemon):
    path = _predecessor_config(tmp_path)
    d = start_daemon(args=("--config", str(path)))
    r = gpuctl("status", "--json")
    assert r.returncode == 0, r.stderr
    assert '"gpu0"' in r.stdout
    assert "daemon.socket_group is read as daemon.access_group" in d.log()
    assert "daemon.nvidia_smi is not used" in d.log()


@pytest.fixture
def refused_socket(tmp_path):
    """A listening bus socket this test's processes may not open, as a sandbox refuses
    one: mode 000, and for root, no capability that overrides file modes."""
    path = tmp_path / "bus"
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(path))
    sock.listen()
    path.chmod(0)
    yield path
    sock.close()


def _refused_run(args, socket_path):
    prefix = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--"] \
        if os.geteuid() == 0 else []
    address = f"unix:path={socket_path}"
    env = {**os.environ, "DBUS_SESSION_BUS_ADDRESS": address, "DBUS_SYSTEM_BUS_ADDRESS": address}
    env.pop("RESOURCED_BUS", None)
    return subprocess.run([*prefix, sys.executable, *args], env=env, capture_output=True,
                          text=True, timeout=30, check=False)


@pytest.mark.parametrize("bus", [None, "session", "system"])
def test_a_refused_bus_socket_is_named_with_the_sandbox_setting(refused_socket, bus):
    r = _refused_run(["-m", "resourced.cli", "status", *(["--bus", bus] if bus else [])],
                     refused_socket)
    assert r.returncode == 8, r.stderr
    said = bus or "session"  # looking for a daemon, the session bus was refused first
    assert r.stderr == (
        f"gpuctl: cannot connect to the {said} bus socket {refused_socket} (permission "
        "denied): a coding agent's sandbox blocks it: run GPU jobs through resourced-mcp, "
        "which runs outside the sandbox (its run tool), or allow connecting to the socket "
        "(Codex: network_access = true under [sandbox_workspace_write] in "
        "~/.codex/config.toml); see \"Sandboxed coding agents\" in docs/how-to/agents.md\n")


def test_the_asyncio_client_says_the_same(refused_socket):
    script = ("import asyncio, resourced\n"
              "async def main():\n"
              "    try:\n"
              "        async with resourced.AsyncClient() as c:\n"
              "            await c.status()\n"
              "    except resourced.ResourcedError as exc:\n"
              "        print(exc.code, exc)\n"
              "asyncio.run(main())\n")
    r = _refused_run(["-c", script], refused_socket)
    assert r.stdout.startswith(f"AccessDenied cannot connect to the session bus socket "
                               f"{refused_socket} (permission denied): a coding agent's "
                               "sandbox"), r.stdout + r.stderr


def test_agent_instructions_keeps_the_predecessors_name():
    old, new = gpuctl("agent-instructions"), gpuctl("agent", "instructions")
    assert old.returncode == 0 and old.stdout == new.stdout
    assert old.stdout.startswith("# Using the GPUs of this machine through resourced\n")


@pytest.mark.slow
def test_both_agent_templates_ship_in_the_wheel_and_are_printed(tmp_path):
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w",
                            str(tmp_path), str(ROOT)], capture_output=True, text=True,
                           timeout=300, check=False)
    assert built.returncode == 0, built.stderr
    [wheel] = tmp_path.glob("resourced-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    for option, name in (("--host", "HOST_AGENTS.md"), ("--project", "PROJECT_AGENTS.md")):
        assert f"resourced/cli/agent_templates/{name}" in names
        template = (ROOT / "resourced/cli/agent_templates" / name).read_text()
        printed = gpuctl("agent", "instructions", option)
        assert printed.returncode == 0 and printed.stdout.startswith(template)
    host = gpuctl("agent", "instructions", "--host").stdout
    assert host.endswith(gpuctl("agent", "instructions").stdout)  # the rules follow the baseline
