"""The shipped unit and bus files: systemd accepts the rendered units, the bus policy allows
exactly our interfaces, and the activation files point at the units."""

import configparser
import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from resourced.linux import install

ROOT = Path(__file__).resolve().parents[2]
POLICY = ROOT / "dbus" / "org.resourced.conf"
INTERFACES = {
    "org.resourced.Manager", "org.resourced.GPU", "org.resourced.Claim", "org.resourced.Pool",
    "org.resourced.User", "org.resourced.Check", "org.freedesktop.DBus.Introspectable",
    "org.freedesktop.DBus.Properties", "org.freedesktop.DBus.Peer",
    "org.freedesktop.DBus.ObjectManager",
}


def _staged(mode: str, root: Path) -> install.Plan:
    plan = install.plan_enable(mode, sys.executable, "/etc/resourced/config.toml", root,
                               env={"HOME": "/home/alice"})
    for f in plan.write:
        f.path.parent.mkdir(parents=True, exist_ok=True)
        f.path.write_text(f.content)
    return plan


def _verify(unit: Path, *args: str, env=None) -> None:
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed")
    # Its Documentation=man:... pages are looked up among the generated ones.
    env = {**(os.environ if env is None else env), "MANPATH": str(ROOT / "docs" / "man")}
    done = subprocess.run(["systemd-analyze", *args, "verify", str(unit)], env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    # verify exits 0 on unknown keys or values it ignores; it names the unit when it does.
    about_us = [line for line in (done.stdout + done.stderr).splitlines() if unit.name in line]
    assert done.returncode == 0 and about_us == [], done.stdout + done.stderr


def test_systemd_accepts_the_rendered_system_unit(tmp_path):
    plan = _staged("system", tmp_path)
    _verify(plan.unit_path)


@pytest.mark.parametrize("unit", [install.SYSTEM_UNIT, install.ISOLATION_UNIT])
def test_the_system_units_are_exposed_less_than_1_5_by_systemds_measure(tmp_path, unit):
    import re

    _staged("system", tmp_path)
    path = tmp_path / "etc/systemd/system" / unit
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed")
    _verify(path)
    done = subprocess.run(["systemd-analyze", "security", "--offline=true", str(path)],
                          check=False, capture_output=True, text=True, timeout=60)
    level = re.search(r"Overall exposure level for \S+: ([0-9.]+)", done.stdout)
    assert level, done.stdout + done.stderr
    assert float(level[1]) < 1.5, done.stdout


def test_systemd_accepts_the_rendered_user_unit(tmp_path):
    plan = _staged("user", tmp_path / "root")
    runtime = tmp_path / "xdg-runtime"
    runtime.mkdir(mode=0o700)
    _verify(plan.unit_path, "--user", env={**os.environ, "XDG_RUNTIME_DIR": str(runtime)})


def test_the_system_unit_keeps_the_gpus_visible():
    unit = (ROOT / "systemd" / "resourced.service").read_text()
    settings = [line for line in unit.splitlines() if line and not line.startswith("#")]
    assert "PrivateDevices=no" in settings
    assert not [s for s in settings if s.startswith(("MemoryDenyWriteExecute=", "DevicePolicy=",
                                                     "ProtectProc="))]
    for setting in ("Type=notify", "BusName=org.resourced", "User=resourced",
                    "Group=resourced", "NotifyAccess=main", "WatchdogSec=30s",
                    "RuntimeDirectoryPreserve=yes", "WantedBy=multi-user.target"):
        assert setting in settings


def test_the_account_file_is_valid_for_sysusers(tmp_path):
    if shutil.which("systemd-sysusers") is None:
        pytest.skip("systemd-sysusers is not installed")
    conf = ROOT / "systemd" / "resourced.sysusers"
    done = subprocess.run(["systemd-sysusers", "--dry-run", f"--root={tmp_path}", str(conf)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert "Creating user 'resourced' (resourced daemon)" in done.stdout + done.stderr


def test_the_bus_policy_is_well_formed_with_its_doctype():
    text = POLICY.read_text()
    assert ('<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-BUS Bus Configuration 1.0//EN"'
            in text)
    assert ET.fromstring(text).tag == "busconfig"


def test_the_bus_policy_allows_exactly_our_interfaces_and_owners():
    policies = ET.parse(POLICY).getroot().findall("policy")
    rules = [(p.attrib, rule.tag, rule.attrib) for p in policies for rule in p]

    owners = {(where.get("user"), attrs["own"]) for where, _, attrs in rules if "own" in attrs}
    assert owners == {("resourced", "org.resourced"), ("root", "org.resourced"),
                      ("root", "org.resourced.Isolation")}
    helper = {(where.get("user"), attrs["send_interface"]) for where, _, attrs in rules
              if attrs.get("send_destination") == "org.resourced.Isolation"}
    assert helper == {("resourced", "org.resourced.Isolation"),
                      ("root", "org.resourced.Isolation")}  # nobody else may call it
    default = [(tag, attrs) for where, tag, attrs in rules if where == {"context": "default"}]
    assert all(tag == "allow" and set(attrs) == {"send_destination", "send_interface"}
               and attrs["send_destination"] == "org.resourced" for tag, attrs in default)
    interfaces = [attrs["send_interface"] for _, attrs in default]
    assert sorted(interfaces) == sorted(INTERFACES)
    # Nothing else: no other context, no mandatory rules, no send rules outside default.
    assert {frozenset(p.attrib.items()) for p in policies} == {
        frozenset({("user", "resourced")}), frozenset({("user", "root")}),
        frozenset({("context", "default")})}
    assert all("own" in attrs or attrs.get("send_destination") == "org.resourced.Isolation"
               for where, _, attrs in rules if "user" in where)


def _activation(name: str) -> dict[str, str]:
    parser = configparser.ConfigParser(interpolation=None)
    parser.optionxform = str
    parser.read(ROOT / "dbus" / name)
    assert parser.sections() == ["D-BUS Service"]
    return dict(parser["D-BUS Service"])


def test_the_activation_files_start_the_units():
    assert _activation("org.resourced.service") == {
        "Name": "org.resourced", "Exec": "/bin/false", "User": "resourced",
        "SystemdService": install.SYSTEM_UNIT,
    }
    assert _activation("org.resourced.Isolation.service") == {
        "Name": "org.resourced.Isolation", "Exec": "/bin/false", "User": "root",
        "SystemdService": install.ISOLATION_UNIT,
    }
    session = _activation("org.resourced.session.service")
    assert session["Name"] == "org.resourced"
    assert session["SystemdService"] == install.USER_UNIT
    assert session["Exec"].startswith("@PYTHON@ -m resourced.daemon --session")
