"""Installing over the predecessor (a socket daemon also called resourced, with gpuctl):
its documented configuration, commands, unit name and agent templates keep working."""

import textwrap

from resourced.backends.simulated import simulated_uuid

from ..conftest import gpuctl

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
