"""Who may book, change and cancel what, on a shared machine: the real bus, polkitd and
the shipped policy and rules (users from conftest: alice and dave are in the access
group, bob is not, carol administers).

| caller      | book  | change/cancel own | change/cancel others' | cancel others' + reason | blackout |
|-------------|-------|-------------------|-----------------------|-------------------------|----------|
| alice, dave | 0     | 0                 | 8 IAR                 | 8 IAR                   | 8 IAR    |
| bob         | 8 AD  | -                 | 8 IAR                 | 8 IAR                   | 8 IAR    |
| carol       | 0     | -                 | 2 (needs a reason)    | 0, the owner sees why   | 0        |
"""

import json

import pytest

from .conftest import BUS_NAME, MANAGER_IFACE, MANAGER_PATH, ok, refused

ACCESS_DENIED = "org.freedesktop.DBus.Error.AccessDenied"
NOT_YOURS = "org.resourced.Error.NotClaimOwner"
EXIT_NOT_YOURS = 7
EXIT_USAGE, EXIT_ACCESS_DENIED = 2, 8


@pytest.fixture(autouse=True)
def no_bookings(rig):
    """Each test starts and ends with no live booking (root cancels them all)."""
    def cancel_all():
        for b in json.loads(rig.root_call(BUS_NAME, MANAGER_PATH, MANAGER_IFACE, "ListBookings",
                                          "a{sv}", ({"All": ("b", True)},))[0]):
            if b["state"] != "ended":
                rig.root_call(BUS_NAME, MANAGER_PATH, MANAGER_IFACE, "CancelBooking", "ssa{sv}",
                              (b["id"], "test clean-up", {}))
    cancel_all()
    yield
    cancel_all()


def book(rig, key: str, at: str = "+1h") -> str:
    return ok(rig.gpuctl(key, "book", "--gpus", 1, "--for", "1h", "--at", at)).strip()


def booking(rig, ref: str) -> dict:
    listed = json.loads(ok(rig.gpuctl("root", "bookings", "--all", "--json")))
    return next(b for b in listed if b["id"] == ref)


@pytest.mark.parametrize("key", ["alice", "dave", "carol"])
def test_members_and_administrators_book_and_cancel_their_own(rig, key):
    ref = book(rig, key)
    mine = json.loads(ok(rig.gpuctl(key, "bookings", "--json")))
    assert [b["id"] for b in mine] == [ref]
    assert mine[0]["user"] == rig.login(key) and mine[0]["state"] == "scheduled"
    ok(rig.gpuctl(key, "extend", ref, "--by", "30m"))
    ok(rig.gpuctl(key, "edit", ref, "--label", "mine"))
    ok(rig.gpuctl(key, "cancel", ref))
    assert booking(rig, ref)["ended"] == "cancelled"


def test_outsider_cannot_book(rig):
    refused(rig.gpuctl("bob", "book", "--gpus", 1, "--for", "1h", "--at", "+1h"),
            EXIT_ACCESS_DENIED)
    result = rig.call("bob", "Book", "a{sv}", ({"GPUs": ("u", 1),
                                                 "DurationUSec": ("t", 3_600_000_000)},))
    assert result.get("error") == ACCESS_DENIED, result
    listed = json.loads(ok(rig.gpuctl("root", "bookings", "--all", "--json")))
    assert [b for b in listed if b["state"] != "ended"] == []


@pytest.mark.parametrize("key", ["dave", "bob"])
@pytest.mark.parametrize("how", ["cancel", "extend", "edit"])
def test_nobody_else_changes_a_booking_without_the_administrators_action(rig, key, how):
    ref = book(rig, "alice")
    args = {"cancel": ["cancel", ref, "--reason", "mine now"],
            "extend": ["extend", ref, "--by", "1h"],
            "edit": ["edit", ref, "--label", "taken"]}[how]
    cp = rig.gpuctl(key, *args)
    refused(cp, EXIT_NOT_YOURS)
    assert f"{ref} is {rig.login('alice')}'s booking" in cp.stderr
    assert "org.resourced" not in cp.stderr  # said in words, not as polkit action ids
    result = rig.call(key, "CancelBooking", "ssa{sv}", (ref, "mine now", {}))
    assert result.get("error") == NOT_YOURS, result  # (manage is auth_admin_keep)
    after = booking(rig, ref)
    assert after["state"] == "scheduled" and after["label"] == "" and after["ended"] == ""


def test_an_administrator_cancels_with_a_reason_the_owner_then_sees(rig):
    ref = book(rig, "alice")
    refused(rig.gpuctl("carol", "cancel", ref), EXIT_USAGE)  # someone else's: a reason
    assert booking(rig, ref)["state"] == "scheduled"
    ok(rig.gpuctl("carol", "cancel", ref, "--reason", "the node goes to the vendor"))
    seen = json.loads(ok(rig.gpuctl("alice", "bookings", "--json")))
    mine = next(b for b in seen if b["id"] == ref)
    assert (mine["state"], mine["ended"]) == ("ended", "cancelled")
    assert mine["reason"] == "the node goes to the vendor"
    assert mine["ended_by"] == rig.users["carol"].pw_uid
    assert "the node goes to the vendor" in ok(rig.gpuctl("alice", "bookings"))


@pytest.mark.parametrize("key", ["alice", "bob"])
def test_only_administrators_block_time_and_post_notices(rig, key):
    refused(rig.gpuctl(key, "blackout", "add", "--from", "+2h", "--until", "+3h",
                       "--reason", "maintenance"), EXIT_ACCESS_DENIED)
    refused(rig.gpuctl(key, "notice", "add", "hello"), EXIT_ACCESS_DENIED)
    blackout = ok(rig.gpuctl("carol", "blackout", "add", "--from", "+2h", "--until", "+3h",
                             "--reason", "maintenance")).strip()
    refused(rig.gpuctl(key, "blackout", "remove", blackout), EXIT_ACCESS_DENIED)
    if key == "alice":
        refused(rig.gpuctl("alice", "book", "--gpus", 1, "--for", "30m", "--at", "+2h15m"), 3)
    ok(rig.gpuctl("carol", "blackout", "remove", blackout))
    assert json.loads(ok(rig.gpuctl(key, "blackout", "list", "--json"))) == []


def test_the_logs_of_another_users_booking_are_said_to_be_theirs(rig):
    ref = book(rig, "alice")
    cp = rig.gpuctl("dave", "logs", ref)
    refused(cp, EXIT_NOT_YOURS)
    assert f"booking {ref} is {rig.login('alice')}'s, not yours" in cp.stderr
    refused(rig.gpuctl("alice", "logs", ref), 6)  # hers, with no command: none to show
