"""A record reads the same from the bus (a{sv}) as from JSON: the daemon writes it by the
table in ``resourced.protocol.records`` and the client reads it back by the same table."""

from dbus_fast import Variant

from resourced.client.bookings import record
from resourced.core.calendar import Booking, BookingRequest
from resourced.core.claims import Demand
from resourced.core.inventory import Gpu
from resourced.daemon.bus.bookings import booking_fields, booking_record, wire_record
from resourced.protocol.records import BLACKOUT, BOOKING, NOTICE, PROCESS, REPORT, SLOT, read


def as_jeepney(wire: dict) -> dict:
    """dbus-fast's variants as jeepney decodes them: (signature, value)."""
    return {k: (v.signature, v.value) for k, v in wire.items()}


def test_the_a_sv_record_and_the_json_fields_are_the_same_booking():
    gpus = {"GPU-a": Gpu(3, "GPU-a", "sim", 80 << 30, "0:1", "big")}
    b = Booking("b1", 1000, "alice", BookingRequest(Demand(1, 0, (("cpu", 4),)), 3600_000_000,
                                                    label="l"),
                1_000, 3_601_000, ("GPU-a",), False, 500, "op")
    fields = booking_fields(b, gpus, "granted")
    assert set(fields) == {f.key for f in BOOKING}
    wire = booking_record(fields)
    assert record(as_jeepney(wire)) == fields
    assert fields["gpu_indices"] == [3] and fields["pools"] == {"cpu": 4}
    assert all(isinstance(v, Variant) for v in wire.values())


def test_every_kind_reads_back_as_it_was_written():
    samples = {"s": "x", "u": 7, "i": -1, "t": 2**40, "b": True, "as": ["a", "b"],
               "au": [1, 2], "a{st}": {"cpu": 4}, "aa{sv}": []}
    for kind in (BOOKING, BLACKOUT, NOTICE, SLOT, PROCESS, REPORT):
        values = {f.key: samples[f.signature] for f in kind}
        assert read(kind, as_jeepney(wire_record(kind, values))) == values


def test_a_field_the_table_does_not_know_is_kept_under_the_bus_key():
    assert read(SLOT, {"StartUSec": ("t", 5), "NewThing": ("as", ("a",))}) == {
        "start_usec": 5, "NewThing": ["a"]}
