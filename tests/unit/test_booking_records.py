"""A booking reads the same from Book/GetBooking (a{sv}) as from ListBookings (JSON)."""

from dbus_fast import Variant

from resourced.client.bookings import record, snake
from resourced.core.calendar import Booking, BookingRequest
from resourced.core.claims import Demand
from resourced.core.inventory import Gpu
from resourced.daemon.bus.bookings import booking_fields, booking_record
from resourced.protocol.records import BOOKING


def test_every_field_has_the_same_name_both_ways():
    for field in BOOKING:
        assert snake(field.wire) == field.key


def test_the_a_sv_record_and_the_json_fields_are_the_same_booking():
    gpus = {"GPU-a": Gpu(3, "GPU-a", "sim", 80 << 30, "0:1", "big")}
    b = Booking("b1", 1000, "alice", BookingRequest(Demand(1, 0, (("cpu", 4),)), 3600_000_000,
                                                    label="l"),
                1_000, 3_601_000, ("GPU-a",), False, 500, "op")
    fields = booking_fields(b, gpus, "granted")
    assert set(fields) == {f.key for f in BOOKING}
    wire = booking_record(fields)
    as_jeepney = {k: (v.signature, v.value) for k, v in wire.items()}  # how jeepney decodes
    assert record(as_jeepney) == fields
    assert fields["gpu_indices"] == [3] and fields["pools"] == {"cpu": 4}
    assert all(isinstance(v, Variant) for v in wire.values())
