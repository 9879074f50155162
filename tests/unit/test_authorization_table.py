"""Deny by default, made explicit: every method of our API names its polkit action."""

import xml.etree.ElementTree as ET
from pathlib import Path

from resourced.bus.polkit import ACTIONS, METHOD_ACTIONS, OWNER, READ

ROOT = Path(__file__).resolve().parents[2]


def _methods_in_golden_xml() -> set[tuple[str, str]]:
    tree = ET.parse(ROOT / "dbus" / "org.resourced.xml")
    return {(iface.get("name"), m.get("name"))
            for iface in tree.iter("interface") for m in iface.iter("method")}


def test_every_method_has_an_authorization_entry():
    assert set(METHOD_ACTIONS) == _methods_in_golden_xml()


def test_every_entry_names_a_known_action():
    for action in METHOD_ACTIONS.values():
        assert action in (READ, OWNER) or action.removeprefix("owner-or:") in ACTIONS


def test_every_action_is_defined_in_the_policy_file():
    policy = ET.parse(ROOT / "polkit" / "org.resourced.policy")
    defined = {a.get("id") for a in policy.iter("action")}
    assert defined == set(ACTIONS)
