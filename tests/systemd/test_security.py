"""systemd's own measure of the sandbox, on the unit as loaded by the running manager
(with its drop-ins), not only on the file: ``systemd-analyze security resourced.service``."""

import re

from .conftest import FIGURES
from .harness import UNIT

LIMIT = 1.5  # the offline check of the rendered file (tests/unit/test_unit_files.py) too


def _exposure(text: str) -> float:
    level = re.search(r"Overall exposure level for \S+: ([0-9.]+)", text)
    assert level, text
    return float(level[1])


def test_the_loaded_unit_is_exposed_less_than_1_5(service, record_property):
    ns = service.ns
    loaded = _exposure(ns.run("systemd-analyze", "security", "--no-pager", UNIT).stdout)
    offline = _exposure(ns.run("systemd-analyze", "security", "--no-pager", "--offline=true",
                               f"/etc/systemd/system/{UNIT}").stdout)
    record_property("exposure", loaded)
    FIGURES["systemd-analyze security"] = f"{loaded} loaded, {offline} offline (limit < {LIMIT})"
    assert loaded < LIMIT
    assert loaded == offline  # the drop-ins of the tests change nothing it measures


def test_enable_refuses_a_root_unit_whose_code_another_account_can_change(service):
    """The isolation helper runs as root from this environment: were its packages an
    account's to change, that account would run code as root."""
    ns = service.ns
    site = ns.run(str(ns.venv / "bin/python"), "-c",
                  "import sysconfig; print(sysconfig.get_paths()['purelib'])").stdout.strip()
    ns.run("chown", service.login("alice"), site)
    try:
        refused = ns.gpuctl("service", "enable", "--system", check=False, timeout=90)
        assert refused.returncode == 1, refused
        assert f"{site} is owned by {service.login('alice')}" in refused.stderr
        assert "could run code as root" in refused.stderr
        assert "wrote" not in refused.stdout
    finally:
        ns.run("chown", "root", site)
