"""The claims log: what was recorded comes back, torn or damaged files never crash it."""

import json
import os

import pytest

from resourced.core.claims import Claim, ProcessRef
from resourced.core.ledger import ClaimGranted, ClaimReleased, OwnerDied
from resourced.store import ClaimStore, StoreError, prepare_runtime_dir

BOOT = "boot-a"


def claim(i: int, **kw) -> Claim:
    base = dict(id=f"c{i}", mode="dev", gpus=(f"GPU-{i}",), owner=ProcessRef(100 + i, 5),
                uid=1000, user="ann", label="", task_name="", created_usec=1)
    return Claim(**{**base, **kw})


def test_recorded_changes_come_back_after_restart(tmp_path):
    s = ClaimStore(tmp_path / "run", BOOT)
    assert s.load() == {}
    a, b, c = claim(1), claim(2), claim(3)
    s.record([ClaimGranted(a)], {"c1": a})
    s.record([ClaimGranted(b), ClaimGranted(c)], {"c1": a, "c2": b, "c3": c})
    s.record([ClaimReleased(b, "released")], {"c1": a, "c3": c})
    s.record([OwnerDied(c)], {"c1": a, "c3": c})
    s.close()
    restored = ClaimStore(tmp_path / "run", BOOT).load()
    assert sorted(restored) == ["c1", "c3"]
    assert restored["c1"] == a
    assert restored["c3"].owner_alive is False


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
    assert list(ClaimStore(tmp_path / "run", BOOT).load()) == ["c1"]


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


def test_an_unreadable_header_starts_empty_and_sets_the_file_aside(tmp_path):
    run = prepare_runtime_dir(tmp_path / "run")
    (run / "claims.log").write_bytes(b"\x00\xff not json\n")
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
