"""Reading and writing D-Bus messages for the clients faster than jeepney does, with its results.

jeepney parses each message by walking objects made from its signature, and makes those
objects again for every message and every variant in it: a claim's answer (an ``a{sv}``
of a dozen variants) took about 110 us to read, most of a claim's cost in the client.
Here a signature is compiled once into a reader (a closure over ``struct`` formats) and
kept; the readers give exactly what jeepney gives: ``(signature, value)`` for a
variant, a dict for an array of dict entries, ``bytes`` for ``ay``, tuples for structs,
and jeepney's ``Message`` and ``Header``.  ``install`` puts it under a jeepney
connection (blocking or asyncio) by changing its parser's class, keeping what the
parser has buffered; a message carrying file descriptors, or a jeepney whose parser is
not the one this was written against, is left to jeepney.

Writing is the same in reverse: ``FastMessage`` (a jeepney ``Message`` whose class
``fast`` changes) writes its body with writers compiled once per signature and its
header fields from a cache (a client sends the same few calls again and again), and
gives the bytes jeepney's ``serialise`` gives.  Calls with file descriptors are left
to jeepney.
"""

import struct
from functools import lru_cache

from jeepney.low_level import (
    Endianness,
    Header,
    HeaderFields,
    Message,
    MessageFlag,
    MessageType,
    Parser,
)

_FIXED = {"y": "B", "n": "h", "q": "H", "b": "I", "i": "i", "u": "I", "x": "q", "t": "Q",
          "d": "d"}
_SIZE = {"y": 1, "n": 2, "q": 2, "b": 4, "i": 4, "u": 4, "x": 8, "t": 8, "d": 8}
_ALIGN = {**_SIZE, "s": 4, "o": 4, "g": 1, "v": 1, "a": 4, "(": 8, "{": 8}
_FIELDS = {f.value: f for f in HeaderFields}
_ENDIAN = {b"l": ("<", Endianness.little), b"B": (">", Endianness.big)}
_U32 = {e: struct.Struct(e + "I").unpack_from for e in "<>"}


class Unsupported(Exception):
    """A signature this reader leaves to jeepney (file descriptors, or malformed)."""


def _split(sig: str, at: int) -> int:
    """The end of the single complete type starting at ``sig[at]``."""
    code = sig[at]
    if code == "a":
        return _split(sig, at + 1)
    if code in "({":
        close, depth, i = ")" if code == "(" else "}", 1, at + 1
        while depth:
            if i >= len(sig):
                raise Unsupported(f"unbalanced signature {sig!r}")
            depth += (sig[i] == code) - (sig[i] == close)
            i += 1
        return i
    if code in _ALIGN or code in "so":
        return at + 1
    raise Unsupported(f"type {code!r} in {sig!r}")


def _types(sig: str) -> list[str]:
    """The complete types a signature is made of, in order."""
    out, at = [], 0
    while at < len(sig):
        end = _split(sig, at)
        out.append(sig[at:end])
        at = end
    return out


@lru_cache(maxsize=512)
def reader(sig: str, endian: str):
    """A function ``(buf, pos) -> (value, pos)`` reading one complete type ``sig``."""
    code = sig[0]
    if code in _FIXED:
        fmt, size = struct.Struct(endian + _FIXED[code]), _SIZE[code]
        unpack = fmt.unpack_from
        if code == "b":
            def read_bool(buf, pos):
                pos += -pos % 4
                return bool(unpack(buf, pos)[0]), pos + 4
            return read_bool

        def read_fixed(buf, pos):
            pos += -pos % size
            return unpack(buf, pos)[0], pos + size
        return read_fixed
    if code in "so":
        length = struct.Struct(endian + "I").unpack_from

        def read_string(buf, pos):
            pos += -pos % 4
            n = length(buf, pos)[0]
            pos += 4
            return buf[pos:pos + n].decode("utf-8"), pos + n + 1
        return read_string
    if code == "g":
        return _read_signature
    if code == "v":
        known: dict[bytes, tuple] = {}  # a variant's signature as sent -> (text, reader)

        def read_variant(buf, pos):
            n = buf[pos]
            raw = buf[pos + 1:pos + 1 + n]
            found = known.get(raw)
            if found is None:
                if len(known) > 256:  # (few in practice; bounded whatever is sent)
                    known.clear()
                inner = raw.decode("ascii")
                found = known[raw] = (inner, reader(inner, endian))
            value, pos = found[1](buf, pos + 2 + n)
            return (found[0], value), pos
        return read_variant
    if code == "(":
        return _struct_reader(_types(sig[1:-1]), endian)
    if code == "a":
        return _array_reader(sig[1:], endian)
    raise Unsupported(f"type {code!r}")


def _read_signature(buf, pos):
    n = buf[pos]
    return buf[pos + 1:pos + 1 + n].decode("ascii"), pos + 2 + n


def _struct_reader(fields: list[str], endian: str):
    readers = [reader(f, endian) for f in fields]

    def read_struct(buf, pos):
        pos += -pos % 8
        values = []
        for read in readers:
            value, pos = read(buf, pos)
            values.append(value)
        return tuple(values), pos
    return read_struct


def _array_reader(element: str, endian: str):
    length = struct.Struct(endian + "I").unpack_from
    align = _ALIGN.get(element[0], 1)
    if element == "y":
        def read_bytes(buf, pos):
            pos += -pos % 4
            n = length(buf, pos)[0]
            pos += 4
            return bytes(buf[pos:pos + n]), pos + n
        return read_bytes
    if element[0] == "{":
        key, value = (reader(t, endian) for t in _types(element[1:-1]))

        def read_dict(buf, pos):
            pos += -pos % 4
            n = length(buf, pos)[0]
            pos += 4
            pos += -pos % 8
            end, out = pos + n, {}
            while pos < end:
                pos += -pos % 8
                k, pos = key(buf, pos)
                out[k], pos = value(buf, pos)
            return out, pos
        return read_dict
    read = reader(element, endian)

    def read_array(buf, pos):
        pos += -pos % 4
        n = length(buf, pos)[0]
        pos += 4
        pos += -pos % align
        end, out = pos + n, []
        while pos < end:
            value, pos = read(buf, pos)
            out.append(value)
        return out, pos
    return read_array


_TYPES = {t.value: t for t in MessageType}
_FLAGS: dict[int, MessageFlag] = {}  # a header's flags byte -> jeepney's MessageFlag of it
_STRING, _PATH, _SIGNATURE, _UINT = (ord(c) for c in "sogu")


def _read_header_fields(buf, pos: int, endian: str) -> tuple[dict, int]:
    """The header's fields (an ``a(yv)`` at ``pos``) by jeepney's names; each one's value
    is of the one-letter type its code says (a string, a path, a signature or a uint32),
    read here directly; a header with anything else is read by the generic reader."""
    u32, at = _U32[endian], pos
    n = u32(buf, pos)[0]
    pos += 4 + -(pos + 4) % 8
    end, fields = pos + n, {}
    while pos < end:
        pos += -pos % 8
        code, length, kind = buf[pos], buf[pos + 1], buf[pos + 2]
        pos += 4  # the code, the variant's signature (a length, a letter, a nul)
        if length != 1:
            break
        if kind == _STRING or kind == _PATH:
            pos += -pos % 4
            size = u32(buf, pos)[0]
            fields[_FIELDS[code]] = buf[pos + 4:pos + 4 + size].decode("utf-8")
            pos += 5 + size
        elif kind == _SIGNATURE:
            size = buf[pos]
            fields[_FIELDS[code]] = buf[pos + 1:pos + 1 + size].decode("ascii")
            pos += 2 + size
        elif kind == _UINT:
            pos += -pos % 4
            fields[_FIELDS[code]] = u32(buf, pos)[0]
            pos += 4
        else:
            break
    else:
        return fields, pos
    raw_fields, pos = reader("a(yv)", endian)(buf, at)
    return {_FIELDS[code]: value for code, (_, value) in raw_fields}, pos


def from_buffer(buf: bytes) -> Message:
    """One whole message, as jeepney's ``Message.from_buffer`` makes it (no descriptors)."""
    endian, endianness = _ENDIAN[buf[:1]]
    msg_type, flags, version = buf[1], buf[2], buf[3]
    body_length, serial = struct.unpack_from(endian + "II", buf, 4)
    fields, pos = _read_header_fields(buf, 12, endian)
    if HeaderFields.unix_fds in fields:
        raise Unsupported("file descriptors")
    flag = _FLAGS.get(flags)
    if flag is None:
        flag = _FLAGS[flags] = MessageFlag(flags)
    header = object.__new__(Header)  # as Header() makes it, without its two enum calls
    header.__dict__.update(endianness=endianness, message_type=_TYPES[msg_type], flags=flag,
                           protocol_version=version, body_length=body_length, serial=serial,
                           fields=fields)
    body = ()
    sig = fields.get(HeaderFields.signature)
    if sig:
        body, _ = reader(f"({sig})", endian)(buf, pos + -pos % 8)
    return Message(header, body)


class FastParser(Parser):
    """jeepney's ``Parser``, reading each message with ``from_buffer`` (jeepney's own
    reading for what that leaves to it)."""

    def get_next_message(self):
        if self.next_msg_size is None and self.buf.bytes_buffered >= 16:
            self.next_msg_size = _message_size(self.buf.peek(16))
        size = self.next_msg_size
        if size is None or self.buf.bytes_buffered < size:
            return None
        raw = self.buf.read(size)
        self.next_msg_size = None
        try:
            return from_buffer(raw)
        except (Unsupported, KeyError):
            msg = Message.from_buffer(raw, fds=self.fds)
            self.fds = self.fds[msg.header.fields.get(HeaderFields.unix_fds, 0):]
            return msg


def _message_size(head: bytes) -> int:
    endian = _ENDIAN[head[:1]][0]
    body_length, fields_length = struct.unpack_from(endian + "I4xI", head, 4)
    header = 16 + fields_length
    return header + -header % 8 + body_length


READ_SIZE = 256 * 1024
"""Bytes asked of the socket at once (jeepney asks 4 KiB: a status of 10,000 claims, 4 MB,
took a thousand reads)."""


class _BigReads:
    """A blocking jeepney connection that reads up to ``READ_SIZE`` at once (where it
    passes no file descriptors; jeepney reads those itself)."""

    def _read_some_data(self, timeout=None):
        if self.enable_fds:
            return super()._read_some_data(timeout)
        for key, _ in self.selector.select(timeout):
            if key == self.select_key:
                data = self.sock.recv(READ_SIZE)
                if not data:
                    raise ConnectionResetError("the bus closed the connection")
                return data, []
        raise TimeoutError


def install(connection) -> None:
    """Read ``connection``'s messages (a jeepney connection of either kind) with
    ``FastParser`` from now on, if its parser is jeepney's as this module knows it; a
    blocking one also in bigger reads."""
    parser = getattr(connection, "parser", None)
    if type(parser) is Parser and all(hasattr(parser, name) for name in
                                      ("buf", "fds", "next_msg_size")):
        parser.__class__ = FastParser
    from jeepney.io.blocking import DBusConnection

    if type(connection) is DBusConnection and all(
            hasattr(connection, name) for name in ("selector", "select_key", "sock")):
        connection.__class__ = _big_reads(DBusConnection)


@lru_cache(maxsize=1)
def _big_reads(connection_class: type) -> type:
    return type(connection_class.__name__, (_BigReads, connection_class), {})


# -- writing ---------------------------------------------------------------------------


def _pad(buf: bytearray, align: int) -> None:
    buf += bytes(-len(buf) % align)


@lru_cache(maxsize=512)
def writer(sig: str):
    """A function ``(buf, value)`` appending one complete type ``sig``, little-endian,
    aligned as if ``buf`` began at an 8-byte boundary of the message."""
    code = sig[0]
    if code in _FIXED:
        pack, size = struct.Struct("<" + _FIXED[code]).pack, _SIZE[code]

        def write_fixed(buf, value):
            buf += bytes(-len(buf) % size)
            buf += pack(value)
        return write_fixed
    if code in "so":
        def write_string(buf, value):
            data = value.encode("utf-8")
            buf += bytes(-len(buf) % 4)
            buf += len(data).to_bytes(4, "little")
            buf += data
            buf.append(0)
        return write_string
    if code == "g":
        return _write_signature
    if code == "v":
        def write_variant(buf, value):
            inner, item = value
            _write_signature(buf, inner)
            writer(inner)(buf, item)
        return write_variant
    if code == "(":
        writers = [writer(t) for t in _types(sig[1:-1])]

        def write_struct(buf, value):
            buf += bytes(-len(buf) % 8)
            for write, item in zip(writers, value, strict=True):
                write(buf, item)
        return write_struct
    if code == "a":
        return _array_writer(sig[1:])
    raise Unsupported(f"type {code!r}")


def _write_signature(buf, value):
    data = value.encode("ascii")
    buf.append(len(data))
    buf += data
    buf.append(0)


def _array_writer(element: str):
    align = _ALIGN.get(element[0], 1)
    if element == "y":
        def write_bytes(buf, value):
            buf += bytes(-len(buf) % 4)
            buf += len(value).to_bytes(4, "little")
            buf += value
        return write_bytes
    if element[0] == "{":
        key, val = (writer(t) for t in _types(element[1:-1]))

        def each(buf, value):
            for k, v in value.items():
                buf += bytes(-len(buf) % 8)
                key(buf, k)
                val(buf, v)
    else:
        write = writer(element)

        def each(buf, value):
            for item in value:
                write(buf, item)

    def write_array(buf, value):
        buf += bytes(-len(buf) % 4)
        at = len(buf)
        buf += bytes(4)
        buf += bytes(-len(buf) % align)
        start = len(buf)
        each(buf, value)
        buf[at:at + 4] = (len(buf) - start).to_bytes(4, "little")
    return write_array


_FIELD_CODES = {HeaderFields.path: "o", HeaderFields.interface: "s", HeaderFields.member: "s",
                HeaderFields.error_name: "s", HeaderFields.reply_serial: "u",
                HeaderFields.destination: "s", HeaderFields.sender: "s",
                HeaderFields.signature: "g"}
_HEAD = struct.Struct("<cBBBII")


@lru_cache(maxsize=256)
def _header_fields(fields: tuple) -> bytes:
    """The header's field array (from offset 12) and the padding after it."""
    buf = bytearray(12)
    writer("a(yv)")(buf, [(code.value, (_FIELD_CODES[code], value)) for code, value in fields])
    _pad(buf, 8)
    return bytes(buf[12:])


class FastMessage(Message):
    """A jeepney ``Message`` that writes itself with the writers above."""

    def serialise(self, serial=None, fds=None) -> bytes:
        header = self.header
        fields = header.fields
        if fds or header.endianness is not Endianness.little or \
                not fields.keys() <= _FIELD_CODES.keys():
            return super().serialise(serial, fds)
        try:
            sig = fields.get(HeaderFields.signature)
            body = bytearray()
            if sig:
                writer(f"({sig})")(body, self.body)
            head = _header_fields(tuple(sorted(fields.items())))
        except (Unsupported, TypeError, ValueError, struct.error, OverflowError,
                AttributeError, UnicodeEncodeError):
            return super().serialise(serial, fds)  # jeepney says what is wrong with it
        header.body_length = len(body)
        return _HEAD.pack(b"l", header.message_type.value, header.flags,
                          header.protocol_version, len(body),
                          header.serial if serial is None else serial) + head + body


def fast(msg: Message) -> Message:
    """``msg``, written by ``FastMessage`` from now on."""
    msg.__class__ = FastMessage
    return msg
