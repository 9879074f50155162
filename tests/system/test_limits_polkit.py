"""Limits on a shared machine, end to end: the rig's daemon reloaded with
``max_gpus_per_session = 1``, and a member of the access group (alice, from conftest)
refused with exit 12 and the setting named when one of her sessions would pass it, while
her other sessions are not held back by it."""

import json

import pytest

from .conftest import BUS_NAME, MANAGER_IFACE, MANAGER_PATH, NGPUS, ok, refused

pytestmark = pytest.mark.usefixtures("clean_claims")

EXIT_LIMIT = 12


def reload(rig) -> list[str]:
    """Reload the daemon's configuration (as root); the keys applied."""
    applied, _ = rig.root_call(BUS_NAME, MANAGER_PATH, MANAGER_IFACE, "Reload")
    return applied


@pytest.fixture
def one_gpu_per_session(rig):
    """The rig's daemon with ``max_gpus_per_session = 1``; its configuration put back
    (and reloaded) afterwards, also after a failure."""
    config = rig.dir / "config.toml"
    before = config.read_text()
    config.write_text("[daemon]\nmax_gpus_per_session = 1\n")
    try:
        assert "daemon.max_gpus_per_session" in reload(rig)
        yield
    finally:
        config.write_text(before)
        reload(rig)


@pytest.mark.usefixtures("one_gpu_per_session")
def test_a_session_at_its_gpu_limit_is_refused_naming_the_limit_and_another_is_not(rig):
    def claim(*args, env=None):
        return rig.gpuctl("alice", "claim", "--gpus", 1, "--owner-pid", rig.sleepers["alice"],
                          *args, env=env)

    first = ok(claim("--session", "agents")).strip()
    over = claim(env={"RESOURCED_SESSION": "agents"})  # the session, as sub-agents inherit it
    refused(over, EXIT_LIMIT)
    assert "max_gpus_per_session" in over.stderr and "session agents" in over.stderr
    refused(claim("--session", "agents", "--dry-run"), EXIT_LIMIT)  # the same admission
    other = ok(claim("--session", "notebook")).strip()

    held = json.loads(ok(rig.gpuctl("alice", "sessions", "--json")))
    assert {s["session"]: s["claims"] for s in held} == {"agents": [first], "notebook": [other]}


def test_by_default_no_member_books_the_whole_machine_for_the_whole_horizon(rig):
    """4 GPUs, the 30-day horizon: 720 GPU-hours a member may have booked; 5 bookings of
    every GPU for 7 days took the whole horizon before."""
    limits = json.loads(ok(rig.gpuctl("alice", "status", "--json")))["limits"]
    assert limits["max_booked_gpu_hours_per_user"] == NGPUS * 30 * 24 / 4
    first = ok(rig.gpuctl("alice", "book", "--gpus", NGPUS, "--for", "7d")).strip()
    try:
        cp = rig.gpuctl("alice", "book", "--gpus", NGPUS, "--for", "7d")
        refused(cp, EXIT_LIMIT)
        assert "max_booked_gpu_hours_per_user" in cp.stderr
        # another member still books what is left
        daves = ok(rig.gpuctl("dave", "book", "--gpus", NGPUS, "--for", "7d"))
        ok(rig.gpuctl("dave", "cancel", daves.strip()))
    finally:
        ok(rig.gpuctl("alice", "cancel", first))
