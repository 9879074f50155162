"""Times as people type them on the command line, and as tables show them.

``parse_duration`` reads spans (``30s``, ``2h30m``, ``1d``, ``1w``, Slurm's ``2:00:00``) as
float seconds (where a number is also seconds, the configuration and Python, the caller
takes it as it is);
``parse_when`` reads moments (``now``, ``+30m``, ``20:00``, ``tomorrow 09:00``,
``mon 09:00``, ISO 8601) relative to an aware ``now`` in the user's zone;
``format_when`` and ``format_span`` write them back short.  ``usec`` and ``moment``
convert exactly between aware datetimes and microseconds since the Unix epoch.

Standard library only, and no clock: every caller passes ``now``.
"""

import math
import re
from datetime import UTC, datetime, time, timedelta, tzinfo

__all__ = ["DURATION_FORMS", "EPOCH", "format_span", "format_when", "moment", "parse_duration",
           "parse_when", "usec"]

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_ONE_USEC = timedelta(microseconds=1)

_NUMBER = r"(?:\d+(?:\.\d*)?|\.\d+)"
_DURATION = re.compile(
    rf"(?:(?P<w>{_NUMBER})w)?(?:(?P<d>{_NUMBER})d)?(?:(?P<h>{_NUMBER})h)?"
    rf"(?:(?P<m>{_NUMBER})m)?(?:(?P<s>{_NUMBER})s)?",
    re.IGNORECASE | re.ASCII,
)
_UNIT_SECONDS = {"d": 86400, "h": 3600, "m": 60, "s": 1}
_GROUP_SECONDS = {"w": 7 * 86400, **_UNIT_SECONDS}
# Slurm's forms with hours in them (sbatch --time): D-H, D-H:MM, D-H:MM:SS and H:MM:SS.
_SLURM = re.compile(r"(?:(?P<d>\d+)-(?P<dh>\d+)(?::(?P<dm>\d\d)(?::(?P<ds>\d\d))?)?"
                    r"|(?P<h>\d+):(?P<m>\d\d):(?P<s>\d\d))", re.ASCII)
DURATION_FORMS = "30m, 2h, 1d2h, 1w, 2:00:00 or 1-12:00:00"
"""The one grammar of spans, as every refusal names it."""

_CLOCK = re.compile(r"(?P<hour>\d{1,2}):(?P<minute>\d{2})(?::(?P<second>\d{2}))?", re.ASCII)
_ISO = re.compile(
    r"\d{4}-\d{2}-\d{2}"
    r"(?:[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d{1,6})?)?(?:Z|[+-]\d{2}:?\d{2})?)?",
    re.IGNORECASE | re.ASCII,
)
_DAY_NAMES = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_MONTH_NAMES = ("Jan", "Feb", "Mar", "Apr", "May", "Jun",
                "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
_WEEKDAYS = {
    name: i
    for i, full in enumerate(
        ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
    )
    for name in (full, full[:3])
}
_WHEN_FORMS = (
    "now, +DURATION (+30m, +2h, +1d), HH:MM, today HH:MM, tomorrow HH:MM, "
    "yesterday [HH:MM], "
    "WEEKDAY HH:MM (mon 09:00), or ISO 8601 (2026-12-01, 2026-12-01T09:00, "
    "2026-12-01T09:00+01:00)"
)


def parse_duration(text: str) -> float:
    """Seconds in ``text``: unit groups in the order w, d, h, m, s (``30s``, ``5m``,
    ``1h30m``, ``1d2h``, ``1.5h``, ``1w``), or Slurm's ``H:MM:SS``, ``D-H``, ``D-H:MM`` and
    ``D-H:MM:SS``.

    A bare number is refused: Slurm reads ``90`` as minutes where seconds would be meant
    here, so the unit is asked for; so is ``MM:SS``, which Slurm reads as minutes and
    people as hours.  ``ValueError`` naming the forms for anything else, negatives
    included; ``0s`` is 0.0.
    """
    stripped = str(text).strip()
    if re.fullmatch(_NUMBER, stripped, re.ASCII):
        raise ValueError(f"{stripped} what? Give the unit: {stripped}s, {stripped}m or "
                         f"{stripped}h (forms: {DURATION_FORMS})")
    if re.fullmatch(r"\d+:\d\d", stripped, re.ASCII):
        raise ValueError(f"{stripped} is minutes:seconds to Slurm and hours:minutes to most "
                         f"people: say {stripped}:00 for hours or use units (forms: "
                         f"{DURATION_FORMS})")
    seconds = None
    slurm = _SLURM.fullmatch(stripped)
    if slurm is not None:
        d, h, m, s = (slurm["d"], slurm["dh"], slurm["dm"], slurm["ds"]) if slurm["d"] \
            else (None, slurm["h"], slurm["m"], slurm["s"])
        if int(m or 0) < 60 and int(s or 0) < 60:
            seconds = float(int(d or 0) * 86400 + int(h) * 3600 + int(m or 0) * 60 + int(s or 0))
    elif stripped:
        match = _DURATION.fullmatch(stripped)
        if match is not None:
            seconds = sum(float(number) * _GROUP_SECONDS[unit]
                          for unit, number in match.groupdict().items() if number is not None)
    if seconds is None or not math.isfinite(seconds):
        raise ValueError(f"expected a duration like {DURATION_FORMS}, not {text!r}")
    return seconds


def parse_when(text: str, now: datetime) -> datetime:
    """The moment ``text`` names, as an aware datetime in the zone of ``now``.

    Forms (case-insensitive): ``now``; ``+DURATION``; ``HH:MM`` (the next time the clock
    shows it; refused when that is this minute or more than 12 hours away, so that a
    day is never added silently); ``yesterday``, ``today``, ``tomorrow`` (the
    day's start) and with ``HH:MM`` (may be past: what ``format_when`` writes reads back); ``WEEKDAY HH:MM`` (``mon``/``monday``: the next one, today if
    still ahead); ISO 8601 date or date and time, local to ``now`` unless it carries
    ``Z`` or an offset.  ``ValueError`` naming these forms for anything else.
    """
    _require_aware(now, "now")
    words = str(text).strip().lower().split()
    try:
        result = _parse_words(words, str(text).strip(), now)
    except OverflowError:
        result = None
    if result is None:
        raise ValueError(f"expected a time like {_WHEN_FORMS}, not {text!r}")
    return result


CLEAR_AHEAD = timedelta(hours=12)
"""How far ahead a bare time of day may be taken to lie: farther, it has passed today."""


def _check_clear(text: str, clock: time, candidate: datetime, now: datetime) -> None:
    """A bare ``HH:MM`` is the next such instant, unless that is this very minute or more
    than 12 hours away (it has just passed, most often): then which day is meant is not
    clear, and the forms that say it are named instead of a day added silently."""
    hhmm = f"{clock.hour:02d}:{clock.minute:02d}"
    if (clock.hour, clock.minute) == (now.hour, now.minute):
        why = "is this very minute"
    elif candidate - now > CLEAR_AHEAD:
        why = f"has passed today (it is {now:%H:%M})"
    else:
        return
    # (today HH:MM is past in both cases: named as such, not offered as a way to book)
    raise ValueError(f"{text} {why}: say now, +DURATION or tomorrow {hhmm} "
                     f"(today {hhmm} is past)")


def _parse_words(words: list[str], stripped: str, now: datetime) -> datetime | None:
    zone = now.tzinfo
    today = now.date()
    if words == ["now"]:
        return now
    if len(words) == 1 and words[0] in _DAYS:  # the day's start: "--since yesterday"
        return datetime.combine(today + timedelta(days=_DAYS[words[0]]), time(), tzinfo=zone)
    if stripped.startswith("+"):
        rest = stripped[1:].strip()
        if re.fullmatch(_NUMBER, rest, re.ASCII):  # +90: the unit is asked for, as for 90
            parse_duration(rest)
        try:
            seconds = parse_duration(rest)
        except ValueError:
            return None
        return _plus(now, timedelta(seconds=seconds))
    if len(words) == 1 and (clock := _clock(words[0])) is not None:
        candidate = datetime.combine(today, clock, tzinfo=zone)
        if candidate <= now:
            candidate = datetime.combine(today + timedelta(days=1), clock, tzinfo=zone)
        _check_clear(stripped, clock, candidate, now)
        return candidate
    if len(words) == 2 and (clock := _clock(words[1])) is not None:
        day, wanted = words[0], _WEEKDAYS.get(words[0])
        if day in _DAYS:
            return datetime.combine(today + timedelta(days=_DAYS[day]), clock, tzinfo=zone)
        if wanted is not None:
            ahead = (wanted - today.weekday()) % 7
            candidate = datetime.combine(today + timedelta(days=ahead), clock, tzinfo=zone)
            if candidate <= now:
                candidate = datetime.combine(
                    today + timedelta(days=ahead + 7), clock, tzinfo=zone
                )
            return candidate
    if _ISO.fullmatch(stripped):
        try:
            parsed = datetime.fromisoformat(stripped.upper())
        except ValueError:
            return None
        if parsed.tzinfo is None:
            return datetime.combine(parsed.date(), parsed.time(), tzinfo=zone)
        return parsed.astimezone(zone)
    return None


_DAYS = {"yesterday": -1, "today": 0, "tomorrow": 1}


def _clock(word: str) -> time | None:
    """``HH:MM`` or ``HH:MM:SS`` on a 24-hour clock, else None."""
    m = _CLOCK.fullmatch(word)
    if m is None:
        return None
    hour, minute, second = int(m["hour"]), int(m["minute"]), int(m["second"] or 0)
    if hour > 23 or minute > 59 or second > 59:
        return None
    return time(hour, minute, second)


def _plus(now: datetime, delta: timedelta) -> datetime:
    """``now + delta`` in elapsed time (across a DST change too), in ``now``'s zone."""
    return (now.astimezone(UTC) + delta).astimezone(now.tzinfo)


def format_when(moment: datetime, now: datetime) -> str:
    """``moment`` short, in the zone of ``now``: ``today 20:00``, ``tomorrow 09:00``,
    ``yesterday 18:30``, ``Tue 1 Dec 09:00`` within 6 days, else ``2026-12-24 09:00``.
    Seconds appear only when not zero (``today 20:00:30``).
    """
    _require_aware(moment, "moment")
    _require_aware(now, "now")
    local = moment.astimezone(now.tzinfo)
    clock = f"{local.hour:02d}:{local.minute:02d}"
    if local.second:
        clock += f":{local.second:02d}"
    days = (local.date() - now.astimezone(now.tzinfo).date()).days
    if days == 0:
        return f"today {clock}"
    if days == 1:
        return f"tomorrow {clock}"
    if days == -1:
        return f"yesterday {clock}"
    if abs(days) <= 6:
        day = local.date()
        return f"{_DAY_NAMES[day.weekday()]} {day.day} {_MONTH_NAMES[day.month - 1]} {clock}"
    return f"{local.date().isoformat()} {clock}"


def format_span(seconds: float) -> str:
    """``seconds`` as ``2h30m``, ``45m``, ``1d2h``, ``30s``, ``1h0m5s``: the units from the
    largest to the smallest that are not zero, ``0s`` for nothing.  Fractions of a
    second are dropped; a negative span gets a leading ``-``.
    """
    if not math.isfinite(seconds):
        raise ValueError(f"not a span of time: {seconds!r}")
    if seconds < 0:
        return "-" + format_span(-seconds)
    left = math.floor(seconds)
    counts = []
    for unit, size in _UNIT_SECONDS.items():
        count, left = divmod(left, size)
        counts.append((count, unit))
    shown = [i for i, (count, _) in enumerate(counts) if count]
    if not shown:
        return "0s"
    return "".join(f"{count}{unit}" for count, unit in counts[shown[0]:shown[-1] + 1])


def usec(moment: datetime) -> int:
    """Microseconds since the Unix epoch for an aware ``moment``, exactly."""
    _require_aware(moment, "moment")
    return (moment - EPOCH) // _ONE_USEC


def moment(usec: int, tz: tzinfo) -> datetime:
    """The aware datetime ``usec`` microseconds after the Unix epoch, in zone ``tz``."""
    return (EPOCH + timedelta(microseconds=usec)).astimezone(tz)


def _require_aware(value: datetime, what: str) -> None:
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"{what} must be a timezone-aware datetime, not {value!r}")

