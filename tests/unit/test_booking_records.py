"""A record reads the same from the bus (a{sv}) as from JSON: the daemon writes it by the
table in ``resourced.protocol.records`` and the client reads it back by the same table."""

import json

from dbus_fast import Variant

from resourced.client.bookings import record
from resourced.core.calendar import Booking, BookingRequest
from resourced.core.claims import Demand
from resourced.core.inventory import Gpu
from resourced.daemon.bus.bookings import (
    BookingTexts,
    booking_fields,
    booking_record,
    wire_record,
)
from resourced.protocol.records import BLACKOUT, BOOKING, NOTICE, PROCESS, REPORT, SLOT, read
from resourced.protocol.time import with_times


def as_jeepney(wire: dict) -> dict:
    """dbus-fast's variants as jeepney decodes them: (signature, value)."""
    return {k: (v.signature, v.value) for k, v in wire.items()}


GPUS = {"GPU-a": Gpu(3, "GPU-a", "sim", 80 << 30, "0:1", "big")}


def booking(label: str = "l", booking_id: str = "b1") -> Booking:
    return Booking(booking_id, 1000, "alice", BookingRequest(
        Demand(1, 0, (("ram", 1 << 30), ("cpu", 4))), 3600_000_000, label=label),
        1_000, 3_601_000, ("GPU-a",), False, 500, "op")


def test_the_a_sv_record_and_the_json_fields_are_the_same_booking():
    gpus, b = GPUS, booking()
    fields = booking_fields(b, gpus, "granted")
    assert set(fields) == {f.key for f in BOOKING}
    wire = booking_record(fields)
    assert record(as_jeepney(wire)) == fields
    assert fields["gpu_indices"] == [3] and fields["pools"] == {"ram": 1 << 30, "cpu": 4}
    assert all(isinstance(v, Variant) for v in wire.values())


def test_the_listed_text_is_what_gpuctl_bookings_json_prints():
    """ListBookings' array, byte for byte: each booking's fields, keys sorted (nested ones
    too), one line; the CLI passes it on unread.  The second booking has a claim that
    waits, the third is the first again, its text kept."""
    texts, b, held = BookingTexts(), booking("\u00e9t\u00e9 \"x\""), booking("h", "b2")
    live = {"b2": ("queued", ["c1", "c2"])}
    text = texts.array([b, held, b], GPUS, live, lambda x: live[x.id])
    want = [booking_fields(b, GPUS), booking_fields(held, GPUS, *live["b2"]),
            booking_fields(b, GPUS)]
    assert text == json.dumps(want, sort_keys=True)
    listed = json.loads(text)
    assert all(set(x) == {f.key for f in BOOKING} for x in listed)
    assert (listed[0]["start"], listed[0]["end"]) == ("1970-01-01T00:00:00Z",
                                                      "1970-01-01T00:00:03Z")
    assert (listed[1]["claim_state"], listed[1]["waiting_for"]) == ("queued", ["c1", "c2"])
    assert listed[0] == with_times(booking_fields(b, GPUS))


def test_an_array_of_none_or_one_is_json_too():
    texts, b = BookingTexts(), booking()
    assert texts.array([], GPUS, {}, None) == "[]"
    assert texts.array([b], GPUS, {}, None) == json.dumps([booking_fields(b, GPUS)],
                                                          sort_keys=True)


def test_a_changed_booking_is_encoded_again():
    texts = BookingTexts()
    texts.array([booking()], GPUS, {}, None)
    assert json.loads(texts.array([booking("other")], GPUS, {}, None))[0]["label"] == "other"


def test_every_kind_reads_back_as_it_was_written():
    samples = {"s": "x", "u": 7, "i": -1, "t": 2**40, "b": True, "as": ["a", "b"],
               "au": [1, 2], "a{st}": {"cpu": 4}, "aa{sv}": []}
    for kind in (BOOKING, BLACKOUT, NOTICE, SLOT, PROCESS, REPORT):
        values = {f.key: samples[f.signature] for f in kind}
        assert read(kind, as_jeepney(wire_record(kind, values))) == values


def test_a_field_the_table_does_not_know_is_kept_under_the_bus_key():
    assert read(SLOT, {"StartUSec": ("t", 5), "NewThing": ("as", ("a",))}) == {
        "start_usec": 5, "NewThing": ["a"]}
