"""``gpuctl service disable --system`` stops the service and removes exactly what
``service enable --system`` wrote: /etc and /usr/share are as they were before enable,
but for the account (which stays, as the README says). And ``service enable --system``
without a config file refuses before it writes or starts anything.

The test installs the service again at its end, so that no other test depends on running
before it."""

from pathlib import Path

import pytest

from resourced.linux import install

from .conftest import ACCOUNT_FILES, ENABLE_STAMP, SNAPSHOT_PATHS
from .harness import CONFIG, UNIT

SYSUSERS_DIR = str(Path(install.SYSUSERS_CONF).parent)


def _differences(before: dict[str, str], after: dict[str, str]) -> dict[str, tuple]:
    return {path: (before.get(path), after.get(path))
            for path in sorted(set(before) | set(after)) if before.get(path) != after.get(path)}


def _account_lines(rig, path: str) -> tuple[set[str], set[str]]:
    """(lines added, lines removed) since before enable."""
    before = set(rig.accounts_before[path].splitlines())
    now = set(rig.ns.run("cat", path).stdout.splitlines())
    return now - before, before - now


def test_disable_removes_exactly_what_enable_wrote(service):
    rig, ns = service, service.ns
    expected = {str(p) for p in install.plan_disable(install.SYSTEM).remove}
    wrote = {line.removeprefix("wrote ") for line in rig.enable_output.splitlines()
             if line.startswith("wrote ")}
    assert wrote == expected

    done = ns.gpuctl("service", "disable", "--system", timeout=90)
    removed = {line.removeprefix("removed ") for line in done.stdout.splitlines()
               if line.startswith("removed ") and not line.endswith("/ (empty)")}
    assert removed == expected
    props = ns.show(UNIT, "ActiveState", "LoadState", "UnitFileState")
    assert props["ActiveState"] == "inactive" and props["LoadState"] == "not-found", props
    assert not ns.name_owned()

    after = ns.snapshot(*SNAPSHOT_PATHS)
    accounts = {p for f in ACCOUNT_FILES for p in (f, f + "-")} | {"/etc/.pwd.lock"}
    changed = _differences(rig.before_enable, after)
    # enable makes /etc/sysusers.d where it is missing (Debian has none), and disable
    # drops it again: the tree is as it was (test_disable_removes_the_directories_enable_made).
    assert {p: d for p, d in changed.items() if p not in accounts} == {}
    # The account made by systemd-sysusers stays (its group, the access group, existed).
    for path in ("/etc/passwd", "/etc/shadow"):
        added, gone = _account_lines(rig, path)
        assert gone == set() and [line.split(":")[0] for line in added] == ["resourced"], path
    for path in ("/etc/group", "/etc/gshadow"):
        assert _account_lines(rig, path) == (set(), set()), path
    # Nothing else under /usr/share is newer than enable (only the two places walked).
    newer = ns.run("find", "/usr/share", "-newer", ENABLE_STAMP, "!", "-type", "d").stdout
    assert newer == ""

    # Without the config file the unit would name, enable refuses before anything.
    ns.run("mv", CONFIG, "/root/sdt-config.toml")
    try:
        refused = ns.gpuctl("service", "enable", "--system", check=False, timeout=90)
        assert refused.returncode == 2, refused
        assert f"{CONFIG}: no such file" in refused.stderr
        assert "gpuctl init --system" in refused.stderr
        assert "wrote" not in refused.stdout and "running" not in refused.stdout
        without_config = {p: v for p, v in after.items() if p != CONFIG}
        assert _differences(without_config, ns.snapshot(*SNAPSHOT_PATHS)) == {}
        assert ns.show(UNIT, "ActiveState")["ActiveState"] == "inactive"
    finally:
        ns.run("mv", "/root/sdt-config.toml", CONFIG)
        again = ns.enable()
    assert again.returncode == 0
    assert ns.show(UNIT, "ActiveState")["ActiveState"] == "active"


def test_disable_removes_the_directories_enable_made(service):
    ns = service.ns
    if SYSUSERS_DIR in service.before_enable:
        pytest.skip(f"{SYSUSERS_DIR} was there before enable")
    ns.gpuctl("service", "disable", "--system", timeout=90)
    try:
        assert ns.run("test", "-e", SYSUSERS_DIR, check=False).returncode != 0
    finally:
        ns.enable()
