"""What a call sends: friendly arguments, checked, as the bus's types and options.

Every refusal is an ``InvalidArgs`` raised before anything is sent (never a
``struct.error`` from the encoder later).
"""

import os

from resourced.errors import InvalidArgs
from resourced.protocol import records as tables
from resourced.protocol.time import USEC, Usec, seconds_of, seconds_of_usec, usec_of_seconds


def parsed(parser: str, value, *name: str) -> int:
    """``resourced.protocol.amounts``' ``parser`` (parse_amount, parse_memory, parse_count) of
    ``value``; its refusal as InvalidArgs."""
    from resourced.protocol import amounts

    try:
        return getattr(amounts, parser)(value, *name)
    except ValueError as exc:
        raise InvalidArgs(str(exc)) from None


def bus_whole(name: str, value, low: int, high: int) -> int:
    """A whole number the bus can carry, or InvalidArgs (never a struct.error later)."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidArgs(f"{name} must be a whole number from {low} to {high}, not {value!r}")
    return value


def bus_string(name: str, value) -> str:
    """A string the bus accepts: D-Bus strings are UTF-8 without NUL (the bus drops a
    connection that sends one)."""
    if not isinstance(value, str):
        raise InvalidArgs(f"{name} must be a string, not {value!r}")
    if "\0" in value:
        raise InvalidArgs(f"{name} must not contain a NUL character")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidArgs(f"{name} is not valid UTF-8 text") from None
    return value


def named_gpus(names) -> list[str] | None:
    """GPUs named by alias, index or UUID, as the ``GPUNames`` and ``Exclude`` options
    carry them (None: the option left out)."""
    return None if names is None else [bus_string("GPU", str(g)) for g in names]


UINT32_MAX = 2**32 - 1
INT32 = (-(2**31), 2**31 - 1)


def session_option(session: str | None) -> dict:
    """The ``Session`` option: the one given, else ``$RESOURCED_SESSION`` (which an agent
    sets once and its sub-agents inherit), else none (the daemon then takes the owner
    process's Unix session)."""
    if session is None:
        session = os.environ.get("RESOURCED_SESSION") or None
    return tables.options(tables.SESSION_OPTION,
                          session=None if session is None else bus_string("session", session))


def memory_and_counts(vram=None, ram=None, cpu=None, pools=None, vram_mb=None, ram_mb=None
                      ) -> tuple[int | None, dict[str, int]]:
    """(VRAM bytes or None, pool amounts) from friendly arguments: memory as text with a
    unit (``"4G"``) or bytes (at least 1 MiB), or in MiB (``vram_mb=``, ``ram_mb=``, the
    file-lock library's names); cpu a whole count; other pools as ``parse_amount`` reads."""
    for given, in_mib, name in ((vram, vram_mb, "vram"), (ram, ram_mb, "ram")):
        if given is not None and in_mib is not None:
            raise InvalidArgs(f"give {name} or {name}_mb, not both")
    if vram_mb is not None:
        vram = bus_whole("vram_mb", vram_mb, 1, UINT32_MAX) * 1024**2
    if ram_mb is not None:
        ram = bus_whole("ram_mb", ram_mb, 1, UINT32_MAX) * 1024**2
    amounts = {bus_string("pool name", name): parsed("parse_amount", v)
               for name, v in (pools or {}).items()}
    if ram is not None:
        amounts["ram"] = parsed("parse_memory", ram, "ram")
    if cpu is not None:
        amounts["cpu"] = parsed("parse_count", cpu, "cpu")
    return None if vram is None else parsed("parse_memory", vram, "vram"), amounts


LONGEST_SPAN = 2**63 // USEC
"""Seconds: the most a duration can be, in the bus's microseconds (a signed 64-bit count)."""


def span(name: str, value) -> int:
    """A duration as microseconds (more than 0): seconds, text (``2h``) or a ``Usec``."""
    from resourced.protocol.when import parse_duration

    if isinstance(value, Usec) and 0 < value < 2**63:
        return int(value)
    if isinstance(value, Usec):
        value = seconds_of_usec(value)  # refused below, in seconds as people read them
    if isinstance(value, str):
        try:
            value = parse_duration(value)
        except ValueError as exc:
            raise InvalidArgs(f"{name}: {exc}") from None
    if (isinstance(value, bool) or not isinstance(value, (int, float))
            or not 0 < value):
        raise InvalidArgs(f"{name} must be more than 0 seconds, not {value!r}")
    if value >= LONGEST_SPAN:
        raise InvalidArgs(f"{name} must be less than {LONGEST_SPAN // 86400:,} days "
                          f"(about 292,000 years), not {value:.3g} seconds")
    return usec_of_seconds(value)


def wait_span(value) -> int:
    """How long a claim waits in the queue, as microseconds: seconds or a ``Usec``, at
    least 0."""
    if isinstance(value, Usec) and 0 <= value < 2**63:
        return int(value)
    seconds = seconds_of(value)
    if not 0 <= seconds < 2**63 / USEC:
        raise InvalidArgs(f"timeout must be a number of seconds of at least 0, not {seconds!r}")
    return usec_of_seconds(seconds)
