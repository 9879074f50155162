"""What resourced-mcp's run tool lets through: [mcp] in the configuration file, the
commands it allows (the program as resolved, not as named) and the folders (links
resolved).  No bus: ``agents.jobs.check`` and the configuration's checker alone."""


import pytest

from resourced.agents import jobs
from resourced.config import ConfigError, parse_config


def test_mcp_is_off_with_nothing_allowed_by_default_and_its_keys_are_checked():
    assert parse_config("", "f").mcp == parse_config("[mcp]\n", "f").mcp
    off = parse_config("", "f").mcp
    assert (off.run, off.allow_commands, off.allow_dirs) == (False, (), ())
    on = parse_config("[mcp]\nrun = true\nallow_commands = ['python3', 'uv run']\n"
                      "allow_dirs = ['~/src', '/data']\n", "f").mcp
    assert on.allow_commands == ("python3", "uv run") and on.allow_dirs == ("~/src", "/data")
    for text, key in (("run = 1", "mcp.run"), ("allow_commands = 'python3'", "mcp.allow_commands"),
                      ("allow_commands = ['./train.sh']", "mcp.allow_commands"),
                      ("allow_commands = ['']", "mcp.allow_commands"),
                      ("allow_dirs = ['src']", "mcp.allow_dirs"),
                      ("allow_command = []", None)):
        with pytest.raises(ConfigError) as caught:
            parse_config(f"[mcp]\n{text}\n", "f")
        assert caught.value.key == key or "mcp.allow_commands" in str(caught.value), text


@pytest.fixture
def machine(tmp_path):
    """A folder on PATH with an interpreter (a script), a project folder with a link to
    it (as a virtualenv's python is) and an impostor of the same name; the environment."""
    bin_dir, work = tmp_path / "bin", tmp_path / "work"
    for folder in (bin_dir, work, work / ".venv", tmp_path / "elsewhere"):
        folder.mkdir()
    for name in ("interp", "other"):
        (bin_dir / name).write_text("#!/bin/sh\n")
        (bin_dir / name).chmod(0o755)
    (work / ".venv" / "interp").symlink_to(bin_dir / "interp")
    (work / "interp").symlink_to(bin_dir / "other")  # an impostor, found through "." on PATH
    (work / "away").symlink_to(tmp_path / "elsewhere")
    config = tmp_path / "config.toml"
    config.write_text(f"[mcp]\nrun = true\nallow_commands = ['interp', 'other -m pytest']\n"
                      f"allow_dirs = ['{work}']\n")
    return work, {"PATH": f".:{bin_dir}", "RESOURCED_CONFIG": str(config), "HOME": "/nonexistent"}


def test_a_command_is_allowed_as_the_program_it_resolves_to(machine):
    work, env = machine
    assert jobs.check([str(work / ".venv" / "interp"), "-c", "1"], str(work), env) == str(work)
    assert jobs.check(["other", "-m", "pytest", "-q"], str(work), env) == str(work)
    for argv in (["interp", "-c", "1"],          # "." on PATH finds the impostor first
                 ["./interp"], ["other", "-c", "1"], ["other", "-m"], ["missing"]):
        with pytest.raises(jobs.Refused, match="is not allowed: mcp.allow_commands"):
            jobs.check(argv, str(work), env)


def test_a_folder_is_allowed_once_its_links_are_resolved(machine):
    work, env = machine
    argv = [str(work / ".venv" / "interp")]
    assert jobs.check(argv, str(work / ".venv"), env) == str(work / ".venv")
    for folder in (work / "away", work.parent / "elsewhere", work.parent):
        with pytest.raises(jobs.Refused, match="is not allowed: mcp.allow_dirs"):
            jobs.check(argv, str(folder), env)


def test_off_or_an_unreadable_file_refuses_everything_naming_the_setting(machine, tmp_path):
    work, env = machine
    config = tmp_path / "config.toml"
    config.write_text("[mcp]\nrun = false\nallow_commands = ['interp']\n")
    with pytest.raises(jobs.Refused, match=r"run = true under \[mcp\] in .*config.toml"):
        jobs.check(["interp"], str(work), env)
    assert "Off here" in jobs.described(env)
    config.write_text("[mcp]\nrun = 'yes'\n")
    with pytest.raises(jobs.Refused, match="mcp.run: must be true or false"):
        jobs.check(["interp"], str(work), env)
    assert jobs.allowed(env)["problem"] and jobs.allowed(env)["run"] is False


def test_a_log_chunk_never_ends_inside_a_character():
    text = "né ✓ 🙂".encode()
    cuts = [jobs._whole_characters(text[:n]) for n in range(len(text) + 1)]
    assert all(text.startswith(cut) and cut.decode() is not None for cut in cuts)
    assert jobs._whole_characters(text) == text
