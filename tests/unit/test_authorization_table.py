"""Deny by default, made explicit: every method of our API names its polkit action, and
who may perform each action is written once (GROUP_ACTIONS) for polkit and the shared bus."""

import asyncio
import re
import xml.etree.ElementTree as ET
from pathlib import Path
from types import SimpleNamespace

import pytest
from dbus_fast import MessageType, Variant

from resourced.daemon.bus.polkit import (
    ACTIONS,
    CLAIM,
    GROUP_ACTIONS,
    METHOD_ACTIONS,
    OWNER,
    READ,
    GroupAuthority,
)
from resourced.errors import AccessDenied

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


def test_the_polkit_rules_grant_the_group_exactly_the_group_actions():
    """One table for both buses: the rules file names the actions of GROUP_ACTIONS."""
    rules = (ROOT / "polkit" / "50-resourced.rules").read_text()
    assert set(re.findall(r'action\.id == "([^"]+)"', rules)) == GROUP_ACTIONS


class _Bus:
    """Answers GetConnectionCredentials as the bus would, and counts the calls."""

    def __init__(self, groups):
        self.groups = groups
        self.calls = 0

    async def call(self, msg):
        self.calls += 1
        return SimpleNamespace(message_type=MessageType.METHOD_RETURN,
                               body=[{"UnixGroupIDs": Variant("au", self.groups)}])


def _check(authority, uid, action):
    msg = SimpleNamespace(sender=":1.7")
    return asyncio.run(authority.check(msg, uid, action, {}))


@pytest.mark.parametrize("action", sorted(ACTIONS))
def test_on_a_shared_bus_root_and_the_host_may_do_everything(action):
    authority = GroupAuthority(_Bus([]), 1500, "host", "lab", 900)
    _check(authority, 0, action)
    _check(authority, 1500, action)


def test_on_a_shared_bus_members_may_do_the_group_actions_only():
    bus = _Bus([100, 900])
    authority = GroupAuthority(bus, 1500, "host", "lab", 900)
    for action in GROUP_ACTIONS:
        _check(authority, 1600, action)
    assert bus.calls == 1  # the groups of a connection are asked for once
    for action in set(ACTIONS) - GROUP_ACTIONS:
        with pytest.raises(AccessDenied, match="host account"):
            _check(authority, 1600, action)


def test_on_a_shared_bus_others_may_do_nothing():
    authority = GroupAuthority(_Bus([100]), 1500, "host", "lab", 900)
    with pytest.raises(AccessDenied, match="not in group lab"):
        _check(authority, 1700, CLAIM)
