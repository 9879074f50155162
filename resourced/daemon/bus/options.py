"""``a{sv}`` by ``protocol.records``' tables: a method's options read (known keys, right
types, or InvalidArgs), and records written."""

import functools

from dbus_fast import Variant

from resourced.errors import InvalidArgs, quoted
from resourced.protocol.records import Field


def parse_options(options: dict, kind: tuple[Field, ...]) -> dict:
    """Plain values for ``options`` by their dict keys (``protocol.records``' ``kind``
    names each accepted bus key, its dict key and its signature)."""
    schema = _by_wire(kind)
    values = {}
    for wire, variant in options.items():
        field = schema.get(wire)
        if field is None:
            raise InvalidArgs(f"unknown option {quoted(wire)}; known: {', '.join(sorted(schema))}")
        if variant.signature != field.signature:
            raise InvalidArgs(f"option {quoted(wire)} must have type {field.signature!r}, "
                              f"not {variant.signature!r}")
        values[field.key] = variant.value
    return values


@functools.cache
def _by_wire(kind: tuple[Field, ...]) -> dict[str, Field]:
    return {f.wire: f for f in kind}


def wire_record(kind: tuple[Field, ...], values: dict) -> dict:
    """A record of ``kind`` as the a{sv} it is on the bus, from its values by dict key (a
    key left out is left out)."""
    return {f.wire: Variant(f.signature, values[f.key]) for f in kind if f.key in values}
