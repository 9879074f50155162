"""gpuctl config check, run as a real process."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ..conftest import gpuctl

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "config.toml"


@pytest.fixture
def home(tmp_path):
    """An environment with no config file anywhere the user could have one."""
    home = tmp_path / "home"
    home.mkdir()
    return {"HOME": str(home), "XDG_CONFIG_HOME": str(tmp_path / "xdg")}


def check(*args, env=None):
    return gpuctl("config", "check", *args, env=env)


def assert_one_error_line(result, *fragments):
    assert result.returncode == 2, result
    assert result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith("gpuctl: ")
    assert "Traceback" not in result.stderr
    for fragment in fragments:
        assert fragment in result.stderr


def test_the_example_is_ok():
    result = check(str(EXAMPLE))
    assert (result.returncode, result.stdout, result.stderr) == (0, f"{EXAMPLE}: ok\n", "")


def test_a_bad_file(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text("[daemon]\nprobe_timeout = 7200\n")
    result = check(str(path))
    assert result.stdout == ""
    assert result.stderr == (
        f"gpuctl: {path}: daemon.probe_timeout: must be a number greater than 0 and at most 3600, not 7200\n"
    )
    assert_one_error_line(result)


def test_bad_toml(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text("[daemon\n")
    assert_one_error_line(check(str(path)), str(path), "invalid TOML at line 1")


def test_a_missing_file(tmp_path):
    assert_one_error_line(check(str(tmp_path / "nope.toml")), "nope.toml: no such file")


def test_without_a_file_it_finds_the_daemons(tmp_path, home):
    path = tmp_path / "xdg" / "resourced" / "config.toml"
    path.parent.mkdir(parents=True)
    path.write_text("[daemon]\nsample_interval = 5\n")
    result = check(env=home)
    assert (result.returncode, result.stdout) == (0, f"{path}: ok\n")
    path.write_text("[daemon]\nsample_intervall = 5\n")
    assert_one_error_line(check(env=home), "unknown key daemon.sample_intervall")


def test_resourced_config_is_honoured(tmp_path, home):
    path = tmp_path / "named.toml"
    env = {**home, "RESOURCED_CONFIG": str(path)}
    assert_one_error_line(check(env=env), "(named by $RESOURCED_CONFIG)")
    path.write_text("")
    assert check(env=env).stdout == f"{path}: ok\n"


def test_system_skips_the_user_file(tmp_path, home):
    path = tmp_path / "xdg" / "resourced" / "config.toml"
    path.parent.mkdir(parents=True)
    path.write_text("this is not toml")
    assert check(env=home).returncode == 2
    if Path("/etc/resourced/config.toml").exists():
        pytest.skip("this machine has a system config file")
    result = check("--system", env=home)
    assert (result.returncode, result.stdout) == (0, "no config file found; defaults apply\n")


def test_no_file_at_all(home):
    if Path("/etc/resourced/config.toml").exists():
        pytest.skip("this machine has a system config file")
    result = check(env=home)
    assert (result.returncode, result.stdout, result.stderr) == (
        0, "no config file found; defaults apply\n", "",
    )


def test_json_ok():
    result = check("--json", str(EXAMPLE))
    assert result.returncode == 0
    data = json.loads(result.stdout)
    assert data["path"] == str(EXAMPLE)
    assert (data["schema"], data["ok"], data["error"]) == (2, True, None)
    assert data["config"]["daemon"]["probe_timeout"] == 10
    assert [c["name"] for c in data["config"]["checks"]] == ["ram", "root disk"]


def test_json_defaults(home):
    if Path("/etc/resourced/config.toml").exists():
        pytest.skip("this machine has a system config file")
    data = json.loads(check("--json", env=home).stdout)
    assert (data["path"], data["ok"], data["error"]) == (None, True, None)
    assert data["config"]["gpus"] == []


def test_json_error(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text('[[check]]\nname = "d"\ntype = "disk"\n')
    result = check(str(path), "--json")
    data = json.loads(result.stdout)
    message = f'{path}: check[0].path: required for type "disk"'
    assert data == {"schema": 2, "path": str(path), "ok": False, "error": message,
                    "config": None}
    assert_one_error_line(result)
    assert result.stderr == f"gpuctl: {message}\n"


def test_json_missing_file(tmp_path):
    result = check("--json", str(tmp_path / "nope.toml"))
    data = json.loads(result.stdout)
    assert (data["path"], data["ok"]) == (str(tmp_path / "nope.toml"), False)
    assert result.returncode == 2


@pytest.mark.parametrize("args", [("config", "--help"), ("config", "check", "--help")])
def test_help_ends_with_an_example(args):
    result = gpuctl(*args)
    assert result.returncode == 0
    help_text = result.stdout.split("Options:")[0].strip()
    assert help_text.splitlines()[-1].strip().startswith("Example: gpuctl config check")


def test_listed_in_gpuctl_help():
    assert "config" in gpuctl("--help").stdout


def test_the_command_loads_no_bus_library():
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from resourced.cli import main\n"
        f"main(['config', 'check', {str(EXAMPLE)!r}])\n"
        "bad = [m for m in ('dbus_fast', 'jeepney', 'asyncio') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def _deep(path: Path) -> None:
    path.write_text("x = " + "[" * 5000 + "]" * 5000 + "\n")


def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _loop(path: Path) -> None:
    os.symlink(path.name + ".other", path)
    os.symlink(path.name, path.with_name(path.name + ".other"))


def _huge_pool(path: Path) -> None:
    path.write_text('[[pool]]\nname = "big"\ncapacity = "99999999999P"\n')


def _directory(path: Path) -> None:
    path.mkdir()


BAD_FILES = [
    (_deep, "invalid TOML: arrays or tables nested too deeply"),
    (_fifo, "is a FIFO (named pipe), not a regular file"),
    (_loop, "a loop of symbolic links"),
    (_huge_pool, "pool[0].capacity: must be at most 9223372036854775807"),
    (_directory, "is a directory, not a regular file"),
]


@pytest.mark.parametrize("make, says", BAD_FILES, ids=lambda v: getattr(v, "__name__", None))
@pytest.mark.parametrize("how", ["config check", "resourced --config"])
def test_a_file_that_cannot_be_a_config_is_refused_at_once(tmp_path, make, says, how):
    """Each in one line with exit 2, and at once: a FIFO is never opened for a blocking read."""
    path = tmp_path / "config.toml"
    make(path)
    if how == "config check":
        result = check(str(path))
        assert_one_error_line(result, f"{path}: {says}")
    else:
        result = subprocess.run([sys.executable, "-m", "resourced.daemon", "--session", "--config",
                                 str(path)], capture_output=True, text=True, timeout=30)
        assert result.returncode == 2, result
        assert f"{path}: {says}" in result.stderr
        assert "Traceback" not in result.stderr
