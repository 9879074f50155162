"""A booking reads the same from Book/GetBooking (a{sv}) as from ListBookings (JSON)."""

import json

from dbus_fast import Variant

from resourced.agents.context import with_times
from resourced.client.bookings import record, snake
from resourced.core.calendar import Booking, BookingRequest
from resourced.core.claims import Demand
from resourced.core.inventory import Gpu
from resourced.daemon.bus.bookings import BookingTexts, booking_fields, booking_record
from resourced.protocol.records import BOOKING


def test_every_field_has_the_same_name_both_ways():
    for field in BOOKING:
        assert snake(field.wire) == field.key


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
    as_jeepney = {k: (v.signature, v.value) for k, v in wire.items()}  # how jeepney decodes
    assert record(as_jeepney) == fields
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
