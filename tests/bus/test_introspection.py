"""The live API equals the golden dbus/org.resourced.xml: API changes are deliberate."""

import os
import subprocess
import xml.etree.ElementTree as ET

from ..conftest import ROOT

GOLDEN = ROOT / "dbus" / "org.resourced.xml"
OURS = "org.resourced."


def _shape(xml: str) -> dict:
    """Our interfaces as comparable data: members, argument names/types/directions, annotations."""
    shape = {}
    for iface in ET.fromstring(xml).iter("interface"):
        name = iface.get("name")
        if not name.startswith(OURS):
            continue
        members = {}
        for el in iface:
            args = tuple((a.get("name"), a.get("type"), a.get("direction", "out")) for a in el.iter("arg"))
            notes = tuple(sorted((a.get("name"), a.get("value")) for a in el.iter("annotation")))
            members[(el.tag, el.get("name"))] = (args, el.get("type"), el.get("access"), notes)
        shape[name] = members
    return shape


def _introspect(address: str, path: str) -> str:
    out = subprocess.run(
        ["busctl", f"--address={address}", "--json=short", "call", "org.resourced", path,
         "org.freedesktop.DBus.Introspectable", "Introspect"],
        check=True, capture_output=True, text=True, timeout=10,
    ).stdout
    import json

    return json.loads(out)["data"][0]


def test_live_introspection_matches_golden_file(start_daemon, tmp_path):
    config = tmp_path / "config.toml"
    config.write_text('[[check]]\nname = "ram"\ntype = "ram"\nwarn_free_pct = 10\n')
    daemon = start_daemon(args=["--config", str(config)])
    from resourced.client.sync import Client

    with Client() as c:
        ref = c.claim(mode="dev", gpus=1, owner_pid=daemon.proc.pid)["allocation"]["ref"]
        c.book(gpus=1, duration=3600, start="+1h")
    live = {}
    for path in ("/org/resourced", "/org/resourced/gpu/0", f"/org/resourced/claim/{ref}",
                 "/org/resourced/check/ram", "/org/resourced/pool/cpu",
                 f"/org/resourced/user/{os.getuid()}"):
        live.update(_shape(_introspect(daemon.bus.address, path)))
    assert set(live) == {"org.resourced.Manager", "org.resourced.GPU", "org.resourced.Claim",
                         "org.resourced.Check", "org.resourced.Pool", "org.resourced.User"}
    assert live == _shape(GOLDEN.read_text())
