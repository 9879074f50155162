"""The clients' message reader against jeepney's, on random signatures and values (both byte
orders, messages split anywhere), and where it hands over to jeepney."""

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jeepney import DBusAddress, new_method_call, new_method_return, new_signal
from jeepney.low_level import Endianness, Header, HeaderFields, Message, Parser

from resourced.client import wire

FIXED = {
    "y": st.integers(0, 255), "b": st.booleans(), "n": st.integers(-(2**15), 2**15 - 1),
    "q": st.integers(0, 2**16 - 1), "i": st.integers(-(2**31), 2**31 - 1),
    "u": st.integers(0, 2**32 - 1), "x": st.integers(-(2**63), 2**63 - 1),
    "t": st.integers(0, 2**64 - 1), "d": st.floats(allow_nan=False),
}
TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"),
               max_size=12)
PATH = st.lists(st.from_regex(r"[A-Za-z0-9_]{1,5}", fullmatch=True), max_size=3).map(
    lambda parts: "/" + "/".join(parts))
BASIC = {**FIXED, "s": TEXT, "o": PATH, "g": st.sampled_from(["", "s", "a{sv}", "(iu)"])}


def typed(depth: int = 2):
    """(signature, strategy for a value of it), for one complete type."""
    basic = st.sampled_from(sorted(BASIC)).map(lambda code: (code, BASIC[code]))
    if depth == 0:
        return basic
    inner = typed(depth - 1)
    return st.one_of(
        basic,
        inner.map(lambda t: ("a" + t[0], st.lists(t[1], max_size=4))),
        st.tuples(st.sampled_from(sorted(BASIC)), inner).map(
            lambda kv: (f"a{{{kv[0]}{kv[1][0]}}}",
                        st.dictionaries(BASIC[kv[0]], kv[1][1], max_size=3))),
        st.lists(inner, min_size=1, max_size=3).map(
            lambda ts: ("(" + "".join(t[0] for t in ts) + ")",
                        st.tuples(*(t[1] for t in ts)))),
        inner.map(lambda t: ("v", t[1].map(lambda v, sig=t[0]: (sig, v)))),
        st.just(("ay", st.binary(max_size=9))),
    )


@st.composite
def bodies(draw):
    types = draw(st.lists(typed(), max_size=4))
    return "".join(sig for sig, _ in types), tuple(draw(value) for _, value in types)


def both_read(data: bytes, cut: int):
    """The messages jeepney's parser and ours read from ``data`` fed in two pieces."""
    ours = Parser()
    ours.__class__ = wire.FastParser
    out = []
    for parser in (Parser(), ours):
        parser.add_data(data[:cut])
        first = parser.get_next_message()
        parser.add_data(data[cut:])
        out.append([m for m in (first, parser.get_next_message(), parser.get_next_message())
                    if m is not None])
    return out


def same(a: Message, b: Message) -> None:
    for name in ("endianness", "message_type", "flags", "protocol_version", "body_length",
                 "serial", "fields"):
        assert getattr(a.header, name) == getattr(b.header, name), name
    assert type(a.body) is type(b.body)
    assert repr(a.body) == repr(b.body)  # types too: bool vs int, bytes vs list, tuple vs list


@settings(max_examples=400, deadline=None)
@given(bodies(), st.sampled_from([Endianness.little, Endianness.big]), st.integers(0, 10_000))
def test_it_reads_what_jeepney_reads(body, endianness, cut):
    sig, values = body
    address = DBusAddress("/org/resourced", bus_name="org.resourced", interface="org.resourced.X")
    msg = new_method_call(address, "Do", sig or None, values)
    msg.header.endianness = endianness
    data = msg.serialise(serial=7)
    reply = new_method_return(Message(Header(endianness, 1, 0, 1, 0, 7, msg.header.fields), ()),
                              sig or None, values).serialise(serial=8)
    jeepneys, ours = both_read(data + reply, cut % (len(data) + len(reply) + 1))
    assert len(jeepneys) == len(ours) == 2
    for a, b in zip(jeepneys, ours):
        same(a, b)


def test_a_claims_answer_reads_the_same():
    grant = {"State": ("s", "granted"), "GPUUUIDs": ("as", ["GPU-1", "GPU-2"]),
             "GPUIndices": ("au", [0, 1]), "VRAMBytes": ("t", 0), "Pools": ("a{st}", {"ram": 5}),
             "DryRun": ("b", True)}
    msg = new_signal(DBusAddress("/org/resourced/claim/c1", interface="org.resourced.Claim"),
                     "Granted", "soa{sv}", ("c1", "/org/resourced/claim/c1", grant))
    data = msg.serialise(serial=3)
    jeepneys, ours = both_read(data, len(data))
    same(jeepneys[0], ours[0])
    assert ours[0].body[2]["DryRun"] == ("b", True)


def test_a_header_field_of_another_type_is_read_as_jeepney_reads_it():
    # The header is read directly where each field holds the type its code says; here the
    # member is an array of strings (no peer sends that, but the reader must not misread it).
    head = bytearray(b"l\x04\x00\x01" + (0).to_bytes(4, "little") + (9).to_bytes(4, "little"))
    wire.writer("a(yv)")(head, [(1, ("o", "/org/x")), (3, ("as", ["Odd", "Member"])),
                                (2, ("s", "org.x"))])
    data = bytes(head + bytes(-len(head) % 8))
    jeepneys, ours = both_read(data, len(data))
    same(jeepneys[0], ours[0])
    assert ours[0].header.fields[HeaderFields.member] == ["Odd", "Member"]


def test_a_message_with_descriptors_is_left_to_jeepney():
    address = DBusAddress("/x", bus_name="org.resourced", interface="org.resourced.X")
    read, write = os.pipe()
    try:
        fds = __import__("array").array("i")
        data = new_method_call(address, "Take", "h", (read,)).serialise(serial=1, fds=fds)
        parser = Parser()
        parser.__class__ = wire.FastParser
        parser.add_data(data, fds=["fd-object"])
        msg = parser.get_next_message()
        assert msg.body == ("fd-object",) and parser.fds == []
        assert msg.header.fields[HeaderFields.unix_fds] == 1
    finally:
        os.close(read)
        os.close(write)


def test_install_keeps_what_the_parser_had_buffered():
    class Connection:
        parser = Parser()

    address = DBusAddress("/x", bus_name="org.resourced", interface="org.resourced.X")
    data = new_method_call(address, "Ping").serialise(serial=1)
    conn = Connection()
    conn.parser.add_data(data[:20])
    wire.install(conn)
    assert type(conn.parser) is wire.FastParser
    conn.parser.add_data(data[20:])
    assert conn.parser.get_next_message().header.fields[HeaderFields.member] == "Ping"


def test_install_leaves_a_parser_it_does_not_know_alone():
    class Other(Parser):
        pass

    class Connection:
        parser = Other()

    wire.install(Connection)
    wire.install(None)
    assert type(Connection.parser) is Other


# -- writing ---------------------------------------------------------------------------


@settings(max_examples=400, deadline=None)
@given(bodies(), st.sampled_from(["Do", "Release"]), st.integers(1, 2**32 - 1),
       st.sampled_from([0, 4]))
def test_it_writes_what_jeepney_writes(body, member, serial, flags):
    sig, values = body
    address = DBusAddress("/org/resourced/claim/c1", bus_name="org.resourced",
                          interface="org.resourced.X")
    expected = new_method_call(address, member, sig or None, values)
    expected.header.flags |= flags
    ours = wire.fast(new_method_call(address, member, sig or None, values))
    ours.header.flags |= flags
    assert ours.serialise(serial=serial) == expected.serialise(serial=serial)
    assert ours.serialise(serial=serial) == expected.serialise(serial=serial)  # (cached)


@given(st.sampled_from([("u", (-1,)), ("s", (5,)), ("a{sv}", ({"k": ("u", "x")},)),
                        ("(us)", ((1,),))]))
def test_what_it_cannot_write_fails_as_jeepney_says(case):
    sig, values = case
    address = DBusAddress("/x", bus_name="org.resourced", interface="org.resourced.X")
    with pytest.raises(Exception) as jeepneys:
        new_method_call(address, "Do", sig, values).serialise(serial=1)
    with pytest.raises(type(jeepneys.value)):
        wire.fast(new_method_call(address, "Do", sig, values)).serialise(serial=1)
