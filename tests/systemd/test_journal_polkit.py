"""What the service tells the journal, and who polkit lets in, on the installed service:
a claim's story found with ``journalctl RESOURCED_CLAIM=<ref> -o json``; a member of the
access group claims, an outsider is refused (polkitd started by the bus, as a unit, with
the .policy and .rules that ``service enable --system`` installed)."""

import json

from .harness import AUDIT_MESSAGE_ID, UNIT


def _story(ns, ref: str, events: list[str]) -> list[dict]:
    """The claim's audit entries once all of ``events`` are in (they follow the reply)."""
    def entries():
        found = ns.journal(f"RESOURCED_CLAIM={ref}")
        return found if [e.get("RESOURCED_EVENT") for e in found] == events else None

    return ns.wait_for(entries, 10, f"the journal's story of {ref}: {events}")


def _from_the_daemon(ns, entry: dict) -> None:
    main_pid = ns.show(UNIT, "MainPID")["MainPID"]
    assert entry["_SYSTEMD_UNIT"] == UNIT
    assert entry["_PID"] == main_pid
    assert entry["_UID"] == str(ns.ids["resourced"])
    assert entry["SYSLOG_IDENTIFIER"] == "resourced"
    assert entry["MESSAGE_ID"] == AUDIT_MESSAGE_ID


def test_a_claims_story_in_the_journal(service, owner):
    ns = service.ns
    uid = str(service.uid("alice"))
    ref = service.claim("alice", owner("alice"), "--gpus", "1")
    ns.gpuctl("release", "--allocation", ref, user=service.login("alice"))
    granted, released = _story(ns, ref, ["granted", "released"])
    for entry in (granted, released):
        _from_the_daemon(ns, entry)
        assert entry["RESOURCED_UID"] == uid
        assert entry["PRIORITY"] == "5"  # notice
    assert granted["MESSAGE"].startswith(f"granted {ref} (dev, 1 GPU(s)) to sdt-alice")
    assert granted["RESOURCED_GPU"].startswith("GPU-")
    assert released["RESOURCED_GPU"] == granted["RESOURCED_GPU"]
    assert released["RESOURCED_REASON"] == "released"

    # Forced by the administrator: a warning that names who and why.
    ref = service.claim("alice", owner("alice"), "--gpus", "1")
    gpu = ns.claims()[ref]["gpus"][0]
    ns.gpuctl("release", "--gpu", gpu, "--force", "--reason", "sdt: the admin needs it")
    granted, forced, released = _story(ns, ref, ["granted", "forced-release", "released"])
    for entry in (granted, forced, released):
        _from_the_daemon(ns, entry)
        assert entry["RESOURCED_UID"] == uid  # the claim's owner
    assert forced["PRIORITY"] == "4"
    assert forced["RESOURCED_REASON"] == "sdt: the admin needs it"
    assert "by uid 0" in forced["MESSAGE"]
    assert released["RESOURCED_REASON"] == "forced"


def test_polkit_lets_the_access_group_claim_and_refuses_outsiders(service, owner):
    ns = service.ns
    alice, bob = service.login("alice"), service.login("bob")
    assert "resourced" in ns.run("id", "-nG", alice).stdout.split()
    assert "resourced" not in ns.run("id", "-nG", bob).stdout.split()

    ref = service.claim("alice", owner("alice"), "--gpus", "1")
    assert ns.claims()[ref]["user"] == alice

    refused = ns.gpuctl("claim", "--gpus", "1", "--owner-pid", str(owner("bob")), user=bob,
                        check=False)
    assert refused.returncode == 8, refused  # access denied
    assert "not authorized for org.resourced.claim" in refused.stderr
    # Reading needs no authorization.
    status = json.loads(ns.gpuctl("status", "--json", user=bob).stdout)
    assert [c["id"] for c in status["claims"]] == [ref]
    # The answers came from polkitd itself: started by the bus, as a unit, with our files.
    polkit = ns.show("polkit.service", "ActiveState", "MainPID")
    assert polkit["ActiveState"] == "active"
    assert ns.run("stat", "-c", "%U", f"/proc/{polkit['MainPID']}").stdout.strip() == "polkitd"
    rules = ns.run("cat", "/etc/polkit-1/rules.d/50-resourced.rules").stdout
    assert 'subject.isInGroup("resourced")' in rules
