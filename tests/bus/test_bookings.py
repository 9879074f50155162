"""Bookings end to end: a real daemon on the private bus, on a simulated clock.

The clock file holds *now* for the daemon and for the clients of this process (both read
``RESOURCED_SIMULATED_CLOCK``; the client only with ``RESOURCED_SIMULATED_GPUS`` set).
Time starts at 09:00 UTC on 1 December 2026 and moves only when a test rewrites the file;
the daemon looks at it at least once a second, so every effect of moving it is awaited
with ``eventually`` (bounded), never a fixed sleep.  Starts are absolute ISO instants.
"""

import asyncio
import os
import signal
import threading

import pytest

from resourced.client.aio import AsyncClient
from resourced.client.sync import Client
from resourced.errors import (
    InvalidArgs,
    NoSuchClaim,
    NotEnoughCapacity,
    NotEnoughGPUs,
    ResourcedError,
)

from ..conftest import eventually
from .conftest import CLOCK_TIMEOUT, NOW, at

G = 1024**3

def client() -> Client:
    return Client(timeout=5)


def status() -> dict:
    with client() as c:
        return c.status()


def all_bookings() -> list[dict]:
    with client() as c:
        return c.bookings(all_users=True)


def booking(ref: str) -> dict:
    with client() as c:
        return c.booking(ref)


def claim_of(ref: str) -> dict | None:
    return next((c for c in status()["claims"] if c["id"] == ref), None)


def gpu_states() -> dict[str, str]:
    return {g["uuid"]: g["state"] for g in status()["gpus"]}


def book(**kw) -> dict:
    """A booking that must be created; its record."""
    with client() as c:
        reply = c.book(**kw)
    assert reply["status"] == "created"
    return reply["booking"]


def unchanged(action, error=ResourcedError, match: str | None = None) -> ResourcedError:
    """``action`` is refused with ``error`` and leaves every booking as it was."""
    before = all_bookings()
    with pytest.raises(error, match=match) as caught:
        action()
    assert all_bookings() == before
    return caught.value


def assert_never_double_booked(bookings: list[dict]) -> None:
    """No GPU is booked whole by two live bookings at any instant."""
    spans = sorted((b["start_usec"], b["end_usec"], u) for b in bookings
                   if b["state"] != "ended" and not b["shared"] for u in b["gpu_uuids"])
    last_end: dict[str, int] = {}
    for start, end, uuid in spans:
        assert start >= last_end.get(uuid, 0), f"{uuid} booked twice at {start}"
        last_end[uuid] = end


def at_once(n: int, call) -> list:
    """``call(client, i)`` from ``n`` threads, each with its own client, released together;
    each one's result or ``ResourcedError``, in order."""
    barrier = threading.Barrier(n)
    results: list = [None] * n

    def one(i: int) -> None:
        with client() as c:
            c.ping()   # connected before the start
            barrier.wait(5)
            try:
                results[i] = call(c, i)
            except ResourcedError as exc:
                results[i] = exc

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(15)
    assert not any(t.is_alive() for t in threads)
    return results


# -- admission -----------------------------------------------------------------------------
def test_a_booking_is_listed_with_what_was_asked(clocked_daemon):
    clocked_daemon()
    b = book(duration="2h", gpus=2, start="2026-12-01T10:00:00Z", label="train",
             task_name="llm")
    assert b["state"] == "scheduled"
    assert (b["start_usec"], b["end_usec"]) == (at("2026-12-01T10:00:00Z"),
                                                at("2026-12-01T12:00:00Z"))
    assert b["created_usec"] == at(NOW)
    assert b["gpus_requested"] == 2 and len(b["gpus"]) == len(b["gpu_uuids"]) == 2
    assert len(set(b["gpu_indices"])) == 2
    assert (b["label"], b["task_name"], b["shared"], b["ended"]) == ("train", "llm", False, "")
    with client() as c:
        assert c.booking(b["id"]) == b
        assert [x["id"] for x in c.bookings()] == [b["id"]]
    assert status()["bookings_scheduled"] == 1
    # Booked for later: nothing is held now.
    assert set(gpu_states().values()) == {"free"}


def test_back_to_back_bookings_fit_and_an_overlap_does_not(clocked_daemon):
    clocked_daemon(gpus=1)
    first = book(duration="1h", gpus=1, start="2026-12-01T10:00:00Z")
    before = book(duration="1h", gpus=1, start="2026-12-01T09:00:00Z")  # ends as it starts
    after = book(duration="1h", gpus=1, start="2026-12-01T11:00:00Z")   # starts as it ends
    assert before["gpu_uuids"] == first["gpu_uuids"] == after["gpu_uuids"]
    for start in ("2026-12-01T10:59:59Z", "2026-12-01T09:00:01Z", "2026-12-01T10:30:00Z"):
        with client() as c:
            unchanged(lambda c=c, s=start: c.book("1h", gpus=1, start=s), NotEnoughCapacity)


def test_a_whole_gpu_is_never_booked_twice_at_once(clocked_daemon):
    clocked_daemon(gpus=4)
    three = book(duration="2h", gpus=3, start="2026-12-01T10:00:00Z")
    one = book(duration="2h", gpus=1, start="2026-12-01T11:00:00Z")
    assert not set(three["gpu_uuids"]) & set(one["gpu_uuids"])
    with client() as c:
        unchanged(lambda: c.book("1h", gpus=1, start="2026-12-01T11:30:00Z"), NotEnoughCapacity)
        # Named GPUs: a GPU of the three is taken then, another (before 11:00) is not.
        unchanged(lambda: c.book("30m", gpu_names=[three["gpu_uuids"][0]],
                                 start="2026-12-01T10:00:00Z"), NotEnoughCapacity)
    named = book(duration="1h", gpu_names=[one["gpu_uuids"][0]], start="2026-12-01T10:00:00Z")
    assert named["gpu_uuids"] == one["gpu_uuids"]


def test_vram_shares_are_admitted_by_what_is_held_at_each_instant(clocked_daemon):
    clocked_daemon(gpus=1)
    memory = status()["gpus"][0]["memory_bytes"]
    assert memory == 80 * G
    a = book(duration="1h", vram=50 * G, start="2026-12-01T10:00:00Z")
    b = book(duration="1h", vram=50 * G, start="2026-12-01T11:00:00Z")   # never with a
    assert a["shared"] and b["shared"] and a["vram_bytes"] == 50 * G
    # 10:30-11:30 meets 50G all along: 40G more is over 80G, 30G fits exactly.
    with client() as c:
        unchanged(lambda: c.book("1h", vram=40 * G, start="2026-12-01T10:30:00Z"),
                  NotEnoughCapacity)
    c30 = book(duration="1h", vram=30 * G, start="2026-12-01T10:30:00Z")
    with client() as c:
        unchanged(lambda: c.book("10m", vram=1 * G, start="2026-12-01T10:45:00Z"),
                  NotEnoughCapacity)
        # The whole GPU is not free while any share is on it.
        unchanged(lambda: c.book("30m", gpus=1, start="2026-12-01T11:45:00Z"), NotEnoughCapacity)
    # Back to back with the last share: whole again.
    whole = book(duration="1h", gpus=1, start="2026-12-01T12:00:00Z")
    assert whole["gpu_uuids"] == c30["gpu_uuids"] == a["gpu_uuids"]
    with client() as c:
        unchanged(lambda: c.book("10m", vram=1 * G, start="2026-12-01T12:30:00Z"),
                  NotEnoughCapacity)


def test_an_exclusive_vram_booking_takes_its_gpu_whole(clocked_daemon):
    clocked_daemon(gpus=1)
    ex = book(duration="1h", vram=10 * G, exclusive=True, start="2026-12-01T10:00:00Z")
    assert ex["exclusive"] is True and ex["shared"] is False and ex["vram_bytes"] == 10 * G
    with client() as c:
        unchanged(lambda: c.book("1h", vram=1 * G, start="2026-12-01T10:30:00Z"),
                  NotEnoughCapacity)
        unchanged(lambda: c.book("1h", vram=1 * G, exclusive=True,
                                 start="2026-12-01T10:30:00Z"), NotEnoughCapacity)
    # Not exclusive: two shares of the same GPU at once.
    s1 = book(duration="1h", vram=10 * G, start="2026-12-01T11:00:00Z")
    s2 = book(duration="1h", vram=10 * G, start="2026-12-01T11:00:00Z")
    assert s1["gpu_uuids"] == s2["gpu_uuids"]
    with client() as c:
        unchanged(lambda: c.book("1h", vram=10 * G, exclusive=True,
                                 start="2026-12-01T11:30:00Z"), NotEnoughCapacity)


def test_ten_racing_bookings_for_two_places_admit_exactly_two(clocked_daemon):
    clocked_daemon(gpus=4)
    for round_, start in enumerate(("2026-12-01T10:00:00Z", "2026-12-01T12:00:00Z",
                                    "2026-12-01T14:00:00Z")):
        results = at_once(10, lambda c, i, s=start, r=round_: c.book(
            "2h", gpus=2, start=s, label=f"r{r}-{i}"))
        won = [r for r in results if isinstance(r, dict)]
        lost = [r for r in results if not isinstance(r, dict)]
        assert len(won) == 2, results
        assert all(isinstance(r, NotEnoughCapacity) for r in lost), lost
        gpus = [u for r in won for u in r["booking"]["gpu_uuids"]]
        assert len(set(gpus)) == 4
        listed = [b for b in all_bookings() if b["start_usec"] == at(start)]
        assert sorted(b["id"] for b in listed) == sorted(r["booking"]["id"] for r in won)


def test_racing_earliest_fit_bookings_never_share_a_gpu(clocked_daemon):
    clocked_daemon(gpus=4)
    results = at_once(10, lambda c, i: c.book(
        "1h", gpus=2, start="2026-12-01T10:00:00Z" if i % 2 else None))
    assert all(isinstance(r, (dict, NotEnoughCapacity)) for r in results), results
    assert all(isinstance(r, dict) for r in results[::2]), results  # earliest fit: placed
    assert_never_double_booked(all_bookings())


def test_racing_retries_with_one_operation_id_make_one_booking(clocked_daemon):
    clocked_daemon(gpus=4)
    results = at_once(8, lambda c, i: c.book("1h", gpus=1, start="2026-12-01T10:00:00Z",
                                             op_id="same"))
    assert sorted(r["status"] for r in results) == ["created"] + ["exists"] * 7
    assert len({r["booking"]["id"] for r in results}) == 1
    assert len(all_bookings()) == 1


def test_earliest_fit_and_an_exact_start_that_names_the_nearest_fit(clocked_daemon):
    clocked_daemon(gpus=4)
    blocker = book(duration="1h", gpus=4, start="2026-12-01T10:00:00Z")
    with client() as c:
        slots = c.slots("1h", count=3, gpus=4)
        assert [s["start_usec"] for s in slots][:2] == [at(NOW), at("2026-12-01T11:00:00Z")]
        assert all(len(s["gpu_uuids"]) == 4 for s in slots)
        assert slots[0]["end_usec"] == at("2026-12-01T10:00:00Z")
    # Two hours from 09:00 meet the blocker: the earliest fit is when it ends.
    early = book(duration="2h", gpus=4)
    assert early["start_usec"] == blocker["end_usec"]
    # An exact start inside is refused, naming the nearest start that fits.
    with client() as c:
        err = unchanged(lambda: c.book("1h", gpus=2, start="2026-12-01T10:30:00Z"),
                        NotEnoughCapacity)
    # 09:00-10:00 is 1h30m away, 13:00 (after both) 2h30m: the nearer one, before it.
    assert "the nearest start that fits: 2026-12-01T09:00:00" in str(err)
    with client() as c:
        err = unchanged(lambda: c.book("1h", gpus=2, start="2026-12-01T12:30:00Z"),
                        NotEnoughCapacity)
    assert "the nearest start that fits: 2026-12-01T13:00:00" in str(err)
    # On two GPUs, named as status names them.
    names = {g["alias"] for g in status()["gpus"]} | {g["uuid"] for g in status()["gpus"]}
    on = str(err).rsplit(" on ", 1)[1].split(", ")
    assert len(on) == 2 and set(on) <= names, str(err)


BAD_REQUESTS = {
    "a start in the past": ({"duration": "1h", "gpus": 1, "start": "2026-12-01T08:00:00Z"},
                            InvalidArgs, "past"),
    "no duration": ({"duration": 0, "gpus": 1, "start": "2026-12-01T10:00:00Z"},
                    InvalidArgs, "more than 0"),
    "a zero duration as text": ({"duration": "0s", "gpus": 1}, InvalidArgs, "more than 0"),
    "a negative duration": ({"duration": -60, "gpus": 1}, InvalidArgs, "more than 0"),
    "more GPUs than exist": ({"duration": "1h", "gpus": 5}, NotEnoughGPUs, "5 GPU"),
    "an unknown GPU": ({"duration": "1h", "gpu_names": ["nope"]}, InvalidArgs, "no GPU"),
    "an unknown excluded GPU": ({"duration": "1h", "gpus": 1, "exclude": ["nope"]},
                                InvalidArgs, "no GPU"),
    "a GPU wanted and excluded": ({"duration": "1h", "gpu_names": ["0"], "exclude": ["0"]},
                                  InvalidArgs, "wanted and excluded"),
    "every GPU excluded": ({"duration": "1h", "gpus": 1, "exclude": ["0", "1", "2", "3"]},
                           NotEnoughGPUs, "may be used"),
    "longer than the longest booking": ({"duration": "8d", "gpus": 1}, InvalidArgs, "at most"),
    "beyond the horizon": ({"duration": "1h", "gpus": 1, "start": "2027-01-15T09:00:00Z"},
                           InvalidArgs, "ahead"),
    "more VRAM than a GPU has": ({"duration": "1h", "vram": 81 * G}, ResourcedError, None),
    "a bad start": ({"duration": "1h", "gpus": 1, "start": "someday"}, InvalidArgs, "start"),
}


@pytest.mark.parametrize("kw, error, match", BAD_REQUESTS.values(), ids=BAD_REQUESTS.keys())
def test_a_bad_request_is_refused_and_changes_nothing(clocked_daemon, kw, error, match):
    clocked_daemon(gpus=4)
    book(duration="1h", gpus=1, start="2026-12-01T10:00:00Z")
    with client() as c:
        unchanged(lambda: c.book(**kw), error, match)


def test_bad_changes_to_a_booking_are_refused_and_change_nothing(clocked_daemon):
    clocked_daemon(gpus=2)
    mine = book(duration="1h", gpus=1, start="2026-12-01T10:00:00Z")
    other = book(duration="1h", gpus=1, start="2026-12-01T11:00:00Z")
    with client() as c:
        unchanged(lambda: c.edit(mine["id"], start="2026-12-01T08:00:00Z"), InvalidArgs)
        unchanged(lambda: c.edit(mine["id"], duration=0), InvalidArgs)
        unchanged(lambda: c.edit(mine["id"], gpus=3), NotEnoughGPUs)
        unchanged(lambda: c.edit(mine["id"], duration="8d"), InvalidArgs)
        unchanged(lambda: c.edit(mine["id"], gpus=2, duration="2h"), NotEnoughCapacity)
        unchanged(lambda: c.extend(mine["id"], until="2026-12-01T09:30:00Z"), InvalidArgs)
        unchanged(lambda: c.extend(mine["id"], by="8d"), InvalidArgs)
        unchanged(lambda: c.extend(mine["id"]), InvalidArgs)
        unchanged(lambda: c.cancel("bnothere"), NoSuchClaim)
        unchanged(lambda: c.edit("bnothere", duration="1h"), NoSuchClaim)
        unchanged(lambda: c.booking("bnothere"), NoSuchClaim)
        cancelled = c.cancel(other["id"])
        assert c.cancel(other["id"]) == cancelled  # its owner's retry: it happened, exit 0
        unchanged(lambda: c.extend(other["id"], by="1h"), InvalidArgs, "ended")


def test_an_edit_moves_a_booking_and_frees_where_it_was(clocked_daemon):
    clocked_daemon(gpus=1)
    b = book(duration="1h", gpus=1, start="2026-12-01T10:00:00Z")
    with client() as c:
        moved = c.edit(b["id"], start="2026-12-01T12:00:00Z", duration="2h", label="later")
        assert (moved["id"], moved["start_usec"], moved["end_usec"], moved["label"]) == (
            b["id"], at("2026-12-01T12:00:00Z"), at("2026-12-01T14:00:00Z"), "later")
        assert c.booking(b["id"]) == moved
    book(duration="1h", gpus=1, start="2026-12-01T10:00:00Z")  # where it was: free again
    with client() as c:
        earliest = c.edit(b["id"], earliest=True)
    assert earliest["start_usec"] == at("2026-12-01T11:00:00Z")   # 2h from now meet 10:00
    assert earliest["end_usec"] == at("2026-12-01T13:00:00Z")


def test_bookings_are_listed_by_start_in_pages_and_windows(clocked_daemon):
    clocked_daemon(gpus=1)
    starts = [f"2026-12-01T{h}:00:00Z" for h in (14, 10, 12, 11, 13)]
    made = {book(duration="1h", gpus=1, start=s)["id"]: at(s) for s in starts}
    by_start = sorted(made, key=made.get)
    with client() as c:
        assert [b["id"] for b in c.bookings()] == by_start
        assert c.bookings() == [c.booking(ref) for ref in by_start]  # JSON list = a{sv} record
        assert [b["id"] for b in c.bookings(limit=2)] == by_start[:2]
        assert [b["id"] for b in c.bookings(offset=2, limit=2)] == by_start[2:4]
        assert [b["id"] for b in c.bookings(offset=4)] == by_start[4:]
        assert c.bookings(offset=5) == []
        assert [b["id"] for b in c.bookings(until="2026-12-01T12:00:00Z")] == by_start[:2]
        with pytest.raises(InvalidArgs):
            c.bookings(limit=0)
        c.cancel(by_start[0])
        # An ended booking is listed for a day after it ended, unless asked from later.
        assert [b["id"] for b in c.bookings()] == by_start
        assert [b["id"] for b in c.bookings(since="2026-12-01T09:00:01Z")] == by_start[1:]


def test_an_operation_id_makes_a_booking_retry_safe(clocked_daemon):
    clocked_daemon(gpus=4)
    with client() as c:
        first = c.book("1h", gpus=2, start="2026-12-01T10:00:00Z", op_id="op-1")
        again = c.book("1h", gpus=2, start="2026-12-01T10:00:00Z", op_id="op-1")
        assert first["status"] == "created" and again["status"] == "exists"
        assert again["booking"] == first["booking"]
        assert len(c.bookings(all_users=True)) == 1
        err = unchanged(lambda: c.book("1h", gpus=1, start="2026-12-01T10:00:00Z",
                                       op_id="op-1"), InvalidArgs)
        assert "op-1" in str(err)
        unchanged(lambda: c.book("2h", gpus=2, start="2026-12-01T10:00:00Z", op_id="op-1"),
                  InvalidArgs)
        # Another op id is another booking.
        other = c.book("1h", gpus=2, start="2026-12-01T10:00:00Z", op_id="op-2")
        assert other["status"] == "created" and other["booking"]["id"] != first["booking"]["id"]
        assert other["booking"]["op_id"] == "op-2"


def test_operation_ids_make_every_change_retry_safe_and_survive_a_restart(clocked_daemon):
    first = clocked_daemon(gpus=2)
    with client() as c:
        ref = c.book("1h", gpus=1, start="2026-12-01T10:00:00Z")["booking"]["id"]
        longer = c.extend(ref, by="1h", op_id="ext-1")
        assert longer["end_usec"] == c.extend(ref, by="1h", op_id="ext-1")["end_usec"]  # once
        moved = c.edit(ref, label="moved", start="2026-12-01T13:00:00Z", op_id="edit-1")
        assert c.edit(ref, label="moved", start="2026-12-01T13:00:00Z", op_id="edit-1") == moved
        unchanged(lambda: c.extend(ref, by="2h", op_id="ext-1"), InvalidArgs, "ext-1")
    assert first.stop() == 0
    clocked_daemon(gpus=2, runtime_dir=first.runtime_dir)
    with client() as c:
        assert c.extend(ref, by="1h", op_id="ext-1")["end_usec"] == moved["end_usec"]
        gone = c.cancel(ref, op_id="cancel-1")
        assert gone["ended"] == "cancelled"
        assert c.cancel(ref, op_id="cancel-1") == gone  # not "has ended already"
        assert c.cancel(ref) == gone  # nor without the id: the owner's retry is safe


def test_a_share_larger_than_every_gpu_is_refused_for_what_it_is(clocked_daemon):
    clocked_daemon(gpus=2)
    with client() as c:
        for start in (None, "2026-12-01T10:00:00Z"):
            err = unchanged(lambda s=start: c.book("1h", vram=81 * G, start=s))
            # As a claim says it: "81G of VRAM requested, the largest GPU has 80G".
            assert "80G" in str(err) and "open-ended claims" not in str(err), str(err)


# -- the clock: start, end, extend, shrink --------------------------------------------------
def test_a_booking_becomes_a_claim_at_its_start_and_goes_at_its_end(clocked_daemon, clock):
    clocked_daemon(gpus=4)
    b = book(duration="1h", gpus=2, start="2026-12-01T10:00:00Z")
    assert claim_of(b["id"]) is None
    clock.set("2026-12-01T10:00:00Z")
    cl = eventually(lambda: claim_of(b["id"]), CLOCK_TIMEOUT)
    assert (cl["mode"], cl["state"], sorted(cl["gpu_uuids"])) == (
        "booking", "granted", sorted(b["gpu_uuids"]))
    assert cl["until_usec"] == b["end_usec"]
    states = gpu_states()
    assert all(states[u] == "claimed" for u in b["gpu_uuids"])
    assert {g["claim"] for g in status()["gpus"] if g["uuid"] in b["gpu_uuids"]} == {b["id"]}
    now = booking(b["id"])
    assert (now["state"], now["claim_state"]) == ("active", "granted")
    clock.set("2026-12-01T11:00:00Z")
    eventually(lambda: claim_of(b["id"]) is None, CLOCK_TIMEOUT)
    assert set(gpu_states().values()) == {"free"}
    ended = booking(b["id"])
    assert (ended["state"], ended["ended"], ended["end_usec"]) == (
        "ended", "expired", at("2026-12-01T11:00:00Z"))


def test_an_active_booking_is_extended_and_shrunk(clocked_daemon, clock):
    clocked_daemon(gpus=2)
    b = book(duration="1h", gpus=2, start="2026-12-01T10:00:00Z")
    later = book(duration="1h", gpus=1, start="2026-12-01T12:00:00Z")
    clock.set("2026-12-01T10:00:00Z")
    eventually(lambda: claim_of(b["id"]), CLOCK_TIMEOUT)
    with client() as c:
        longer = c.extend(b["id"], by="1h")
        assert longer["end_usec"] == at("2026-12-01T12:00:00Z") == later["start_usec"]
        assert claim_of(b["id"])["until_usec"] == longer["end_usec"]
        # Into the later booking's GPU: refused, the end stays.
        unchanged(lambda: c.extend(b["id"], by="1m"), NotEnoughCapacity)
        # Shrink: the tail is free at once for others.
        shorter = c.extend(b["id"], until="2026-12-01T10:30:00Z")
        assert shorter["end_usec"] == at("2026-12-01T10:30:00Z")
        assert shorter["state"] == "active"
        assert claim_of(b["id"])["until_usec"] == shorter["end_usec"]
        tail = c.book("30m", gpus=2, start="2026-12-01T10:30:00Z")["booking"]
        assert sorted(tail["gpu_uuids"]) == sorted(b["gpu_uuids"])
        # Shrinking to now or before is refused.
        unchanged(lambda: c.extend(b["id"], until="2026-12-01T10:00:00Z"), InvalidArgs)
    clock.set("2026-12-01T10:30:00Z")
    eventually(lambda: (claim_of(tail["id"]) or {}).get("state") == "granted", CLOCK_TIMEOUT)
    assert claim_of(b["id"]) is None
    assert booking(b["id"])["ended"] == "expired"


def test_an_exclusive_vram_booking_holds_its_gpu_whole_while_it_runs(clocked_daemon, clock):
    clocked_daemon(gpus=2)
    ex = book(duration="1h", vram=10 * G, exclusive=True, start="2026-12-01T10:00:00Z")
    sh = book(duration="1h", vram=10 * G, start="2026-12-01T10:00:00Z")
    assert ex["gpu_uuids"] != sh["gpu_uuids"]
    clock.set("2026-12-01T10:00:00Z")
    eventually(lambda: claim_of(ex["id"]) and claim_of(sh["id"]), CLOCK_TIMEOUT)
    states = gpu_states()
    assert states[ex["gpu_uuids"][0]] == "claimed"
    assert states[sh["gpu_uuids"][0]] == "shared"


def test_releasing_an_active_booking_frees_its_gpus_at_once(clocked_daemon, clock):
    clocked_daemon(gpus=4)
    b = book(duration="1h", gpus=3, start="2026-12-01T10:00:00Z")
    clock.set("2026-12-01T10:00:00Z")
    eventually(lambda: claim_of(b["id"]), CLOCK_TIMEOUT)
    assert sum(s == "claimed" for s in gpu_states().values()) == 3
    clock.set("2026-12-01T10:15:00Z")
    with client() as c:
        ended = c.cancel(b["id"])
    assert (ended["state"], ended["ended"]) == ("ended", "released")
    assert ended["end_usec"] == ended["ended_usec"] == at("2026-12-01T10:15:00Z")
    assert claim_of(b["id"]) is None
    assert set(gpu_states().values()) == {"free"}
    now = book(duration="30m", gpus=4)   # the whole machine, from now
    assert now["start_usec"] == at("2026-12-01T10:15:00Z")


def test_a_waiter_granted_until_a_booking_hears_so_in_its_reply(clocked_daemon, clock):
    """A waiting claim's reply comes at its grant (ReplyWhenGranted), with the warning a
    claim granted at once gets."""
    d = clocked_daemon(gpus=2)
    book(duration="1h", gpus=2, start="2026-12-01T10:00:00Z")
    outcome: list = []
    with client() as c:
        first = c.claim(mode="dev", gpus=2, owner_pid=d.proc.pid)["allocation"]["ref"]
        waiter = threading.Thread(target=lambda: outcome.append(Client(timeout=5).claim(
            mode="dev", gpus=1, owner_pid=d.proc.pid, wait=True, timeout=20)), daemon=True)
        waiter.start()
        eventually(lambda: status()["queue"], what="the waiter in the queue")
        c.release(first)
        waiter.join(10)
        assert outcome, "the waiter was not granted"
        got = outcome[0]
        assert got["allocation"]["state"] == "granted"
        assert any("granted until 2026-12-01T10:00:00" in w for w in got["warnings"]), got
        c.release(got["allocation"]["ref"])


def test_a_claim_on_a_gpu_booked_later_holds_until_the_booking(clocked_daemon, clock):
    d = clocked_daemon(gpus=4)
    b = book(duration="1h", gpus=4, start="2026-12-01T10:00:00Z")
    with client() as c:
        got = c.claim(mode="dev", gpus=1, owner_pid=d.proc.pid)
    ref = got["allocation"]["ref"]
    assert any("granted until 2026-12-01T10:00:00" in w for w in got["warnings"]), got
    cl = claim_of(ref)
    assert (cl["state"], cl["until_usec"], cl["until_booking"]) == (
        "granted", b["start_usec"], b["id"])
    assert cl["reclaim_requested"] is False
    # At the start, the claim was not given back: the booking waits for it and asks.
    clock.set("2026-12-01T10:00:00Z")
    eventually(lambda: booking(b["id"])["claim_state"] == "queued", CLOCK_TIMEOUT)
    assert claim_of(b["id"])["state"] == "queued"
    eventually(lambda: claim_of(ref)["reclaim_requested"], CLOCK_TIMEOUT)
    assert claim_of(ref)["state"] == "granted"
    # Its owner sees who holds it; verify shows the GPU as OVERDUE.
    assert booking(b["id"])["waiting_for"] == [ref]
    with client() as c:
        held = [r for r in c.verify() if r["claim"] == ref]
        assert [r["status"] for r in held] == ["OVERDUE"]
        assert b["id"] in held[0]["detail"]
        c.release(ref)
    eventually(lambda: booking(b["id"])["claim_state"] == "granted", CLOCK_TIMEOUT)
    assert set(gpu_states().values()) == {"claimed"}
    assert {g["claim"] for g in status()["gpus"]} == {b["id"]}


def test_an_open_ended_claim_keeps_its_gpu_out_of_every_booking(clocked_daemon):
    d = clocked_daemon(gpus=1)
    with client() as c:
        c.claim(mode="dev", gpus=1, owner_pid=d.proc.pid)
        unchanged(lambda: c.book("1h", gpus=1), NotEnoughCapacity, "never fits")
        unchanged(lambda: c.book("1h", gpus=1, start="2026-12-05T10:00:00Z"), NotEnoughCapacity)
        assert c.slots("1h", gpus=1) == []


def test_a_vram_claim_counts_against_booked_shares(clocked_daemon):
    d = clocked_daemon(gpus=1)
    with client() as c:
        c.claim(mode="dev", gpus=0, vram=50 * G, owner_pid=d.proc.pid)
        unchanged(lambda: c.book("1h", vram=40 * G, start="2026-12-01T10:00:00Z"),
                  NotEnoughCapacity)
        unchanged(lambda: c.book("1h", gpus=1, start="2026-12-01T10:00:00Z"), NotEnoughCapacity)
    assert book(duration="1h", vram=30 * G, start="2026-12-01T10:00:00Z")["shared"]


def test_claims_go_first_to_gpus_nobody_booked(clocked_daemon):
    d = clocked_daemon(gpus=4)
    b = book(duration="1h", gpu_names=["0"], start="2026-12-01T10:00:00Z")
    with client() as c:
        three = c.claim(mode="dev", gpus=3, owner_pid=d.proc.pid)
        assert not set(three["allocation"]["gpu_uuids"]) & set(b["gpu_uuids"])
        assert claim_of(three["allocation"]["ref"])["until_usec"] == 0
        assert not any("granted until" in w for w in three["warnings"])
        last = c.claim(mode="dev", gpus=1, owner_pid=d.proc.pid)
    assert last["allocation"]["gpu_uuids"] == b["gpu_uuids"]
    assert claim_of(last["allocation"]["ref"])["until_usec"] == b["start_usec"]


def test_a_vram_claim_holds_until_a_booked_share_would_overflow_the_gpu(clocked_daemon):
    d = clocked_daemon(gpus=1)
    b = book(duration="1h", vram=50 * G, start="2026-12-01T10:00:00Z")
    with client() as c:
        small = c.claim(mode="dev", gpus=0, vram=30 * G, owner_pid=d.proc.pid)
        big = c.claim(mode="dev", gpus=0, vram=20 * G, owner_pid=d.proc.pid)
    # 30G fits beside the booked 50G for good; 20G more would make 100G from 10:00.
    assert claim_of(small["allocation"]["ref"])["until_usec"] == 0
    cl = claim_of(big["allocation"]["ref"])
    assert (cl["until_usec"], cl["until_booking"]) == (b["start_usec"], b["id"])
    assert any("granted until 2026-12-01T10:00:00" in w for w in big["warnings"])
    assert status()["gpus"][0]["state"] == "shared"


def test_a_claim_follows_the_booking_it_waits_on_when_it_moves_or_goes(clocked_daemon):
    d = clocked_daemon(gpus=1)
    b = book(duration="1h", gpus=1, start="2026-12-01T10:00:00Z")
    with client() as c:
        ref = c.claim(mode="dev", gpus=1, owner_pid=d.proc.pid)["allocation"]["ref"]
        assert claim_of(ref)["until_usec"] == b["start_usec"]
        # Before the claim's time is up, the booking cannot move onto it...
        unchanged(lambda: c.edit(b["id"], start="2026-12-01T09:30:00Z"), NotEnoughCapacity)
        # ...but later, and the claim may hold longer.
        c.edit(b["id"], start="2026-12-01T11:00:00Z")
        assert claim_of(ref)["until_usec"] == at("2026-12-01T11:00:00Z")
        c.cancel(b["id"])
    cl = claim_of(ref)
    assert (cl["until_usec"], cl["until_booking"]) == (0, "")


def test_a_claim_freed_by_a_cancelled_booking_is_not_ended_at_that_booking_start(clocked_daemon, clock):
    d = clocked_daemon(gpus=1)
    b = book(duration="1h", gpus=1, start="2026-12-01T10:00:00Z")
    with client() as c:
        ref = c.claim(mode="dev", gpus=1, owner_pid=d.proc.pid)["allocation"]["ref"]
        c.cancel(b["id"])
    assert (claim_of(ref)["until_usec"], claim_of(ref)["until_booking"]) == (0, "")
    clock.set("2026-12-01T10:00:00Z")
    all_bookings()   # the daemon acts on everything due by 10:00 before it answers this
    assert claim_of(ref) is not None, "the claim, granted for good, was ended at 10:00"


# -- blackouts and notices ----------------------------------------------------------------
def test_a_blackout_refuses_new_bookings_and_keeps_the_old(clocked_daemon):
    clocked_daemon(gpus=4)
    old = book(duration="30m", gpus=1, start="2026-12-01T12:30:00Z")
    outside = book(duration="1h", gpus=1, start="2026-12-01T14:00:00Z")   # back to back
    with client() as c:
        out = c.add_blackout("2026-12-01T12:00:00Z", "2026-12-01T14:00:00Z", "maintenance")
        assert out["bookings_inside"] == [old["id"]]
        [listed] = c.blackouts()
        assert (listed["id"], listed["start_usec"], listed["end_usec"], listed["reason"]) == (
            out["id"], at("2026-12-01T12:00:00Z"), at("2026-12-01T14:00:00Z"), "maintenance")
        err = unchanged(lambda: c.book("1h", gpus=1, start="2026-12-01T13:00:00Z"),
                        NotEnoughCapacity, "blackout")
        assert "the nearest start that fits: 2026-12-01T14:00:00" in str(err)
        unchanged(lambda: c.book("2h", gpus=1, start="2026-12-01T11:00:00Z"),
                  NotEnoughCapacity, "blackout")
        # Earliest fit skips it: three hours from 09:00 would reach into it.
        assert c.book("4h", gpus=1)["booking"]["start_usec"] == at("2026-12-01T14:00:00Z")
        assert c.book("3h", gpus=1, start=NOW)["status"] == "created"   # ends as it starts
        ids = {b["id"]: b["state"] for b in c.bookings(all_users=True)}
        assert ids[old["id"]] == ids[outside["id"]] == "scheduled"
        unchanged(lambda: c.add_blackout("2026-12-01T08:00:00Z", "2026-12-01T08:30:00Z", "x"),
                  InvalidArgs, "past")
        unchanged(lambda: c.add_blackout("2026-12-01T16:00:00Z", "2026-12-01T15:00:00Z", "x"),
                  InvalidArgs)
        c.remove_blackout(out["id"])
        assert c.blackouts() == []
        assert c.book("1h", gpus=1, start="2026-12-01T13:00:00Z")["status"] == "created"
        with pytest.raises(NoSuchClaim):
            c.remove_blackout(out["id"])


def test_a_booking_cannot_be_moved_or_extended_into_a_blackout(clocked_daemon):
    clocked_daemon(gpus=2)
    b = book(duration="1h", gpus=1, start="2026-12-01T10:00:00Z")
    with client() as c:
        c.add_blackout("2026-12-01T11:00:00Z", "2026-12-01T12:00:00Z", "firmware")
        unchanged(lambda: c.extend(b["id"], by="1m"), NotEnoughCapacity)
        unchanged(lambda: c.edit(b["id"], start="2026-12-01T11:30:00Z"), NotEnoughCapacity,
                  "blackout")
        moved = c.edit(b["id"], start="2026-12-01T12:00:00Z")   # back to back: fits
        assert moved["start_usec"] == at("2026-12-01T12:00:00Z")


def test_a_booking_kept_inside_a_blackout_can_still_be_relabelled_and_shortened(clocked_daemon):
    clocked_daemon(gpus=1)
    b = book(duration="1h", gpus=1, start="2026-12-01T10:00:00Z")
    with client() as c:
        assert c.add_blackout("2026-12-01T09:30:00Z", "2026-12-01T12:00:00Z",
                              "power")["bookings_inside"] == [b["id"]]
        # Neither change places anything new in the window.
        assert c.edit(b["id"], label="renamed")["label"] == "renamed"
        assert c.edit(b["id"], duration="30m")["end_usec"] == at("2026-12-01T10:30:00Z")


def test_notices_show_in_status_until_their_time_or_removal(clocked_daemon, clock):
    clocked_daemon(gpus=1)
    with client() as c:
        lasting = c.add_notice("GPU 0 gets a new fan on Friday")
        brief = c.add_notice("reboot at 10:00", until="2026-12-01T10:00:00Z")
        texts = [n["text"] for n in c.status()["notices"]]
        assert texts == ["GPU 0 gets a new fan on Friday", "reboot at 10:00"]
        assert {n["id"] for n in c.notices()} == {lasting, brief}
        with pytest.raises(InvalidArgs):
            c.add_notice("   ")
    clock.set("2026-12-01T10:00:00Z")
    eventually(lambda: [n["id"] for n in status()["notices"]] == [lasting], CLOCK_TIMEOUT)
    with client() as c:
        c.remove_notice(lasting)
        assert c.status()["notices"] == [] and c.notices() == []
        with pytest.raises(NoSuchClaim):
            c.remove_notice(lasting)


# -- async client ---------------------------------------------------------------------------
def test_the_async_client_books_lists_and_cancels(clocked_daemon):
    clocked_daemon(gpus=2)

    async def scenario():
        async with AsyncClient(timeout=5) as c:
            made = await c.book("1h", gpus=2, start="2026-12-01T10:00:00Z", op_id="a1")
            again = await c.book("1h", gpus=2, start="2026-12-01T10:00:00Z", op_id="a1")
            assert (made["status"], again["status"]) == ("created", "exists")
            ref = made["booking"]["id"]
            assert again["booking"]["id"] == ref
            with pytest.raises(NotEnoughCapacity):
                await c.book("1h", gpus=1, start="2026-12-01T10:30:00Z")
            assert [b["id"] for b in await c.bookings()] == [ref]
            longer = await c.extend(ref, by="30m")
            assert longer["end_usec"] == at("2026-12-01T11:30:00Z")
            gone = await c.cancel(ref)
            assert (gone["state"], gone["ended"]) == ("ended", "cancelled")
            assert (await c.booking(ref))["state"] == "ended"
            slots = await c.slots("1h", count=1, gpus=2)
            assert slots[0]["start_usec"] == at(NOW)

    asyncio.run(asyncio.wait_for(scenario(), 20))


# -- restarts and crashes -------------------------------------------------------------------
def test_a_restart_keeps_future_bookings_blackouts_and_op_ids(clocked_daemon):
    first = clocked_daemon(gpus=4)
    a = book(duration="1h", gpus=2, start="2026-12-01T10:00:00Z", op_id="keep-1")
    b = book(duration="2h", vram=20 * G, start="2026-12-01T11:00:00Z", label="share")
    with client() as c:
        gone = c.book("1h", gpus=1, start="2026-12-01T12:00:00Z")["booking"]
        c.cancel(gone["id"])
        blackout = c.add_blackout("2026-12-02T00:00:00Z", "2026-12-02T06:00:00Z", "power")["id"]
        notice = c.add_notice("hello")
    before = all_bookings()
    assert first.stop() == 0
    clocked_daemon(gpus=4, runtime_dir=first.runtime_dir)
    assert all_bookings() == before
    assert {x["id"]: x["state"] for x in before} == {
        a["id"]: "scheduled", b["id"]: "scheduled", gone["id"]: "ended"}
    with client() as c:
        assert [x["id"] for x in c.blackouts()] == [blackout]
        assert [n["id"] for n in c.status()["notices"]] == [notice]
        replay = c.book("1h", gpus=2, start="2026-12-01T10:00:00Z", op_id="keep-1")
        assert (replay["status"], replay["booking"]["id"]) == ("exists", a["id"])
        # What the bookings hold is held again: the other two GPUs only.
        assert c.book("1h", gpus=2, start="2026-12-01T10:00:00Z")["status"] == "created"
        unchanged(lambda: c.book("1h", gpus=1, start="2026-12-01T10:00:00Z"), NotEnoughCapacity)
        unchanged(lambda: c.book("1h", gpus=1, start="2026-12-02T01:00:00Z"), NotEnoughCapacity,
                  "blackout")


def test_a_restart_during_a_booking_gives_its_claim_back(clocked_daemon, clock):
    first = clocked_daemon(gpus=2)
    b = book(duration="1h", gpus=1, start="2026-12-01T10:00:00Z")
    clock.set("2026-12-01T10:00:00Z")
    eventually(lambda: claim_of(b["id"]), CLOCK_TIMEOUT)
    first.stop()
    clocked_daemon(gpus=2, runtime_dir=first.runtime_dir)
    cl = claim_of(b["id"])
    assert cl is not None and (cl["mode"], cl["state"]) == ("booking", "granted")
    assert booking(b["id"])["state"] == "active"
    clock.set("2026-12-01T11:00:00Z")
    eventually(lambda: claim_of(b["id"]) is None, CLOCK_TIMEOUT)


def test_kill_9_during_a_burst_of_bookings_loses_no_acknowledged_booking(clocked_daemon):
    first = clocked_daemon(gpus=4)
    acknowledged: list[str] = []
    lock = threading.Lock()
    stop = threading.Event()

    def burst(i: int) -> None:
        with Client(timeout=3) as c:
            n = 0
            while not stop.is_set() and n < 200:
                try:
                    reply = c.book("10m", gpus=1, label=f"t{i}-{n}")
                except ResourcedError:
                    return   # the daemon is gone
                with lock:
                    acknowledged.append(reply["booking"]["id"])
                n += 1

    threads = [threading.Thread(target=burst, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    try:
        eventually(lambda: len(acknowledged) >= 40, 10)
        os.kill(first.proc.pid, signal.SIGKILL)
        first.proc.wait(5)
    finally:
        stop.set()
        for t in threads:
            t.join(10)
    assert not any(t.is_alive() for t in threads)
    assert len(acknowledged) < 800, "the crash must land in the middle of the burst"
    clocked_daemon(gpus=4, runtime_dir=first.runtime_dir)
    listed = all_bookings()
    ids = [b["id"] for b in listed]
    assert set(acknowledged) <= set(ids)
    assert len(ids) == len(set(ids))
    assert_never_double_booked(listed)


def test_a_dry_run_is_decided_by_the_real_admission_and_changes_nothing(clocked_daemon):
    clocked_daemon(gpus=2)
    with client() as c:
        kept = c.book("1h", gpus=2, start="2026-12-01T10:00:00Z")["booking"]
        before = c.bookings(all_users=True)
        would = c.book("1h", gpus=1, start="2026-12-01T11:00:00Z", op_id="dry", dry_run=True)
        assert would["status"] == "dry-run" and would["booking"]["gpu_indices"] == [0]
        unchanged(lambda: c.book("1h", gpus=1, start="2026-12-01T10:30:00Z", dry_run=True),
                  NotEnoughCapacity, "nearest start")
        assert c.extend(kept["id"], by="1h", dry_run=True)["end_usec"] == at("2026-12-01T12:00:00Z")
        assert c.edit(kept["id"], label="x", dry_run=True)["label"] == "x"
        assert c.cancel(kept["id"], dry_run=True)["ended"] == "cancelled"
        assert c.bookings(all_users=True) == before  # nothing of it happened
        # The op id of a dry run was not taken.
        real = c.book("1h", gpus=1, start="2026-12-01T11:00:00Z", op_id="dry")
        assert real["status"] == "created"
