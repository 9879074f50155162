"""Decoding a method's trailing ``a{sv}`` options: known keys, right types, or InvalidArgs."""

from resourced.errors import InvalidArgs, quoted


def parse_options(options: dict, schema: dict[str, str]) -> dict:
    """Plain values for ``options``; ``schema`` maps each accepted key to its signature."""
    values = {}
    for key, variant in options.items():
        expected = schema.get(key)
        if expected is None:
            raise InvalidArgs(f"unknown option {quoted(key)}; known: {', '.join(sorted(schema))}")
        if variant.signature != expected:
            raise InvalidArgs(f"option {quoted(key)} must have type {expected!r}, not {variant.signature!r}")
        values[key] = variant.value
    return values
