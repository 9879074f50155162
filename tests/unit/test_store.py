"""The claims log: what was recorded comes back, torn or damaged files never crash it."""

import dataclasses
import json
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from resourced.core.claims import MODES, Claim, Demand, ProcessRef
from resourced.core.ledger import (
    ClaimGranted,
    ClaimQueued,
    ClaimReleased,
    MembersChanged,
    OwnerDied,
    ReclaimAsked,
    ReclaimWithdrawn,
)
from resourced.core.lifecycle import GRANTED, QUEUED
from resourced.daemon.store.claims import (
    FORMAT,
    ClaimStore,
    claim_from_record,
    claim_to_record,
    prepare_runtime_dir,
)
from resourced.daemon.store.jsonlog import StoreError

BOOT = "boot-a"


def claim(i: int, **kw) -> Claim:
    base = {"id": f"c{i}", "mode": "dev", "demand": Demand.of(gpus=1), "gpus": (f"GPU-{i}",),
            "owner": ProcessRef(100 + i, 5), "uid": 1000, "user": "ann", "label": "",
            "task_name": "", "created_usec": 1, "seq": i}
    return Claim(**{**base, **kw})


def test_recorded_changes_come_back_after_restart(tmp_path):
    s = ClaimStore(tmp_path / "run", BOOT)
    assert s.load() == {}
    a, b, c = claim(1), claim(2), claim(3)
    s.record([ClaimGranted(a)], {"c1": a})
    s.record([ClaimGranted(b), ClaimGranted(c)], {"c1": a, "c2": b, "c3": c})
    s.record([ClaimReleased(b, "released")], {"c1": a, "c3": c})
    c.owner_alive, c.owner_died_usec = False, 77
    s.record([OwnerDied(c)], {"c1": a, "c3": c})
    s.close()
    restored = ClaimStore(tmp_path / "run", BOOT).load()
    assert sorted(restored) == ["c1", "c3"]
    assert restored["c1"] == a
    assert restored["c3"].owner_alive is False and restored["c3"].owner_died_usec == 77


def test_queued_claims_their_grant_and_reclaim_requests_come_back(tmp_path):
    s = ClaimStore(tmp_path / "run", BOOT)
    s.load()
    waiter = claim(1, state=QUEUED, gpus=(), priority=5, queue_deadline_usec=99,
                   demand=Demand.of(vram=8 << 30, pools={"cpu": 4}))
    model = claim(2, reclaimable=True, demand=Demand.of(pools={"ram": 1 << 30}), gpus=())
    other = claim(3, reclaimable=True, demand=Demand.of(vram=1 << 30))
    live = {c.id: c for c in (waiter, model, other)}
    s.record([ClaimGranted(model), ClaimGranted(other)], live)
    s.record([ClaimQueued(waiter)], live)
    model.reclaim_for = other.reclaim_for = waiter.id
    s.record([ReclaimAsked(model, waiter), ReclaimAsked(other, waiter)], live)
    other.reclaim_for = ""
    s.record([ReclaimWithdrawn(other)], live)
    s.close()
    s = ClaimStore(tmp_path / "run", BOOT)
    restored = s.load()
    assert restored == live
    assert restored["c1"].state == QUEUED and restored["c2"].reclaim_for == "c1"

    waiter.state, waiter.gpus, model.reclaim_for = GRANTED, ("GPU-0",), ""
    s.record([ClaimReleased(model, "released"), ClaimGranted(waiter)], {"c1": waiter, "c3": other})
    s.close()
    restored = ClaimStore(tmp_path / "run", BOOT).load()
    assert restored == {"c1": waiter, "c3": other}


def test_members_come_back(tmp_path):
    s = ClaimStore(tmp_path / "run", BOOT)
    s.load()
    a = claim(1)
    s.record([ClaimGranted(a)], {"c1": a})
    a.members = frozenset({ProcessRef(7, 70), ProcessRef(8, 80)})
    s.record([MembersChanged(a)], {"c1": a})
    s.close()
    assert ClaimStore(tmp_path / "run", BOOT).load()["c1"].members == a.members


def test_a_second_store_on_the_same_directory_is_refused(tmp_path):
    s = ClaimStore(tmp_path / "run", BOOT)
    with pytest.raises(StoreError, match="another resourced"):
        ClaimStore(tmp_path / "run", BOOT)
    s.close()
    ClaimStore(tmp_path / "run", BOOT).close()


def test_a_symlinked_runtime_directory_is_refused(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with pytest.raises(StoreError, match="symlink"):
        prepare_runtime_dir(tmp_path / "link")


def test_files_are_private(tmp_path):
    s = ClaimStore(tmp_path / "run", BOOT)
    s.load()
    assert os.stat(tmp_path / "run").st_mode & 0o777 == 0o700
    assert os.stat(s.path).st_mode & 0o077 == 0
    s.close()


def test_claims_from_another_boot_are_discarded(tmp_path):
    s = ClaimStore(tmp_path / "run", "old-boot")
    s.load()
    s.record([ClaimGranted(claim(1))], {"c1": claim(1)})
    s.close()
    assert ClaimStore(tmp_path / "run", BOOT).load() == {}


def test_a_torn_last_line_is_ignored(tmp_path):
    s = ClaimStore(tmp_path / "run", BOOT)
    s.load()
    s.record([ClaimGranted(claim(1))], {"c1": claim(1)})
    s.close()
    with open(s.path, "ab") as f:
        f.write(b'{"op": "grant", "claim": {"id": "c9"')  # a crash mid-write
    again = ClaimStore(tmp_path / "run", BOOT)
    assert list(again.load()) == ["c1"]
    assert b"c9" not in s.path.read_bytes()  # rewritten without it: appends follow whole lines
    c2 = claim(2)
    again.record([ClaimGranted(c2)], {"c1": claim(1), "c2": c2})
    again.close()
    assert list(ClaimStore(tmp_path / "run", BOOT).load()) == ["c1", "c2"]


def test_a_whole_log_is_kept_as_it_is_at_load(tmp_path):
    s = ClaimStore(tmp_path / "run", BOOT)
    s.load()
    live = {}
    for i in range(3):
        live[f"c{i}"] = claim(i)
        s.record([ClaimGranted(live[f"c{i}"])], dict(live))
    s.close()
    inode = os.stat(s.path).st_ino
    again = ClaimStore(tmp_path / "run", BOOT)
    assert again.load() == live
    assert os.stat(s.path).st_ino == inode  # not replaced by a snapshot of the same
    live["c3"] = claim(3)
    again.record([ClaimGranted(live["c3"])], dict(live))
    again.close()
    assert ClaimStore(tmp_path / "run", BOOT).load() == live


def test_a_kept_log_is_still_compacted_when_it_grows(tmp_path):
    s = ClaimStore(tmp_path / "run", BOOT)
    s.load()
    a = claim(1)
    for _ in range(100):  # churn the next daemon reads and keeps
        s.record([ClaimGranted(a)], {"c1": a})
        s.record([ClaimReleased(a, "released")], {})
    s.close()
    again = ClaimStore(tmp_path / "run", BOOT)
    assert again.load() == {}
    assert s.path.read_bytes().count(b"\n") == 201  # kept: header and churn
    for i in range(60):
        c = claim(i)
        again.record([ClaimGranted(c)], {c.id: c})
        again.record([ClaimReleased(c, "released")], {})
    assert s.path.read_bytes().count(b"\n") < 201  # past 2 x live + slack: compacted
    again.close()
    assert ClaimStore(tmp_path / "run", BOOT).load() == {}


def test_a_corrupt_file_is_moved_aside_and_the_trusted_part_kept(tmp_path):
    s = ClaimStore(tmp_path / "run", BOOT)
    s.load()
    s.record([ClaimGranted(claim(1))], {"c1": claim(1)})
    s.close()
    with open(s.path, "ab") as f:
        f.write(b"garbage\n")
        f.write(json.dumps({"op": "grant", "claim": {"id": "c2"}}).encode() + b"\n")
    restored = ClaimStore(tmp_path / "run", BOOT).load()
    assert list(restored) == ["c1"]
    assert [p.name for p in (tmp_path / "run").glob("claims.log.corrupt-*")]


EMPTY_DEMAND = {"gpus": 0, "vram": 0, "pools": []}


@pytest.mark.parametrize("bad", [
    {"op": "grant", "claim": {"id": "c2"}},                       # fields missing
    {"op": "grant", "claim": {**claim_to_record(claim(2)), "colour": "red"}},
    {"op": "grant", "claim": {**claim_to_record(claim(2)), "owner": [1, 2]}},
    {"op": "teleport", "id": "c1"},
    {"op": "release"},
    ["op", "grant"],
    None,
    {"op": "grant", "claim": {**claim_to_record(claim(2)), "demand": EMPTY_DEMAND}},
    {"op": "grant", "claim": {**claim_to_record(claim(2)), "demand": {**EMPTY_DEMAND, "gpus": -1}}},
])
def test_a_record_that_is_json_but_not_a_claim_sets_the_file_aside(tmp_path, bad):
    s = ClaimStore(tmp_path / "run", BOOT)
    s.load()
    s.record([ClaimGranted(claim(1))], {"c1": claim(1)})
    s.close()
    with open(s.path, "ab") as f:
        f.write(json.dumps(bad).encode() + b"\n")
        f.write(json.dumps({"op": "release", "id": "c1"}).encode() + b"\n")
    restored = ClaimStore(tmp_path / "run", BOOT).load()
    assert list(restored) == ["c1"]  # the release after the damage is not trusted either
    assert list((tmp_path / "run").glob("claims.log.corrupt-*"))


def test_an_unreadable_header_starts_empty_and_sets_the_file_aside(tmp_path):
    run = prepare_runtime_dir(tmp_path / "run")
    (run / "claims.log").write_bytes(b"\x00\xff not json\n")
    assert ClaimStore(run, BOOT).load() == {}
    assert list(run.glob("claims.log.corrupt-*"))


@pytest.mark.parametrize("header", [
    b"{}", b'{"format": 1, "boot_id": "boot-a"}', b'"claims"', b"[]", b"2", b"null",
])
def test_a_header_that_is_json_but_not_ours_starts_empty_and_sets_the_file_aside(tmp_path,
                                                                                  header):
    run = prepare_runtime_dir(tmp_path / "run")
    (run / "claims.log").write_bytes(header + b"\n")
    assert ClaimStore(run, BOOT).load() == {}
    assert list(run.glob("claims.log.corrupt-*"))


def test_a_log_in_the_previous_format_is_set_aside_not_misread(tmp_path):
    run = prepare_runtime_dir(tmp_path / "run")
    old = {"id": "c1", "mode": "dev", "gpus": ["GPU-0"], "owner": {"pid": 1, "start_time": 2},
           "uid": 1000, "user": "ann", "label": "", "task_name": "", "created_usec": 1,
           "owner_alive": True, "owner_died_usec": 0, "members": []}
    lines = [{"format": FORMAT - 1, "boot_id": BOOT}, {"op": "grant", "claim": old}]
    (run / "claims.log").write_bytes(b"".join(json.dumps(r).encode() + b"\n" for r in lines))
    assert ClaimStore(run, BOOT).load() == {}
    assert list(run.glob("claims.log.corrupt-*"))


def test_the_log_is_compacted_when_it_grows(tmp_path):
    s = ClaimStore(tmp_path / "run", BOOT)
    s.load()
    for i in range(1000):
        c = claim(i)
        s.record([ClaimGranted(c)], {c.id: c})
        s.record([ClaimReleased(c, "released")], {})
    lines = s.path.read_bytes().count(b"\n")
    assert lines < 600
    s.close()
    assert ClaimStore(tmp_path / "run", BOOT).load() == {}


# -- records round-trip ------------------------------------------------------------------

refs = st.builds(ProcessRef, st.integers(1, 2**22), st.integers(0, 2**63 - 1))
names = st.text(max_size=12)


@st.composite
def demands(draw) -> Demand:
    pools = draw(st.dictionaries(st.sampled_from(["cpu", "ram", "licences", "ünïcode"]),
                                 st.integers(1, 2**50), max_size=3))
    kind = draw(st.sampled_from(["gpus", "vram", "pools"] if pools else ["gpus", "vram"]))
    return Demand.of(gpus=draw(st.integers(1, 64)) if kind == "gpus" else 0,
                     vram=draw(st.integers(1, 2**45)) if kind == "vram" else 0, pools=pools)


claims = st.builds(
    Claim, id=names, mode=st.sampled_from(MODES), demand=demands(), owner=refs,
    uid=st.integers(0, 2**32 - 1), user=names, label=names, task_name=names,
    created_usec=st.integers(0, 2**62), priority=st.integers(-1000, 1000),
    reclaimable=st.booleans(), state=st.sampled_from([QUEUED, GRANTED]),
    seq=st.integers(0, 2**40), gpus=st.lists(names, max_size=4).map(tuple),
    owner_alive=st.booleans(), owner_died_usec=st.integers(0, 2**62),
    members=st.frozensets(refs, max_size=4), reclaim_for=names,
    queue_deadline_usec=st.integers(0, 2**62), reply_to=names,
    reply_serial=st.integers(0, 2**32 - 1),
)


@settings(max_examples=200, deadline=None)
@given(claims)
def test_every_claim_survives_a_trip_through_a_json_record(c):
    record = json.loads(json.dumps(claim_to_record(c)))
    assert claim_from_record(record) == c
    assert set(record) == {f.name for f in dataclasses.fields(Claim)}
