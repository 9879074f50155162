"""Who may do what on a shared machine: the real bus policy, polkitd, .policy and .rules.

The matrix (users from conftest: alice and dave are in the access group, bob is not,
carol administers; the daemon runs as the ``resourced`` account). Every cell is proven
twice: by gpuctl's exit code, and by the D-Bus error name a plain client gets.

| caller      | claim | release own | release others' | others' owner pid | read | unlisted |
|-------------|-------|-------------|-----------------|-------------------|------|----------|
| alice, dave | 0     | 0           | 8 IAR           | 7 NotProcessOwner | 0    | AD (bus) |
| bob         | 8 AD  | -           | 8 IAR           | -                 | 0    | AD (bus) |
| carol       | 0     | -           | 0               | -                 | 0    | AD (bus) |
| root        | 0     | 0           | 0               | 0 (any pid)       | 0    | AD (bus) |

AD: org.freedesktop.DBus.Error.AccessDenied (from polkit's "no", via the daemon, or from
the bus itself: "unlisted" is an interface our bus policy does not list, which no gpuctl
command calls).
IAR: org.freedesktop.DBus.Error.InteractiveAuthorizationRequired (release-other is
auth_admin_keep: polkit answers with a challenge). "release others'" covers release,
release --force and release --force --gpu.

(carol is not in the access group: org.resourced.manage implies org.resourced.claim. Root
is no exception to the bus policy: an interface it does not list is refused to uid 0 too.)

Only ``resourced`` and root may own ``org.resourced``; the bus refuses it to anyone else
(AccessDenied). Reload (org.resourced.manage) is for carol and root.

With polkitd stopped, claims and admin releases are AccessDenied (fail closed); owners
still release their own claims and root still does everything.
"""

import json
import pwd
import re
from pathlib import Path

import pytest

from .conftest import (
    BUS_NAME,
    MANAGER_IFACE,
    MANAGER_PATH,
    NGPUS,
    POLKIT_NAME,
    ok,
    proc_ids,
    refused,
)

pytestmark = pytest.mark.usefixtures("clean_claims")

ACCESS_DENIED = "org.freedesktop.DBus.Error.AccessDenied"
INTERACTIVE = "org.freedesktop.DBus.Error.InteractiveAuthorizationRequired"
NOT_PROCESS_OWNER = "org.resourced.Error.NotProcessOwner"
EXIT_NOT_YOURS = 7
EXIT_ACCESS_DENIED = 8
MEMBERS = ("alice", "dave")
EVERYONE = ("alice", "dave", "bob", "carol", "root")


def error_name(result: dict) -> str | None:
    return result.get("error")


def claim(rig, key: str, gpus: int = 1, owner: str | None = None) -> str:
    """A development claim by ``key`` through gpuctl; returns its reference."""
    pid = rig.sleepers[owner or key]
    return ok(rig.gpuctl(key, "claim", "--gpus", gpus, "--owner-pid", pid,
                         "--task-name", f"{key}'s task")).strip()


def claim_body(rig, owner: str, gpus: int = 1) -> tuple:
    return (gpus, {"Mode": ("s", "dev"), "OwnerPID": ("u", rig.sleepers[owner])})


def status(rig) -> dict:
    return json.loads(ok(rig.gpuctl("root", "status", "--json")))


def claim_ids(rig) -> set[str]:
    return {c["id"] for c in status(rig)["claims"]}


def gpu_of(rig, ref: str) -> str:
    return next(c["gpus"][0] for c in status(rig)["claims"] if c["id"] == ref)


# -- the set-up itself -------------------------------------------------------------------
def test_daemon_runs_as_the_service_account(rig):
    pid = rig.procs["resourced"].pid
    uids, gids = proc_ids(pid)
    assert uids == [rig.service.pw_uid] * 4
    assert gids == [rig.service.pw_gid] * 4
    # The process that owns org.resourced on the bus is that one, with that uid.
    owner = rig.name_owner(BUS_NAME)
    assert rig.bus_call("GetConnectionUnixProcessID", "s", (owner,))[0] == pid
    assert rig.bus_call("GetConnectionUnixUser", "s", (BUS_NAME,))[0] == rig.service.pw_uid
    # It runs the venv's installed package, not the checkout.
    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    assert cmdline[0].decode() == str(rig.venv / "bin/python")
    found = rig.run_as(None, ["setpriv", f"--reuid={rig.service.pw_uid}",
                              f"--regid={rig.service.pw_gid}", "--init-groups", "--",
                              str(rig.venv / "bin/python"), "-c",
                              "import resourced; print(resourced.__file__)"])
    assert ok(found).strip().startswith(str(rig.venv / "lib")), found.stdout


def test_polkitd_is_real_and_unprivileged(rig):
    uid = rig.bus_call("GetConnectionUnixUser", "s", (POLKIT_NAME,))[0]
    assert pwd.getpwuid(uid).pw_name == "polkitd"


@pytest.mark.parametrize("key", ["alice", "bob", "carol"])
def test_only_the_service_account_or_root_may_own_the_name(rig, key):
    result = rig.call(key, "RequestName", "su", ("org.resourced", 4), dest="org.freedesktop.DBus",
                      path="/org/freedesktop/DBus", iface="org.freedesktop.DBus")
    assert error_name(result) == ACCESS_DENIED, result
    # A name of its own, not in any policy, is refused as well (default deny).
    result = rig.call(key, "RequestName", "su", ("org.resourced.Fake", 4),
                      dest="org.freedesktop.DBus", path="/org/freedesktop/DBus",
                      iface="org.freedesktop.DBus")
    assert error_name(result) == ACCESS_DENIED, result


def test_root_may_ask_for_the_name(rig):
    # DO_NOT_QUEUE (4), no REPLACE_EXISTING: the policy lets root ask; the daemon keeps it.
    result = rig.call("root", "RequestName", "su", ("org.resourced", 4),
                      dest="org.freedesktop.DBus", path="/org/freedesktop/DBus",
                      iface="org.freedesktop.DBus")
    assert result == {"ok": [3]}, result  # DBUS_REQUEST_NAME_REPLY_EXISTS
    assert rig.bus_call("GetConnectionUnixUser", "s", (BUS_NAME,))[0] == rig.service.pw_uid


# -- claims ------------------------------------------------------------------------------
@pytest.mark.parametrize("key", MEMBERS)
def test_member_claims_and_releases_their_own(rig, key):
    ref = claim(rig, key)
    record = next(c for c in status(rig)["claims"] if c["id"] == ref)
    assert (record["user"], record["uid"]) == (rig.login(key), rig.uid(key))
    assert record["owner_pid"] == rig.sleepers[key] and record["owner_alive"]
    ok(rig.gpuctl(key, "release", "--allocation", ref))
    assert ref not in claim_ids(rig)

    # The same through the bus: no error name at all.
    result = rig.call(key, "Claim", "ua{sv}", claim_body(rig, key))
    assert "error" not in result, result
    ref = result["ok"][0]
    assert rig.call(key, "Release", "st", (ref, 0)) == {"ok": [[]]}
    assert ref not in claim_ids(rig)


@pytest.mark.parametrize("key", MEMBERS)
def test_member_runs_a_command(rig, key):
    cp = rig.gpuctl(key, "run", "--gpus", 2, "--", "sh", "-c",
                    'echo "$CUDA_VISIBLE_DEVICES"; id -un')
    out = ok(cp).split()
    assert out[0].count("GPU-") == 2 and out[1] == rig.login(key)
    assert status(rig)["free"] == NGPUS


def test_member_release_by_gpu_of_their_own(rig):
    ref = claim(rig, "alice")
    cp = rig.gpuctl("alice", "release", "--force", "--gpu", gpu_of(rig, ref))
    ok(cp)
    assert f"released {ref}" in cp.stderr
    assert ref not in claim_ids(rig)


def test_outsider_cannot_claim(rig):
    refused(rig.gpuctl("bob", "claim", "--gpus", 1, "--owner-pid", rig.sleepers["bob"]),
            EXIT_ACCESS_DENIED)
    refused(rig.gpuctl("bob", "run", "--", "true"), EXIT_ACCESS_DENIED)
    result = rig.call("bob", "Claim", "ua{sv}", claim_body(rig, "bob"))
    assert error_name(result) == ACCESS_DENIED, result
    assert "org.resourced.claim" in result["message"]  # polkit's no, not the bus's
    assert status(rig)["claims"] == []


RELEASES = {
    # how: (gpuctl arguments, the bus call) given the claim's ref and GPU
    "release": (lambda ref, gpu: ["release", "--allocation", ref],
                lambda ref, gpu: ("Release", "st", (ref, 0))),
    "release --force": (lambda ref, gpu: ["release", "--allocation", ref, "--force"],
                        lambda ref, gpu: ("Release", "st", (ref, 1))),
    "release --force --gpu": (lambda ref, gpu: ["release", "--force", "--gpu", gpu],
                              lambda ref, gpu: ("ReleaseGPU", "ss", (gpu, "test"))),
}


@pytest.mark.parametrize("how", list(RELEASES))
@pytest.mark.parametrize("key", ["dave", "bob"])
def test_cannot_release_another_users_claim(rig, key, how):
    ref = claim(rig, "alice")
    gpu = gpu_of(rig, ref)
    args, call = RELEASES[how]
    refused(rig.gpuctl(key, *args(ref, gpu)), EXIT_ACCESS_DENIED)
    # release-other is auth_admin_keep: polkit answers with a challenge, not a plain no.
    result = rig.call(key, *call(ref, gpu))
    assert error_name(result) == INTERACTIVE, result
    assert ref in claim_ids(rig)


@pytest.mark.parametrize("how", list(RELEASES))
def test_administrator_releases_another_users_claim(rig, how):
    args, call = RELEASES[how]
    ref = claim(rig, "alice")
    ok(rig.gpuctl("carol", *args(ref, gpu_of(rig, ref))))
    assert ref not in claim_ids(rig)
    ref = claim(rig, "dave")
    result = rig.call("carol", *call(ref, gpu_of(rig, ref)))
    assert "error" not in result, result
    assert ref not in claim_ids(rig)


def test_administrator_may_claim(rig):
    # carol is not in the access group, but org.resourced.manage implies org.resourced.claim.
    ref = claim(rig, "carol")
    assert next(c for c in status(rig)["claims"] if c["id"] == ref)["user"] == rig.login("carol")
    ok(rig.gpuctl("carol", "release", "--allocation", ref))


def test_a_priority_above_the_bound_needs_the_administrators_action(rig):
    """A member's priority above max_priority (100 by default) is refused, saying so; it
    would go ahead of everyone's waiters and ask reclaimable leases back. An
    administrator (manage) may ask it; up to the bound, anyone."""
    pid = rig.sleepers["alice"]
    high = rig.gpuctl("alice", "claim", "--gpus", 1, "--priority", 101, "--owner-pid", pid)
    refused(high, EXIT_ACCESS_DENIED)
    assert "priority 101 is above max_priority (100)" in high.stderr, high.stderr
    assert status(rig)["claims"] == []
    ref = ok(rig.gpuctl("alice", "claim", "--gpus", 1, "--priority", 100, "--owner-pid",
                        pid)).strip()
    admin = ok(rig.gpuctl("carol", "claim", "--gpus", 1, "--priority", 1000, "--owner-pid",
                          rig.sleepers["carol"])).strip()
    assert {c["id"] for c in status(rig)["claims"]} == {ref, admin}


@pytest.mark.parametrize("owner", ["bob", "dave", "root"])
def test_cannot_name_another_users_process_as_owner(rig, owner):
    refused(rig.gpuctl("alice", "claim", "--gpus", 1, "--owner-pid", rig.sleepers[owner]),
            EXIT_NOT_YOURS)
    result = rig.call("alice", "Claim", "ua{sv}", claim_body(rig, owner))
    assert error_name(result) == NOT_PROCESS_OWNER, result
    assert status(rig)["claims"] == []


NOT_CLAIM_OWNER = "org.resourced.Error.NotClaimOwner"


@pytest.mark.parametrize("key", ["dave", "bob"])
def test_nobody_runs_on_or_takes_the_environment_of_another_users_claim(rig, key):
    """One GPU to two users: what gpuctl run/env --allocation did with someone else's
    claim, since GetGrant had no owner check."""
    ref = claim(rig, "alice")
    whose = f"{ref} is {rig.login('alice')}'s claim"
    for args in (["run", "--allocation", ref, "--", "sh", "-c", "echo RAN"],
                 ["env", "--allocation", ref]):
        cp = rig.gpuctl(key, *args)
        refused(cp, EXIT_NOT_YOURS)
        assert whose in cp.stderr and "RAN" not in cp.stdout and "GPU-" not in cp.stdout
    result = rig.call(key, "GetGrant", "s", (ref,))
    assert error_name(result) == NOT_CLAIM_OWNER and whose in result["message"], result
    assert "error" not in rig.call(key, "GetClaim", "s", (ref,))  # reading stays open
    assert ok(rig.gpuctl("alice", "env", "--allocation", ref)).count("GPU-") >= 1


def test_an_administrator_takes_another_users_claim_environment_saying_so(rig):
    ref = claim(rig, "alice")
    cp = rig.gpuctl("carol", "env", "--allocation", ref)
    assert "GPU-" in ok(cp)
    assert f"{ref} is {rig.login('alice')}'s claim: you use it as an administrator" in cp.stderr


# -- reading -----------------------------------------------------------------------------
@pytest.mark.parametrize("key", EVERYONE)
def test_everyone_can_read(rig, key):
    refs = {claim(rig, "alice"): "alice", claim(rig, "dave", gpus=2): "dave"}
    text = ok(rig.gpuctl(key, "status"))
    for ref, owner in refs.items():
        line = next(line for line in text.splitlines() if ref in line)
        assert rig.login(owner) in line.split(), text
    assert f"1 of {NGPUS} GPU(s) free" in text
    data = json.loads(ok(rig.gpuctl(key, "status", "--json")))
    assert {c["id"]: c["user"] for c in data["claims"]} == {
        ref: rig.login(owner) for ref, owner in refs.items()}
    assert ok(rig.gpuctl(key, "free")).strip() == "1"
    assert json.loads(ok(rig.gpuctl(key, "free", "--json"))) == {"schema": 2, "free": 1}
    report = json.loads(ok(rig.gpuctl(key, "verify", "--json")))
    assert report["problems"] is False and len(report["gpus"]) == NGPUS
    assert {r["claim"] for r in report["gpus"]} == {*refs, ""}
    # And the bus calls behind them: no error names.
    for member in ("Describe", "ListClaims", "ListGPUs", "Verify"):
        result = rig.call(key, member)
        assert "error" not in result, (member, result)
    result = rig.call(key, "Get", "ss", (MANAGER_IFACE, "FreeGPUs"),
                      iface="org.freedesktop.DBus.Properties")
    assert result == {"ok": [["u", 1]]}, result


# -- the bus policy ----------------------------------------------------------------------
UNLISTED = [
    ("org.resourced.Secret", "Hello"),
    ("org.freedesktop.DBus.Debug.Stats", "GetStats"),
]


@pytest.mark.parametrize("iface,member", UNLISTED)
@pytest.mark.parametrize("key", ["alice", "bob", "carol", "root"])
def test_unlisted_interface_is_rejected_by_the_bus(rig, key, iface, member):
    # Root is no exception: dbus-daemon applies the send policy to uid 0 too.
    result = rig.call(key, member, iface=iface)
    assert error_name(result) == ACCESS_DENIED, result
    assert "Rejected send message" in result["message"], result  # the bus, not the daemon
    daemon = rig.procs["resourced"]
    assert daemon.poll() is None
    # busctl says the same, in its words.
    cp = rig.run_as(key, ["busctl", f"--address={rig.address}", "call", BUS_NAME, MANAGER_PATH,
                          iface, member])
    assert cp.returncode != 0 and "Access denied" in cp.stderr, cp


def test_busctl_as_a_user_reads_and_is_refused_like_the_client(rig):
    cp = rig.run_as("bob", ["busctl", f"--address={rig.address}", "get-property", BUS_NAME,
                            MANAGER_PATH, MANAGER_IFACE, "FreeGPUs"])
    assert ok(cp).strip() == f"u {NGPUS}"
    cp = rig.run_as("bob", ["busctl", f"--address={rig.address}", "call", BUS_NAME,
                            MANAGER_PATH, MANAGER_IFACE, "Claim", "ua{sv}", "1", "2",
                            "Mode", "s", "dev", "OwnerPID", "u", str(rig.sleepers["bob"])])
    assert cp.returncode != 0 and "Access denied" in cp.stderr, cp
    cp = rig.run_as("alice", ["busctl", f"--address={rig.address}", "call", BUS_NAME,
                              MANAGER_PATH, MANAGER_IFACE, "Claim", "ua{sv}", "1", "2",
                              "Mode", "s", "dev", "OwnerPID", "u", str(rig.sleepers["alice"])])
    ref = ok(cp).split()[1].strip('"')
    assert ref in claim_ids(rig)


# -- root and managing -------------------------------------------------------------------
def test_root_can_do_everything(rig):
    ref = claim(rig, "root", owner="bob")  # root may name anyone's process
    assert next(c for c in status(rig)["claims"] if c["id"] == ref)["user"] == "root"
    alice_ref = claim(rig, "alice")
    ok(rig.gpuctl("root", "release", "--allocation", alice_ref))
    alice_ref = claim(rig, "alice")
    ok(rig.gpuctl("root", "release", "--force", "--gpu", gpu_of(rig, alice_ref)))
    ok(rig.gpuctl("root", "release", "--allocation", ref, "--force"))
    assert claim_ids(rig) == set()
    ok(rig.gpuctl("root", "run", "--gpus", NGPUS, "--", "true"))
    result = rig.call("root", "Reload")
    assert "error" not in result, result


@pytest.mark.parametrize("key,expected", [
    ("alice", INTERACTIVE), ("bob", INTERACTIVE), ("carol", None), ("root", None)])
def test_only_administrators_reload(rig, key, expected):
    result = rig.call(key, "Reload")
    assert error_name(result) == expected, result


# -- polkit gone: fail closed --------------------------------------------------------------
def test_without_polkitd_claims_are_refused_not_granted(rig):
    alice_ref = claim(rig, "alice")
    dave_ref = claim(rig, "dave")
    rig.stop_polkitd()
    try:
        refused(rig.gpuctl("alice", "claim", "--gpus", 1, "--owner-pid", rig.sleepers["alice"]),
                EXIT_ACCESS_DENIED)
        result = rig.call("alice", "Claim", "ua{sv}", claim_body(rig, "alice"))
        assert error_name(result) == ACCESS_DENIED, result
        result = rig.call("bob", "Claim", "ua{sv}", claim_body(rig, "bob"))
        assert error_name(result) == ACCESS_DENIED, result
        # An administrator's release of another's claim needs polkit too.
        refused(rig.gpuctl("carol", "release", "--allocation", alice_ref), EXIT_ACCESS_DENIED)
        result = rig.call("carol", "Release", "st", (dave_ref, 0))
        assert error_name(result) == ACCESS_DENIED, result
        assert claim_ids(rig) == {alice_ref, dave_ref}
        # Owners need no polkit for their own claims, nor does root.
        ok(rig.gpuctl("alice", "release", "--allocation", alice_ref))
        ok(rig.gpuctl("root", "release", "--allocation", dave_ref))
        assert re.search(r"polkit .*org\.resourced\.claim.*; denying", rig.log("resourced"))
    finally:
        rig.start_polkitd()
    # Back: granted again.
    ok(rig.gpuctl("alice", "release", "--allocation", claim(rig, "alice")))
