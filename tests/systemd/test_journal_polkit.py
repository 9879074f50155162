"""What the service tells the journal, and who polkit lets in, on the installed service:
a claim's story found with ``journalctl RESOURCED_CLAIM=<ref> -o json``, a check's level
changes with ``RESOURCED_CHECK=<name>``; a member of the access group claims, an outsider
is refused (polkitd started by the bus, as a unit, with the .policy and .rules that
``service enable --system`` installed)."""

import json

from .harness import AUDIT_MESSAGE_ID, CONFIG, UNIT


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

    # Its owner exits (seen through a pidfd): a dev claim stays, marked dead, until released.
    pid = owner("alice")
    ref = service.claim("alice", pid, "--gpus", "1")
    ns.run("kill", str(pid))
    _story(ns, ref, ["granted", "owner-died"])
    ns.gpuctl("release", "--allocation", ref, user=service.login("alice"))
    granted, died, released = _story(ns, ref, ["granted", "owner-died", "released"])
    for entry in (died, released):
        _from_the_daemon(ns, entry)
        assert entry["RESOURCED_UID"] == uid
        assert entry["RESOURCED_GPU"] == granted["RESOURCED_GPU"]
    assert died["PRIORITY"] == "5"
    assert died["MESSAGE"] == f"owner {pid} of {ref} exited"
    assert released["RESOURCED_REASON"] == "released"


def test_health_level_changes_in_the_journal(service):
    """A RAM check whose limit a reload moves below the machine's use, then back above:
    STOP (a warning), then OK (a notice), each once, from the daemon."""
    ns = service.ns
    original = ns.run("cat", CONFIG).stdout
    name = "sdt-journal-ram"

    def changes(count: int):
        found = ns.journal(f"RESOURCED_CHECK={name}")
        return found if len(found) >= count else None

    try:
        for limit, count in ((0.01, 1), (99.99, 2)):
            ns.write(CONFIG, original + f'\n[[check]]\nname = "{name}"\ntype = "ram"\n'
                                        f"stop_used_pct = {limit}\n")
            ns.systemctl("reload", UNIT)
            ns.wait_for(lambda n=count: changes(n), 10, f"level change {count} of {name}")
    finally:
        ns.write(CONFIG, original)
        ns.systemctl("reload", UNIT)
    stop, ok = changes(2)
    for entry in (stop, ok):
        _from_the_daemon(ns, entry)
    # A new check is "not measured yet" (UNAVAILABLE) until its first reading.
    assert (stop["RESOURCED_OLD_LEVEL"], stop["RESOURCED_LEVEL"]) == ("UNAVAILABLE", "STOP")
    assert stop["PRIORITY"] == "4"
    assert stop["RESOURCED_REASON"].startswith("used ")
    assert stop["MESSAGE"] == f"check {name}: UNAVAILABLE -> STOP ({stop['RESOURCED_REASON']})"
    assert (ok["RESOURCED_OLD_LEVEL"], ok["RESOURCED_LEVEL"]) == ("STOP", "OK")
    assert ok["PRIORITY"] == "5"


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
    assert "may not claim GPUs on this machine (polkit action org.resourced.claim)" in \
        refused.stderr
    # Reading needs no authorization.
    status = json.loads(ns.gpuctl("status", "--json", user=bob).stdout)
    assert [c["id"] for c in status["claims"]] == [ref]
    # The answers came from polkitd itself: started by the bus, as a unit, with our files.
    polkit = ns.show("polkit.service", "ActiveState", "MainPID")
    assert polkit["ActiveState"] == "active"
    assert ns.run("stat", "-c", "%U", f"/proc/{polkit['MainPID']}").stdout.strip() == "polkitd"
    rules = ns.run("cat", "/etc/polkit-1/rules.d/50-resourced.rules").stdout
    assert 'subject.isInGroup("resourced")' in rules
