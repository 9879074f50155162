"""gpuctl service enable/disable: dry runs, staging under --root, and the run without systemd."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from resourced.cli import main
from resourced.cli import service as service_cli
from resourced.linux import install

ROOT = Path(__file__).resolve().parents[2]


def gpuctl(*args, home: Path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("XDG_")}
    env["HOME"] = str(home)
    return subprocess.run([sys.executable, "-m", "resourced.cli", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)


def _tree(path: Path) -> list[Path]:
    return sorted(p for p in path.rglob("*"))


@pytest.fixture
def home(tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    for name in ("XDG_CONFIG_HOME", "XDG_DATA_HOME"):
        monkeypatch.delenv(name, raising=False)
    return home


def test_dry_run_prints_every_file_and_command_and_writes_nothing(home):
    done = gpuctl("service", "enable", "--user", "--dry-run", home=home)

    assert done.returncode == 0, done.stderr
    plan = install.plan_enable("user", sys.executable, env={"HOME": str(home)})
    for f in plan.write:
        assert f"--- write {f.path} (mode 0644)\n{f.content}" in done.stdout
    for cmd in plan.commands:
        assert f"--- run: {' '.join(cmd)}\n" in done.stdout
    assert done.stdout.endswith("--- dry run: nothing was changed\n")
    assert _tree(home) == []


def test_system_dry_run_under_a_root_writes_nothing(tmp_path, home):
    done = gpuctl("service", "enable", "--system", "--dry-run", "--root", str(tmp_path / "r"),
                  "--config", "/etc/resourced/gpus.toml", home=home)

    assert done.returncode == 0, done.stderr
    assert f"--- write {tmp_path}/r/etc/systemd/system/resourced.service (mode 0644)\n" \
        in done.stdout
    assert "--config /etc/resourced/gpus.toml\n" in done.stdout
    assert "--- run: systemctl enable --now resourced.service\n" in done.stdout
    assert not (tmp_path / "r").exists()


def test_enable_under_root_stages_the_files_and_runs_nothing(tmp_path, home):
    root = tmp_path / "stage"
    done = gpuctl("service", "enable", "--user", "--root", str(root), home=home)

    assert done.returncode == 0, done.stderr
    plan = install.plan_enable("user", sys.executable, root=root, env={"HOME": str(home)})
    assert _tree(root / str(home).lstrip("/") / ".config") != []
    for f in plan.write:
        assert f.path.read_text() == f.content
        assert f.path.stat().st_mode & 0o777 == 0o644
        assert f"wrote {f.path}\n" in done.stdout
    assert done.stdout.endswith(
        "not run (--root): systemctl --user daemon-reload && "
        "systemctl --user enable --now resourced.service resourced-runner.service\n")
    assert not [p for p in _tree(root) if p.name.startswith(".resourced")]  # no temp files left

    done = gpuctl("service", "disable", "--user", "--root", str(root), home=home)
    assert done.returncode == 0, done.stderr
    assert not any(f.path.exists() for f in plan.write)
    assert [p for p in _tree(root) if p.is_file()] == []


@pytest.mark.parametrize("args", [[], ["--user", "--system"]])
def test_exactly_one_mode_is_required(home, args):
    done = gpuctl("service", "enable", "--dry-run", *args, home=home)
    assert done.returncode == 2
    assert done.stderr.startswith("gpuctl: choose one of --user or --system")
    assert done.stderr.count("\n") == 1


@pytest.mark.parametrize("args", [["service"], ["service", "enable"], ["service", "disable"]])
def test_help_ends_with_an_example(home, args):
    done = gpuctl(*args, "--help", home=home)
    assert done.returncode == 0
    assert "Example: " in done.stdout
    assert "--root" not in done.stdout


def test_each_example_of_enable_is_a_line_of_its_own(home):
    done = gpuctl("service", "enable", "--help", home=home)
    examples = [line.strip() for line in done.stdout.splitlines() if "Example: " in line]
    assert examples == [
        "Example: sudo /opt/resourced/bin/gpuctl service enable --system",
        "Example: gpuctl service enable --user --shared /srv/gpu-lab/resourced --group gpu-lab"]


def test_the_service_commands_import_no_bus_library():
    code = ("import sys, resourced.cli.service; "
            "print(sorted(m for m in ('dbus_fast', 'jeepney') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, check=True)
    assert done.stdout == "[]\n"


# In process, with systemd's presence and the commands injected.

@pytest.fixture
def commands(monkeypatch, tmp_path):
    """Record the commands instead of running them; each answers with ``results[cmd]``."""
    ran, results = [], {}

    def fake_run(cmd, **kwargs):
        ran.append(tuple(cmd))
        code, stderr = results.get(tuple(cmd), (0, ""))
        return subprocess.CompletedProcess(cmd, code, "", stderr)

    monkeypatch.setattr(service_cli.subprocess, "run", fake_run)
    monkeypatch.setattr(service_cli, "LINGER_DIR", tmp_path / "linger")
    return ran, results


def _systemd(monkeypatch, tmp_path, running: bool) -> None:
    runtime = tmp_path / "run-systemd-system"
    if running:
        runtime.mkdir()
    monkeypatch.setattr(service_cli, "SYSTEMD_RUNTIME", runtime)


def test_without_systemd_enable_writes_the_files_and_exits_10(
        monkeypatch, tmp_path, home, commands, capsys):
    _systemd(monkeypatch, tmp_path, running=False)

    assert main(["service", "enable", "--user"]) == service_cli.EXIT_NO_SYSTEMD == 10

    out, err = capsys.readouterr()
    plan = install.plan_enable("user", sys.executable)
    assert all(f.path.read_text() == f.content for f in plan.write)
    assert commands[0] == []
    assert err == (
        f"gpuctl: systemd is not running (no {tmp_path}/run-systemd-system), so "
        "resourced.service was not started (the files are written); once it runs: "
        "systemctl --user daemon-reload && systemctl --user enable --now resourced.service "
        "resourced-runner.service\n")


def test_without_systemd_disable_removes_the_files_and_exits_10(
        monkeypatch, tmp_path, home, commands, capsys):
    _systemd(monkeypatch, tmp_path, running=False)
    main(["service", "enable", "--user"])
    capsys.readouterr()

    assert main(["service", "disable", "--user"]) == 10
    _, err = capsys.readouterr()
    assert not any(f.path.exists() for f in install.plan_enable("user", sys.executable).write)
    assert err.startswith("gpuctl: systemd is not running") and err.count("\n") == 1
    assert commands[0] == []


def test_with_systemd_enable_writes_then_runs_each_command(
        monkeypatch, tmp_path, home, commands, capsys):
    _systemd(monkeypatch, tmp_path, running=True)
    monkeypatch.chdir(tmp_path)
    Path("gpus.toml").write_text("")  # enable checks the config the unit will name

    assert main(["service", "enable", "--user", "--config", "gpus.toml"]) == 0

    out, err = capsys.readouterr()
    plan = install.plan_enable("user", sys.executable, str(Path("gpus.toml").absolute()))
    assert all(f.path.read_text() == f.content for f in plan.write)
    assert commands[0] == list(plan.commands)
    assert out.endswith("resourced.service is enabled and running\n")
    assert "sudo loginctl enable-linger" in err  # lingering is off in the fake linger dir


def test_with_systemd_disable_stops_the_unit_before_removing_it(
        monkeypatch, tmp_path, home, commands, capsys):
    _systemd(monkeypatch, tmp_path, running=True)
    main(["service", "enable", "--user"])
    ran, _ = commands
    ran.clear()
    unit = install.plan_disable("user").unit_path

    def stop_sees_the_unit(cmd, **kwargs):
        ran.append((tuple(cmd), unit.exists()))
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(service_cli.subprocess, "run", stop_sees_the_unit)
    assert main(["service", "disable", "--user"]) == 0
    assert ran == [
        (("systemctl", "--user", "disable", "--now", "resourced.service",
          "resourced-runner.service", "resourced-notify.service"), True),
        (("systemctl", "--user", "daemon-reload"), False),
    ]
    assert not unit.exists()

    ran.clear()  # not installed: nothing to stop, the reload still runs
    assert main(["service", "disable", "--user"]) == 0
    assert ran == [(("systemctl", "--user", "daemon-reload"), False)]


def test_a_failing_command_ends_with_its_reason_on_one_line(
        monkeypatch, tmp_path, home, commands, capsys):
    _systemd(monkeypatch, tmp_path, running=True)
    ran, results = commands
    results[("systemctl", "--user", "daemon-reload")] = (
        1, "warning\nFailed to connect to bus: No medium found\n")

    assert main(["service", "enable", "--user"]) == 1

    _, err = capsys.readouterr()
    assert err == ("gpuctl: systemctl --user daemon-reload failed (exit 1): "
                   "Failed to connect to bus: No medium found\n")
    assert ran == [("systemctl", "--user", "daemon-reload")]  # enable never ran


def test_enable_refuses_a_config_file_the_service_could_not_start_with(tmp_path, home):
    missing = tmp_path / "nowhere.toml"
    done = gpuctl("service", "enable", "--user", "--config", str(missing), home=home)
    assert done.returncode == 2
    assert done.stderr == (f"gpuctl: {missing}: no such file; the service would fail at once: "
                           f"write it first (`gpuctl init -o {missing}` lists this machine's "
                           "GPUs), or name another with --config\n")
    assert _tree(home) == []  # nothing written, nothing started

    bad = tmp_path / "bad.toml"
    bad.write_text("[daemon]\nprobe_timeout = -1\n")
    done = gpuctl("service", "enable", "--user", "--config", str(bad), home=home)
    assert done.returncode == 2 and "daemon.probe_timeout" in done.stderr


def test_a_dry_run_only_warns_of_a_missing_config(tmp_path, home):
    missing = tmp_path / "nowhere.toml"
    done = gpuctl("service", "enable", "--system", "--dry-run", "--config", str(missing),
                  home=home)
    assert done.returncode == 0
    assert done.stderr.startswith(f"gpuctl: warning: {missing}: no such file; the service "
                                  "would fail at once: write it first (`sudo gpuctl init --system`")
