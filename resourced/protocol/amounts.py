"""Amounts with binary unit suffixes: ``"64G"``, ``"512M"``, ``"1.5T"``, ``"4GiB"``, ``"4096"``.

The units are powers of 1024 (K, M, G, T, P), whichever way they are spelled: ``4G``,
``4Gi``, ``4GiB`` and ``4GB`` are all 4 * 1024**3, because nobody sizing a RAM pool means
10**9.  A number without a unit is a plain count (CPUs, slots, bytes).  A fraction that
does not come out as a whole number is rounded down (``"1.3K"`` is 1331), so an amount
never promises more than was written.  Amounts above ``MAX_AMOUNT`` (2**63 - 1, what
the bus and every pool arithmetic can carry) are refused: no machine has that much.
"""

import re
from fractions import Fraction

__all__ = ["MAX_AMOUNT", "UNITS", "format_bytes", "parse_amount", "parse_count", "parse_memory"]

MAX_AMOUNT = 2**63 - 1
UNITS = {"K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4, "P": 1024**5}

_AMOUNT = re.compile(
    r"""\s*
    (?P<number>\d+(?:\.\d*)?|\.\d+)
    \s*
    (?:(?P<unit>[KMGTP])(?:I|IB|B)?|B)?
    \s*""",
    re.VERBOSE | re.IGNORECASE,
)


def parse_amount(text: str | int, *, allow_zero: bool = False, memory: bool = False) -> int:
    """The whole number ``text`` stands for; ``ValueError`` for garbage, negatives and zero.

    ``allow_zero=True`` accepts ``"0"`` (and fractions that round down to 0); ``memory``
    words the refusals for bytes, which take a unit (``parse_memory``).
    """
    if isinstance(text, bool) or not isinstance(text, (str, int)):
        raise ValueError(f"not an amount: {text!r}")
    if isinstance(text, int):
        value = text
    else:
        m = _AMOUNT.fullmatch(text)
        if m is None and _AMOUNT.fullmatch(text.strip().removeprefix("-")):
            raise ValueError(f"must not be negative, not {text!r}")
        if m is None:
            raise ValueError(
                f"not an amount: {text!r} (expected a number and a unit K, M, G, T or P, "
                "like '24G' or '512M')" if memory else
                f"not an amount: {text!r} (expected a number with an optional unit "
                "K, M, G, T or P, like '64G' or '4096')"
            )
        unit = m["unit"]
        scale = UNITS[unit.upper()] if unit else 1
        value = int(Fraction(m["number"]) * scale)  # int() truncates: rounds down
    if value < 0:
        raise ValueError(f"must not be negative, not {text!r}")
    if value == 0 and not allow_zero:
        raise ValueError(f"must be greater than 0, not {text!r}")
    if value > MAX_AMOUNT:
        most = f"{MAX_AMOUNT // UNITS['P']}P" if memory else str(MAX_AMOUNT)
        raise ValueError(f"too large: {text!r} (at most {most})")
    return value


MIB = 1024**2
_BARE = re.compile(r"\s*\d+(?:\.\d*)?\s*")


def parse_memory(value: str | int, name: str = "memory") -> int:
    """Bytes of memory (VRAM, RAM): text needs a unit (``"4000"`` is refused: 4000 what?);
    an int is bytes, refused under 1 MiB, where it is surely megabytes or a slip."""
    if isinstance(value, str) and _BARE.fullmatch(value):
        raise ValueError(f"{_what(value.strip())} ({name} takes a unit)")
    n = parse_amount(value, memory=True)
    if isinstance(value, int) and n < MIB:
        raise ValueError(f"{_what(str(value))} ({name} as a number is bytes, at least 1 MiB)")
    return n


def _what(number: str) -> str:
    """``4000 what? 4000M or 4G``: the forms a bare number most likely meant."""
    whole = number.isdigit() and int(number) >= 1000 and int(number) % 1000 == 0
    return f"{number} what? {number}M or {int(number) // 1000 if whole else number}G"


def parse_count(value: str | int, name: str = "a count") -> int:
    """A whole number greater than 0, without a unit (CPU cores, slots)."""
    text = value.strip() if isinstance(value, str) else value
    if isinstance(text, bool) or not (isinstance(text, int) or (
            isinstance(text, str) and text.isdigit())) or int(text) <= 0:
        raise ValueError(f"{name} is a whole number greater than 0, without a unit, not "
                         f"{value!r}")
    if int(text) > MAX_AMOUNT:
        raise ValueError(f"{name} is at most {MAX_AMOUNT}, not {value!r}")
    return int(text)


def format_bytes(n: int) -> str:
    """``n`` in the largest unit it reaches, at most two decimals: ``"4G"``, ``"1.5T"``.

    The inverse of ``parse_amount`` for every amount that shows exactly (whole units, or
    halves and quarters of them); otherwise the figure is rounded down for display, so it
    never shows more than there is.  Below 1024 it is the plain number.
    """
    if isinstance(n, bool) or not isinstance(n, int):
        raise ValueError(f"not a whole number: {n!r}")
    if n < 0:
        raise ValueError(f"must not be negative, not {n}")
    for suffix, size in reversed(UNITS.items()):
        if n >= size:
            hundredths = n * 100 // size  # rounded down, so never above 1023.99
            whole, frac = divmod(hundredths, 100)
            if frac == 0:
                return f"{whole}{suffix}"
            return f"{whole}.{frac:02d}".rstrip("0") + suffix
    return str(n)
