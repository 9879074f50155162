"""Usage accounting: the report adds up holds inside a window; the store keeps load in
minute, hour and day buckets and reads each sample once."""

import pytest

from resourced.backends import GpuLoad
from resourced.core.usage import Hold, bucket, report
from resourced.daemon.store.usage import UsageStore

H = 3600 * 1_000_000
DAY = 24 * H


def hold(i, uid=1000, gpus=("g0",), start=0, end=H, used=0, kind="claim"):
    return Hold(i, kind, uid, f"u{uid}", tuple(gpus), start, end, used)


def test_a_hold_counts_its_gpus_times_its_time_and_the_part_inside_the_window():
    rows = report([hold("a", gpus=("g0", "g1"), end=2 * H, used=H)], [], 0, 4 * H)
    assert rows == [{"uid": 1000, "user": "u1000", "claims": 1, "bookings": 0,
                     "held_gpu_hours": 4.0, "used_gpu_hours": 2.0, "booked_gpu_hours": 0.0,
                     "booked_used_gpu_hours": 0.0, "idle_gpu_hours": 2.0,
                     "booked_idle_gpu_hours": 0.0}]
    [half] = report([hold("a", end=2 * H, used=2 * H)], [], H, 4 * H)
    assert (half["held_gpu_hours"], half["used_gpu_hours"]) == (1.0, 1.0)
    assert report([hold("a", end=H)], [], 2 * H, 3 * H) == []


def test_bookings_are_counted_apart_and_per_gpu_rows_carry_the_mean_load():
    holds = [hold("b", kind="booking", gpus=("g0",)), hold("c", uid=1001, gpus=("g1",), used=H)]
    [alice, bob] = report(holds, [], 0, H)
    assert (alice["booked_gpu_hours"], alice["booked_idle_gpu_hours"]) == (1.0, 1.0)
    assert bob["booked_gpu_hours"] == 0.0 and bob["idle_gpu_hours"] == 0.0
    rows = report(holds, [("g0", 4, 200.0, 4 * 2**30)], 0, H, by_gpu=True, labels={"g0": "gpu0"})
    g0 = next(r for r in rows if r["uuid"] == "g0")
    assert (g0["gpu"], g0["mean_utilization_pct"], g0["mean_memory_used_bytes"]) == (
        "gpu0", 50.0, 2**30)
    assert next(r for r in rows if r["uuid"] == "g1")["mean_utilization_pct"] is None


def test_the_store_reads_every_sample_once_across_resolutions(tmp_path):
    store = UsageStore(tmp_path)
    start = bucket(1_796_000_000_000_000, 86400)  # midnight
    for minute in range(3 * 24 * 60):  # three days, a sample a minute
        store.record_load(start + minute * 60_000_000, {"g0": GpuLoad(10, 100)})
    [(gpu, samples, utilization, memory)] = store.loads(start + 90 * 60_000_000, start + 3 * DAY)
    assert (gpu, samples) == ("g0", 3 * 24 * 60 - 90)
    assert (utilization, memory) == (10 * samples, 100 * samples)


def test_pruning_keeps_what_each_retention_says(tmp_path):
    store = UsageStore(tmp_path)
    now = 100 * DAY
    store.record_load(now - 3 * DAY, {"g0": GpuLoad(1, 1)})
    store.record_holds([hold("old", start=0, end=now - 50 * DAY),
                        hold("new", start=now - H, end=now)])
    store.prune(now, {"minute": 2 * 86400, "hour": 90 * 86400, "day": 40 * 86400})
    resolutions = sorted(r for (r,) in store.db.execute("SELECT resolution FROM load"))
    assert resolutions == [3600, 86400]  # the minute row went, the hour and day stay
    assert [h.id for h in store.holds(0, now + 1)] == ["new"]


@pytest.mark.parametrize("uid, ids", [(None, {"a", "b"}), (1001, {"b"})])
def test_holds_are_found_by_window_and_user(tmp_path, uid, ids):
    store = UsageStore(tmp_path)
    store.record_holds([hold("a", start=0, end=H),
                        hold("b", uid=1001, start=H, end=2 * H, gpus=("g0", "g1"))])
    assert {h.id for h in store.holds(0, 3 * H, uid)} == ids
    assert store.holds(H, 2 * H, 1001)[0].gpus == ("g0", "g1")
