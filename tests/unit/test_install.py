"""resourced.linux.install: the plan that `gpuctl service enable/disable` carries out."""

import os
import re
import shutil
import sys
from pathlib import Path
from urllib.parse import unquote

import pytest

from resourced.linux import install

from ..conftest import assert_systemd_accepts

HOME_ENV = {"HOME": "/home/alice"}


def _contents(plan: install.Plan) -> dict[Path, str]:
    return {f.path: f.content for f in plan.write}


def test_system_plan_fills_in_the_interpreter_and_config(tmp_path):
    plan = install.plan_enable("system", sys.executable, "/etc/resourced/gpus.toml", tmp_path)

    files = _contents(plan)
    assert set(files) == {
        tmp_path / "etc/systemd/system/resourced.service",
        tmp_path / "etc/dbus-1/system.d/org.resourced.conf",
        tmp_path / "usr/share/dbus-1/system-services/org.resourced.service",
        tmp_path / "etc/systemd/system/resourced-isolation.service",
        tmp_path / "usr/share/dbus-1/system-services/org.resourced.Isolation.service",
        tmp_path / "etc/sysusers.d/resourced.conf",
        tmp_path / "usr/share/polkit-1/actions/org.resourced.policy",
        tmp_path / "etc/polkit-1/rules.d/50-resourced.rules",
        tmp_path / "etc/systemd/user/resourced-notify.service",
        tmp_path / "etc/systemd/user/resourced-runner.service",
        tmp_path / "usr/local/share/man/man1/gpuctl.1",
        tmp_path / "usr/local/share/man/man1/resourced-mcp.1",
        tmp_path / "usr/local/share/man/man5/resourced.conf.5",
        tmp_path / "usr/local/share/man/man8/resourced.8",
    }
    assert files[tmp_path / "usr/local/share/man/man8/resourced.8"] == (
        install.source_dir() / "docs/man/man8/resourced.8").read_text()
    assert 'subject.isInGroup("resourced")' in files[tmp_path / "etc/polkit-1/rules.d/50-resourced.rules"]
    unit = files[tmp_path / "etc/systemd/system/resourced.service"]
    assert (f"\nExecStart={sys.executable} -m resourced.daemon --system "
            "--config /etc/resourced/gpus.toml\n") in unit
    helper = files[tmp_path / "etc/systemd/system/resourced-isolation.service"]
    assert f"\nExecStart={sys.executable} -m resourced.isolation.helper\n" in helper
    assert plan.unit_path == tmp_path / "etc/systemd/system/resourced.service"
    assert all(f.mode == 0o644 for f in plan.write)
    assert plan.commands == (
        ("systemd-sysusers", "/etc/sysusers.d/resourced.conf"),
        ("busctl", "call", "org.freedesktop.DBus", "/org/freedesktop/DBus",
         "org.freedesktop.DBus", "ReloadConfig"),
        ("systemctl", "daemon-reload"),
        ("systemctl", "enable", "--now", "resourced.service"),
    )
    assert plan.stop == () and plan.remove == () and plan.notes == ()


def test_system_config_defaults_to_etc():
    plan = install.plan_enable("system", sys.executable, root="/")
    assert "--config /etc/resourced/config.toml\n" in plan.write[0].content


def test_user_plan_goes_to_the_users_xdg_directories(tmp_path):
    plan = install.plan_enable("user", sys.executable, "/home/alice/gpus.toml", tmp_path,
                               env=HOME_ENV)

    files = _contents(plan)
    unit_path = tmp_path / "home/alice/.config/systemd/user/resourced.service"
    activation = tmp_path / "home/alice/.local/share/dbus-1/services/org.resourced.service"
    notify = tmp_path / "home/alice/.config/systemd/user/resourced-notify.service"
    runner = tmp_path / "home/alice/.config/systemd/user/resourced-runner.service"
    man = [tmp_path / f"home/alice/.local/share/man/man{n}/{page}.{n}" for page, n in (
        ("gpuctl", 1), ("resourced-mcp", 1), ("resourced.conf", 5), ("resourced", 8))]
    assert set(files) == {unit_path, activation, notify, runner, *man}
    assert f"\nExecStart={sys.executable} -m resourced.cli notify\n" in files[notify]
    assert f"\nExecStart={sys.executable} -m resourced.cli runner\n" in files[runner]
    command = f"{sys.executable} -m resourced.daemon --session --config /home/alice/gpus.toml"
    assert f"\nExecStart={command}\n" in files[unit_path]
    assert f"\nExec={command}\n" in files[activation]
    assert "\nSystemdService=resourced.service\n" in files[activation]
    assert plan.commands == (
        ("systemctl", "--user", "daemon-reload"),
        ("systemctl", "--user", "enable", "--now", "resourced.service",
         "resourced-runner.service"),
    )


def test_user_plan_without_config_passes_none():
    plan = install.plan_enable("user", sys.executable, env=HOME_ENV)
    assert f"\nExecStart={sys.executable} -m resourced.daemon --session\n" in plan.write[0].content
    assert f"\nExec={sys.executable} -m resourced.daemon --session\n" in plan.write[1].content


def test_absolute_xdg_variables_win_and_relative_ones_are_ignored():
    env = {**HOME_ENV, "XDG_CONFIG_HOME": "/cfg", "XDG_DATA_HOME": "relative/data"}
    paths = [f.path for f in install.plan_enable("user", sys.executable, env=env).write]
    assert paths == [Path("/cfg/systemd/user/resourced.service"),
                     Path("/home/alice/.local/share/dbus-1/services/org.resourced.service"),
                     Path("/cfg/systemd/user/resourced-notify.service"),
                     Path("/cfg/systemd/user/resourced-runner.service"),
                     *(Path(f"/home/alice/.local/share/man/man{n}/{page}.{n}") for page, n in (
                         ("gpuctl", 1), ("resourced-mcp", 1), ("resourced.conf", 5),
                         ("resourced", 8)))]


@pytest.mark.parametrize("mode", ["user", "system"])
def test_every_placeholder_is_filled_in(tmp_path, mode):
    for config in (None, "/etc/resourced/config.toml"):
        plan = install.plan_enable(mode, sys.executable, config, tmp_path, env=HOME_ENV)
        for f in plan.write:
            assert not install.PLACEHOLDER.search(f.content), f.path
            assert f.content.endswith("\n") and " \n" not in f.content


@pytest.mark.parametrize("mode", ["user", "system"])
def test_disable_removes_exactly_what_enable_writes(tmp_path, mode):
    enable = install.plan_enable(mode, sys.executable, root=tmp_path, env=HOME_ENV)
    disable = install.plan_disable(mode, tmp_path, env=HOME_ENV)

    assert disable.remove == tuple(f.path for f in enable.write)
    assert disable.write == () and disable.unit_path == enable.unit_path
    assert disable.unit == enable.unit
    units = (enable.unit, "resourced-runner.service", "resourced-notify.service") \
        if mode == "user" else (enable.unit,)  # every unit of the user's that it wrote
    isolation = (("systemctl", "stop", "resourced-isolation.service"),) \
        if mode == "system" else ()  # bus-activated, never enabled: stopped
    assert disable.stop == (("systemctl", *(["--user"] if mode == "user" else []), "disable",
                             "--now", *units), *isolation)
    assert ("systemctl", *(["--user"] if mode == "user" else []), "daemon-reload") \
        in disable.commands


def test_paths_with_spaces_and_specifiers_are_quoted():
    python = "/opt/my env/50%/$bin/python"
    plan = install.plan_enable("user", python, "/etc/a b.toml", env=HOME_ENV)
    unit, activation = (f.content for f in plan.write[:2])
    assert ('\nExecStart="/opt/my env/50%%/$$bin/python" -m resourced.daemon --session '
            '--config "/etc/a b.toml"\n') in unit
    assert ("\nExec='/opt/my env/50%/$bin/python' -m resourced.daemon --session "
            "--config '/etc/a b.toml'\n") in activation


def test_without_sysusers_the_account_comes_from_useradd():
    plan = install.plan_enable("system", sys.executable, sysusers=False)
    shell, flag, script = plan.commands[0]
    assert (shell, flag) == ("sh", "-c")
    assert script.startswith("getent passwd resourced >/dev/null || useradd --system")


@pytest.mark.parametrize("python, config, hidden", [
    ("/home/alice/venv/bin/python", "/etc/resourced/config.toml", ["interpreter"]),
    ("/opt/resourced/bin/python", "/root/config.toml", ["config file"]),
    ("/opt/resourced/bin/python", "/etc/resourced/config.toml", []),
    ("/homeless/bin/python", "/run/user/1000/c.toml", ["config file"]),
])
def test_system_plan_warns_about_paths_the_service_cannot_see(python, config, hidden):
    notes = install.plan_enable("system", python, config).notes
    assert [what for what in ("interpreter", "config file")
            if any(n.startswith(f"the {what} ") for n in notes)] == hidden
    assert install.plan_enable("user", python, config, env=HOME_ENV).notes == ()


@pytest.mark.parametrize("kwargs, message", [
    ({"mode": "both", "python": sys.executable}, "mode must be one of"),
    ({"mode": "user", "python": "python3"}, "interpreter path must be absolute"),
    ({"mode": "system", "python": sys.executable, "config": "c.toml"}, "must be absolute"),
    ({"mode": "system", "python": "/usr/bin/py\nthon"}, "control character"),
])
def test_bad_input_is_refused(kwargs, message):
    with pytest.raises(install.InstallError, match=message):
        install.plan_enable(**kwargs)


def test_a_missing_template_is_an_install_error(tmp_path):
    with pytest.raises(install.InstallError, match="cannot read the template"):
        install.plan_enable("system", sys.executable, sources=tmp_path)


def test_render_refuses_unknown_placeholders():
    with pytest.raises(install.InstallError, match="@NOPE@"):
        install.render("X=@NOPE@\n", {"PYTHON": ["/p"]}, install.UNIT)
    with pytest.raises(install.InstallError, match="@PYTHON@"):
        install.render("X=@PYTHON@\n", {"PYTHON": ["/p"]}, install.PLAIN)


def test_the_templates_are_found_in_the_source_tree():
    root = Path(__file__).resolve().parents[2]
    assert install.source_dir() == root


def test_the_polkit_rule_names_the_configured_access_group(tmp_path):
    plan = install.plan_enable("system", sys.executable, None, tmp_path, group="gpuusers")
    rules = _contents(plan)[tmp_path / "etc/polkit-1/rules.d/50-resourced.rules"]
    assert 'subject.isInGroup("gpuusers")' in rules


def test_an_invalid_group_name_is_refused(tmp_path):
    with pytest.raises(install.InstallError, match="not a valid group name"):
        install.plan_enable("system", sys.executable, None, tmp_path, group='x"); evil(')


def test_the_runner_unit_starts_with_the_user_service_and_is_offered_to_every_user(tmp_path):
    plan = install.plan_enable("user", sys.executable, root=tmp_path, env=HOME_ENV)
    runner = _contents(plan)[tmp_path / "home/alice/.config/systemd/user/resourced-runner.service"]
    for line in ("Type=exec", "Restart=on-failure", "WantedBy=default.target",
                 "KillMode=process"):
        assert f"\n{line}\n" in runner
    assert plan.commands[-1] == ("systemctl", "--user", "enable", "--now",
                                 "resourced.service", "resourced-runner.service")
    disable = install.plan_disable("user", tmp_path, env=HOME_ENV)
    assert tmp_path / "home/alice/.config/systemd/user/resourced-runner.service" in disable.remove
    assert "resourced-runner.service" in disable.stop[0]  # disabled before it is removed
    system = install.plan_enable("system", sys.executable, root=tmp_path)
    assert any(f.path == tmp_path / "etc/systemd/user/resourced-runner.service"
               for f in system.write)  # each user enables theirs


def test_systemd_accepts_the_runner_unit(tmp_path):
    plan = install.plan_enable("user", sys.executable, root=tmp_path, env=HOME_ENV)
    assert_systemd_accepts(tmp_path, "resourced-runner.service", _contents(plan)[
        tmp_path / "home/alice/.config/systemd/user/resourced-runner.service"])


def test_disable_drops_only_the_directories_enable_may_have_made(tmp_path):
    system = install.plan_disable("system", tmp_path)
    assert set(system.prune) == {tmp_path / "etc/sysusers.d",
                                 *(tmp_path / f"usr/local/share/man/man{n}" for n in (1, 5, 8))}
    user = install.plan_disable("user", tmp_path, env=HOME_ENV)
    assert set(user.prune) == {tmp_path / "home/alice/.config/systemd/user",
                               tmp_path / "home/alice/.local/share/dbus-1/services",
                               *(tmp_path / f"home/alice/.local/share/man/man{n}"
                                 for n in (1, 5, 8))}


def _shared_plan(tmp_path, group="gpu-lab", config=None):
    return install.plan_enable("shared", sys.executable, config, tmp_path, env=HOME_ENV,
                               group=group, shared_dir="/srv/gpu lab/resourced")


def test_the_shared_plan_writes_one_user_unit_that_hosts_the_bus(tmp_path):
    plan = _shared_plan(tmp_path, config="/home/alice/gpus.toml")
    unit_path = tmp_path / "home/alice/.config/systemd/user/resourced-shared.service"
    assert [f.path for f in plan.write] == [unit_path] and plan.unit_path == unit_path
    assert (f"\nExecStart={sys.executable} -m resourced.daemon --shared \"/srv/gpu lab/resourced\""
            " --group gpu-lab --config /home/alice/gpus.toml\n") in plan.write[0].content
    assert plan.commands == (("systemctl", "--user", "daemon-reload"),
                             ("systemctl", "--user", "enable", "--now", "resourced-shared.service"))
    disable = install.plan_disable("shared", tmp_path, env=HOME_ENV)
    assert disable.remove == (unit_path,)
    assert disable.stop == (("systemctl", "--user", "disable", "--now", "resourced-shared.service"),)


def test_the_shared_plan_leaves_the_group_to_the_config_unless_named(tmp_path):
    content = _shared_plan(tmp_path, group="").write[0].content
    (exec_start,) = [line for line in content.splitlines() if line.startswith("ExecStart=")]
    assert exec_start.endswith('--shared "/srv/gpu lab/resourced"') and "--group" not in exec_start
    assert not install.PLACEHOLDER.search(content)


@pytest.mark.parametrize("shared_dir", [None, "", "relative/dir"])
def test_the_shared_plan_needs_an_absolute_directory(tmp_path, shared_dir):
    with pytest.raises(install.InstallError, match="shared bus directory"):
        install.plan_enable("shared", sys.executable, root=tmp_path, env=HOME_ENV,
                            group="", shared_dir=shared_dir)


def test_systemd_accepts_the_shared_unit(tmp_path):
    assert_systemd_accepts(tmp_path, "resourced-shared.service",
                            _shared_plan(tmp_path).write[0].content)


def _documentation(unit: str) -> Path:
    """The file a rendered unit's Documentation= names beside its man page, read as systemd
    reads it (%% is %)."""
    [line] = [line.removeprefix("Documentation=") for line in unit.splitlines()
              if line.startswith("Documentation=")]
    man, url = line.split(" ")
    assert re.fullmatch(r"man:(resourced\(8\)|gpuctl\(1\))", man), man
    assert url.startswith("file:///"), url
    return Path(unquote(url.replace("%%", "%").removeprefix("file://")))


def test_every_unit_names_the_readme_that_ships_beside_the_templates(tmp_path):
    plans = (install.plan_enable("user", sys.executable, root=tmp_path, env=HOME_ENV),
             install.plan_enable("system", sys.executable, root=tmp_path), _shared_plan(tmp_path))
    units = {f.path: f.content for plan in plans for f in plan.write
             if "systemd" in f.path.parts}
    templates = install.source_dir() / "systemd"
    written = {t.source for t in (*install.SYSTEM_FILES, *install.USER_FILES,
                                  *install.SHARED_FILES) if t.source.startswith("systemd/")
               and t.source.endswith(".service")}
    assert written == {f"systemd/{p.name}" for p in templates.glob("*.service")}
    for unit in units.values():
        readme = _documentation(unit)
        assert readme == install.source_dir() / "README.md" and readme.is_file()


def test_a_readme_under_an_odd_path_is_named_as_systemd_reads_it(tmp_path):
    sources = tmp_path / "a b%n$x'"
    for part in ("systemd", "dbus", "docs/man"):
        shutil.copytree(install.source_dir() / part, sources / part)
    shutil.copy(install.source_dir() / "README.md", sources)
    plan = install.plan_enable("user", sys.executable, root=tmp_path / "root", env=HOME_ENV,
                               sources=sources)
    unit = plan.write[0].content
    assert _documentation(unit) == sources / "README.md"
    assert_systemd_accepts(tmp_path, "resourced.service", unit)


def _root_owned(path: Path, mode: int) -> Path:
    os.chown(path, 0, 0)
    path.chmod(mode)
    return path


@pytest.mark.skipif(os.geteuid() != 0, reason="makes files of other owners (root only)")
def test_a_root_unit_is_refused_code_another_account_can_change(tmp_path):
    base = _root_owned(tmp_path, 0o755)
    (base / "venv").mkdir()
    venv = _root_owned(base / "venv", 0o755)
    site = venv / "lib"
    site.mkdir()
    python = venv / "python"
    python.write_text("")
    assert install.changeable_by_others(str(site)) is None
    install.check_root_runs_only_roots_code(str(python), [str(site)])

    os.chown(site, 65534, 65534)
    where, who = install.changeable_by_others(str(site / "resourced"))
    assert where == str(site) and who.startswith("owned by") and "65534" in who
    with pytest.raises(install.InstallError, match=f"{site} is owned by .*uid 65534.* could "
                       "run code as root. Install resourced where only root can write"):
        install.check_root_runs_only_roots_code(str(python), [str(site)])
    os.chown(site, 0, 0)

    venv.chmod(0o777)
    assert install.changeable_by_others(str(python)) == (str(venv), "writable by everyone")
    venv.chmod(0o1777)  # sticky, as /tmp: what root owns there stays root's
    assert install.changeable_by_others(str(python)) is None
    venv.chmod(0o775)
    os.chown(venv, 0, 65534)
    assert install.changeable_by_others(str(python))[1].startswith("writable by group")

    link = base / "bin-python"
    link.symlink_to(python)  # a link is followed: its target's folders count too
    assert install.changeable_by_others(str(link))[0] == str(venv)
