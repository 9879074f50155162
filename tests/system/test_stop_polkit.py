"""The stop switch on a shared machine: the real bus, polkitd and the shipped rules (users
from conftest: alice and dave are in the access group, bob is not, carol administers).

| caller      | stop own session | stop another user's          |
|-------------|------------------|------------------------------|
| alice, dave | 0                | 8 (manage: a challenge)      |
| carol       | -                | 2 without a reason, else 0   |

Sessions and users are kept apart: stopping one of alice's sessions leaves her other
session and dave's claims alone, and a limit-free stop of nothing is not an error.
"""

import json

import pytest

from .conftest import BUS_NAME, MANAGER_IFACE, MANAGER_PATH, ok, refused

pytestmark = pytest.mark.usefixtures("clean_claims")

INTERACTIVE = "org.freedesktop.DBus.Error.InteractiveAuthorizationRequired"
EXIT_USAGE, EXIT_NO_SUCH_CLAIM, EXIT_NOT_YOURS, EXIT_ACCESS_DENIED = 2, 6, 7, 8


def claim(rig, key: str, session: str) -> str:
    return ok(rig.gpuctl(key, "claim", "--gpus", 1, "--owner-pid", rig.sleepers[key],
                         "--session", session)).strip()


def claims(rig) -> dict[str, dict]:
    describe = json.loads(rig.root_call(BUS_NAME, MANAGER_PATH, MANAGER_IFACE, "Describe")[0])
    return {c["id"]: c for c in describe["claims"]}


def test_a_member_stops_one_of_their_sessions_and_nothing_else(rig):
    first, second = claim(rig, "alice", "agents"), claim(rig, "alice", "agents")
    other = claim(rig, "alice", "notebook")
    daves = claim(rig, "dave", "agents")  # the same name, another user: another session
    held = claims(rig)
    assert held[first]["session"] == "agents" and held[daves]["session"] == "agents"

    stopped = json.loads(ok(rig.gpuctl("alice", "stop", "--session", "agents", "--json")))

    assert sorted(stopped["claims"]) == sorted([first, second])
    assert set(claims(rig)) == {other, daves}


@pytest.mark.parametrize("key", ["dave", "bob"])
def test_nobody_stops_another_users_session_without_the_administrators_right(rig, key):
    ref = claim(rig, "alice", "agents")
    uid = rig.uid("alice")
    refused(rig.gpuctl(key, "stop", "--user", uid, "--session", "agents", "--reason", "mine now"),
            EXIT_ACCESS_DENIED)
    result = rig.call(key, "Stop", "a{sv}", ({"UID": ("u", uid), "Reason": ("s", "x")},))
    assert result.get("error") == INTERACTIVE, result  # manage is auth_admin_keep: a challenge
    assert ref in claims(rig)


def test_another_users_session_named_alone_is_said_to_be_theirs(rig):
    ref = claim(rig, "alice", "lab-agents")
    cp = rig.gpuctl("dave", "stop", "--session", "lab-agents")
    refused(cp, EXIT_NOT_YOURS)
    assert f"session 'lab-agents' is {rig.login('alice')}'s (1 claim(s), 0 booking(s)), " \
        "not yours" in cp.stderr
    assert f"--user {rig.login('alice')} --reason" in cp.stderr
    assert ref in claims(rig)
    refused(rig.gpuctl("dave", "stop", "--session", "lab-agentz"), EXIT_NO_SUCH_CLAIM)


def test_an_administrator_stops_all_of_a_users_sessions_with_a_reason(rig):
    refs = {claim(rig, "alice", "agents"), claim(rig, "alice", "notebook")}
    daves = claim(rig, "dave", "agents")
    user = rig.login("alice")
    refused(rig.gpuctl("carol", "stop", "--user", user), EXIT_USAGE)  # no reason given
    assert refs <= set(claims(rig))

    dry = json.loads(ok(rig.gpuctl("carol", "stop", "--user", user, "--reason", "runaway",
                                   "--dry-run", "--json")))
    assert dry["dry_run"] and set(dry["claims"]) == refs and refs <= set(claims(rig))

    out = rig.gpuctl("carol", "stop", "--user", user, "--reason", "runaway agents")
    ok(out)
    assert "stopped 2 claim(s)" in out.stderr
    assert set(claims(rig)) == {daves}
