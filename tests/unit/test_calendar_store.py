"""The calendar log: what was recorded comes back after a restart; torn, damaged and
newer files are handled as the claims log handles them, and a newer schema is refused."""

import json

import pytest

from resourced.core.calendar import Blackout, BookingRequest, Calendar, Limits, Notice
from resourced.core.claims import Demand
from resourced.core.timeline import Timeline
from resourced.daemon.store.calendar import LOG_NAME, SCHEMA, CalendarStore
from resourced.daemon.store.jsonlog import StoreError

H = 3600 * 1_000_000
NOW = 1_800_000_000 * 1_000_000


def calendar() -> Calendar:
    return Calendar(Timeline({"g0": 16 << 30, "g1": 80 << 30}, {"cpu": 8}), Limits())


def test_bookings_blackouts_and_their_changes_come_back(tmp_path):
    cal, store = calendar(), CalendarStore(tmp_path)
    store.load()
    a, _, events = cal.book(BookingRequest(Demand.of(gpus=1, pools={"cpu": 2}), H, NOW + H,
                                           named=("g1",), label="a"), "a", 1000, "ada", NOW, "op-1")
    store.record(events)
    b, _, events = cal.book(BookingRequest(Demand.of(vram=8 << 30), 2 * H), "b", 1001, "bo", NOW)
    store.record(events)
    _, events = cal.cancel("b", 1001, NOW)
    store.record(events)
    maintenance = Blackout("m", NOW + 5 * H, NOW + 6 * H, "driver update")
    store.record([], blackout=maintenance)
    store.record([], blackout=Blackout("gone", NOW, NOW + H, "x"), unblackout="")
    store.record([], unblackout="gone")
    store.close()

    bookings, blackouts, _ = CalendarStore(tmp_path).load()
    assert bookings == {"a": a, "b": cal.bookings["b"]}
    assert bookings["b"].state == "ended" and bookings["a"].op_id == "op-1"
    assert blackouts == {"m": maintenance}


def test_a_torn_last_line_is_ignored_and_the_log_compacted(tmp_path):
    store = CalendarStore(tmp_path)
    store.load()
    store.record([], blackout=Blackout("m", NOW, NOW + H, "x"))
    store.close()
    with open(tmp_path / LOG_NAME, "a") as f:
        f.write('{"op": "blackout", "blackout": {"id": "half')
    _, blackouts, _ = CalendarStore(tmp_path).load()
    assert set(blackouts) == {"m"}
    lines = (tmp_path / LOG_NAME).read_text().splitlines()
    assert json.loads(lines[0]) == {"schema": SCHEMA} and len(lines) == 2


def test_a_whole_log_is_kept_as_it_is_at_load(tmp_path):
    store = CalendarStore(tmp_path)
    store.load()
    store.record([], blackout=Blackout("m", NOW, NOW + H, "x"))
    store.record([], unblackout="m")
    store.close()
    path = tmp_path / LOG_NAME
    inode, before = path.stat().st_ino, path.read_bytes()
    again = CalendarStore(tmp_path)
    assert again.load()[1] == {}
    assert (path.stat().st_ino, path.read_bytes()) == (inode, before)  # not rewritten
    again.record([], blackout=Blackout("n", NOW, NOW + H, "y"))
    again.close()
    assert set(CalendarStore(tmp_path).load()[1]) == {"n"}


def test_a_newer_schema_is_refused_not_guessed(tmp_path):
    (tmp_path / LOG_NAME).write_text(json.dumps({"schema": SCHEMA + 1}) + "\n")
    with pytest.raises(StoreError, match="written by a newer resourced"):
        CalendarStore(tmp_path).load()
    assert (tmp_path / LOG_NAME).exists()  # left as it is, for the newer version


def test_a_damaged_record_sets_the_file_aside(tmp_path):
    (tmp_path / LOG_NAME).write_text(json.dumps({"schema": SCHEMA}) + "\n"
                                     + json.dumps({"op": "nonsense"}) + "\n")
    assert CalendarStore(tmp_path).load() == ({}, {}, {})
    assert [p.name.split("-")[0] for p in tmp_path.glob(f"{LOG_NAME}.corrupt-*")] == [
        f"{LOG_NAME}.corrupt"]


def test_one_daemon_per_state_directory(tmp_path):
    first = CalendarStore(tmp_path)
    with pytest.raises(StoreError, match="another resourced is using state directory"):
        CalendarStore(tmp_path)
    first.close()


def test_notices_come_back_until_removed(tmp_path):
    store = CalendarStore(tmp_path)
    store.load()
    store.record([], notice=Notice("n1", "driver update at 18:00", NOW, NOW + H, 0))
    store.record([], notice=Notice("n2", "gone soon", NOW, 0, 0))
    store.record([], unnotice="n2")
    store.close()
    _, _, notices = CalendarStore(tmp_path).load()
    assert notices == {"n1": Notice("n1", "driver update at 18:00", NOW, NOW + H, 0)}
