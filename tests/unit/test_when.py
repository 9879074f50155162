import re
from datetime import UTC, datetime, timedelta, timezone

import click
import pytest
from hypothesis import given
from hypothesis import strategies as st

from resourced.cli._options import Duration
from resourced.protocol.time import USEC, Usec
from resourced.protocol.when import (
    EPOCH,
    format_span,
    format_when,
    moment,
    parse_duration,
    parse_when,
    usec,
)

PLUS1 = timezone(timedelta(hours=1))
# Tuesday 1 December 2026, 14:30:00 UTC.
NOW = datetime(2026, 12, 1, 14, 30, tzinfo=UTC)
# The same wall time in UTC+01:00 (13:30 UTC).
NOW1 = datetime(2026, 12, 1, 14, 30, tzinfo=PLUS1)


# --- parse_duration -------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, seconds",
    [
        ("0s", 0.0),
        ("30s", 30.0),
        ("5m", 300.0),
        ("2h", 7200.0),
        ("1h", 3600.0),
        ("1d", 86400.0),
        ("1h30m", 5400.0),
        ("2h30m", 9000.0),
        ("1d2h", 93600.0),
        ("2h30m15s", 9015.0),
        ("1d1h1m1s", 90061.0),
        ("1.5h", 5400.0),
        ("0.5m", 30.0),
        (".5h", 1800.0),
        ("1.5d", 129600.0),
        ("2H30M", 9000.0),
        ("  5m\t", 300.0),
        ("1w", 604800.0),
        ("1w2d", 777600.0),
        ("2:00:00", 7200.0),
        ("0:30:15", 1815.0),
        ("1-12:00:00", 129600.0),
        ("1-12", 129600.0),
        ("2-0:30", 174600.0),
    ],
)
def test_parse_duration(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(
    "text",
    ["", "   ", "xyz", "-5", "-5m", "5x", "5 m", "1h 30m", "30m1h", "1s1m", "h", "1hh",
     "5y", "1d1w", "1.2.3", "+5m", "inf", "nan", "1e3", "\u0665m", "9" * 400 + "d",
     "1:60:00", "1:00:60", "1-", "-1:00:00", "1:2:3"],
)
def test_parse_duration_refuses(text):
    with pytest.raises(ValueError, match=r"expected a duration like 30m, 2h, 1d2h, 1w, "
                                         r"2:00:00 or 1-12:00:00"):
        parse_duration(text)


@pytest.mark.parametrize("text", ["90", "2.5", "0", " 60 "])
def test_a_bare_number_is_refused_with_the_forms(text):
    """Slurm reads 90 as minutes, resourced read it as seconds: neither is guessed."""
    with pytest.raises(ValueError, match=r"what\? Give the unit: .*s, .*m or .*h \(forms: 30m"):
        parse_duration(text)


def test_minutes_and_seconds_are_refused_as_unclear():
    with pytest.raises(ValueError, match=r"2:00 is minutes:seconds to Slurm .* say 2:00:00"):
        parse_duration("2:00")


def test_parse_duration_names_the_input():
    with pytest.raises(ValueError, match=r"not 'xyz'"):
        parse_duration("xyz")


# --- the Duration click type ------------------------------------------------------------


@pytest.mark.parametrize(
    "text, seconds",
    [("90s", 90.0), ("30s", 30.0), ("5m", 300.0), ("1h", 3600.0), ("2h30m", 9000.0),
     ("1.5h", 5400.0), ("1d", 86400.0)],
)
def test_duration_type(text, seconds):
    got = Duration().convert(text, None, None)
    assert got == seconds * USEC and isinstance(got, Usec)


def test_duration_type_passes_microseconds_through():
    assert Duration().convert(Usec(12_500_000), None, None) == 12_500_000


def test_duration_type_fails_as_click_does():
    with pytest.raises(click.BadParameter, match="expected a duration"):
        Duration().convert("soon", None, None)


# --- parse_when -------------------------------------------------------------------------


def local(now, *args):
    return datetime(*args, tzinfo=now.tzinfo)


@pytest.mark.parametrize("now", [NOW, NOW1], ids=["utc", "plus1"])
@pytest.mark.parametrize(
    "text, expected",
    [
        ("now", (2026, 12, 1, 14, 30)),
        ("NOW", (2026, 12, 1, 14, 30)),
        ("  now ", (2026, 12, 1, 14, 30)),
        ("+30m", (2026, 12, 1, 15, 0)),
        ("+2h", (2026, 12, 1, 16, 30)),
        ("+1d", (2026, 12, 2, 14, 30)),
        ("+1h30m", (2026, 12, 1, 16, 0)),
        ("+90s", (2026, 12, 1, 14, 31, 30)),
        ("+1:30:00", (2026, 12, 1, 16, 0)),
        ("+0s", (2026, 12, 1, 14, 30)),
        ("+1H", (2026, 12, 1, 15, 30)),
        ("20:00", (2026, 12, 1, 20, 0)),
        ("14:31", (2026, 12, 1, 14, 31)),
        ("0:00", (2026, 12, 2, 0, 0)),
        ("2:30", (2026, 12, 2, 2, 30)),  # 12 h ahead: still clear
        ("23:59", (2026, 12, 1, 23, 59)),
        ("20:00:30", (2026, 12, 1, 20, 0, 30)),
        ("today 20:00", (2026, 12, 1, 20, 0)),
        ("today 09:00", (2026, 12, 1, 9, 0)),  # past: returned as is
        ("Today 9:00", (2026, 12, 1, 9, 0)),
        ("tomorrow 09:00", (2026, 12, 2, 9, 0)),
        ("TOMORROW 23:00", (2026, 12, 2, 23, 0)),
        ("tomorrow  09:00", (2026, 12, 2, 9, 0)),
        # 1 December 2026 is a Tuesday.
        ("wed 09:00", (2026, 12, 2, 9, 0)),
        ("wednesday 09:00", (2026, 12, 2, 9, 0)),
        ("mon 09:00", (2026, 12, 7, 9, 0)),
        ("Monday 09:00", (2026, 12, 7, 9, 0)),
        ("sun 12:00", (2026, 12, 6, 12, 0)),
        ("tue 20:00", (2026, 12, 1, 20, 0)),  # today, still ahead
        ("tue 09:00", (2026, 12, 8, 9, 0)),  # today, past: next week
        ("tuesday 14:30", (2026, 12, 8, 14, 30)),  # today, equal: next week
        ("2026-12-01T09:00", (2026, 12, 1, 9, 0)),
        ("2026-12-01 09:00", (2026, 12, 1, 9, 0)),
        ("2026-12-24T09:00:15", (2026, 12, 24, 9, 0, 15)),
        ("2026-12-24t09:00", (2026, 12, 24, 9, 0)),
        ("2026-12-24 09:00:15.250000", (2026, 12, 24, 9, 0, 15, 250000)),
        ("2026-12-01", (2026, 12, 1, 0, 0)),
        ("2027-01-31", (2027, 1, 31, 0, 0)),
    ],
)
def test_parse_when_local(now, text, expected):
    result = parse_when(text, now)
    assert result == local(now, *expected)
    assert result.tzinfo is now.tzinfo


@pytest.mark.parametrize("now", [NOW, NOW1], ids=["utc", "plus1"])
@pytest.mark.parametrize(
    "text, utc",
    [
        ("2026-12-01T09:00Z", (2026, 12, 1, 9, 0)),
        ("2026-12-01T09:00z", (2026, 12, 1, 9, 0)),
        ("2026-12-01 09:00:30Z", (2026, 12, 1, 9, 0, 30)),
        ("2026-12-01T09:00+01:00", (2026, 12, 1, 8, 0)),
        ("2026-12-01T09:00-05:30", (2026, 12, 1, 14, 30)),
        ("2026-12-01T09:00:00+0100", (2026, 12, 1, 8, 0)),
    ],
)
def test_parse_when_with_offset(now, text, utc):
    result = parse_when(text, now)
    assert result == datetime(*utc, tzinfo=UTC)
    assert result.utcoffset() == now.utcoffset()  # shown in the user's zone


def test_parse_when_local_iso_is_in_the_zone_of_now():
    assert parse_when("2026-12-01T09:00", NOW1) == datetime(2026, 12, 1, 8, 0, tzinfo=UTC)
    assert parse_when("2026-12-01", NOW1) == datetime(2026, 11, 30, 23, 0, tzinfo=UTC)


def test_parse_when_today_is_the_date_in_the_zone_of_now():
    # 23:30 UTC on 1 December is already 00:30 on 2 December in UTC+01:00.
    now = datetime(2026, 12, 1, 23, 30, tzinfo=UTC).astimezone(PLUS1)
    assert parse_when("today 09:00", now) == datetime(2026, 12, 2, 9, 0, tzinfo=PLUS1)
    assert parse_when("01:00", now) == datetime(2026, 12, 2, 1, 0, tzinfo=PLUS1)
    assert parse_when("tomorrow 00:15", now) == datetime(2026, 12, 3, 0, 15, tzinfo=PLUS1)


def test_parse_when_plus_crosses_month_and_year():
    now = datetime(2026, 12, 31, 23, 0, tzinfo=UTC)
    assert parse_when("+2h", now) == datetime(2027, 1, 1, 1, 0, tzinfo=UTC)
    assert parse_when("09:00", now) == datetime(2027, 1, 1, 9, 0, tzinfo=UTC)
    assert parse_when("fri 09:00", now) == datetime(2027, 1, 1, 9, 0, tzinfo=UTC)


def test_parse_when_plus_is_elapsed_time_across_dst():
    zoneinfo = pytest.importorskip("zoneinfo")
    try:
        berlin = zoneinfo.ZoneInfo("Europe/Berlin")
    except zoneinfo.ZoneInfoNotFoundError:
        pytest.skip("no time zone database")
    # Clocks went from 02:00 to 03:00 on 29 March 2026.
    now = datetime(2026, 3, 29, 1, 30, tzinfo=berlin)
    later = parse_when("+1h", now)
    assert usec(later) - usec(now) == 3600 * 10**6
    assert (later.hour, later.minute) == (3, 30)


@pytest.mark.parametrize(
    "text",
    ["", "  ", "soon", "later", "now now", "+", "+soon", "+-5m", "-5m", "5m", "24:00",
     "12:60", "12:30:60", "123:00", "12:5", "12", "today 25:00",
     "mon", "mo 09:00", "monday", "monday 09:00 extra", "09:00 today",
     "2026-13-01", "2026-02-30", "2026-12-01T25:00", "2026-12-01X09:00", "2026-12-1",
     "01/12/2026", "2026-12-01T09:00+25:00", "2026-12-01T09", "+99999999999d"],
)
def test_parse_when_refuses(text):
    with pytest.raises(ValueError, match=r"expected a time like now, \+DURATION") as info:
        parse_when(text, NOW)
    message = str(info.value)
    for form in ("HH:MM", "today HH:MM", "tomorrow HH:MM", "WEEKDAY HH:MM", "ISO 8601"):
        assert form in message
    assert repr(text) in message


def test_parse_when_wants_an_aware_now():
    with pytest.raises(ValueError, match="timezone-aware"):
        parse_when("now", datetime(2026, 12, 1, 14, 30))


# --- format_when ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "when, text",
    [
        ((2026, 12, 1, 20, 0), "today 20:00"),
        ((2026, 12, 1, 0, 0), "today 00:00"),
        ((2026, 12, 1, 20, 0, 30), "today 20:00:30"),
        ((2026, 12, 1, 20, 0, 0, 999999), "today 20:00"),
        ((2026, 12, 2, 9, 0), "tomorrow 09:00"),
        ((2026, 11, 30, 18, 30), "yesterday 18:30"),
        ((2026, 12, 3, 9, 0), "Thu 3 Dec 09:00"),
        ((2026, 12, 7, 9, 0), "Mon 7 Dec 09:00"),  # 6 days ahead
        ((2026, 12, 8, 9, 0), "2026-12-08 09:00"),  # 7 days ahead
        ((2026, 11, 29, 9, 0), "Sun 29 Nov 09:00"),
        ((2026, 11, 25, 23, 59, 59), "Wed 25 Nov 23:59:59"),  # 6 days behind
        ((2026, 11, 24, 9, 0), "2026-11-24 09:00"),  # 7 days behind
        ((2026, 12, 24, 9, 0), "2026-12-24 09:00"),
        ((2027, 1, 1, 9, 0, 5), "2027-01-01 09:00:05"),
    ],
)
@pytest.mark.parametrize("now", [NOW, NOW1], ids=["utc", "plus1"])
def test_format_when(now, when, text):
    assert format_when(local(now, *when), now) == text


def test_format_when_shows_the_zone_of_now():
    # 23:30 UTC is 00:30 tomorrow in UTC+01:00.
    assert format_when(datetime(2026, 12, 1, 23, 30, tzinfo=UTC), NOW1) == "tomorrow 00:30"
    assert format_when(datetime(2026, 12, 1, 9, 0, tzinfo=PLUS1), NOW) == "today 08:00"


@pytest.mark.parametrize("now", [NOW, NOW1], ids=["utc", "plus1"])
@pytest.mark.parametrize("text", ["today 20:00", "tomorrow 09:00", "today 20:00:30"])
def test_format_when_reads_back(now, text):
    assert format_when(parse_when(text, now), now) == text


# --- format_span ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "seconds, text",
    [
        (0, "0s"),
        (0.9, "0s"),
        (30, "30s"),
        (59.999, "59s"),
        (60, "1m"),
        (45 * 60, "45m"),
        (9000, "2h30m"),
        (3600, "1h"),
        (3605, "1h0m5s"),
        (86400, "1d"),
        (93600, "1d2h"),
        (86401, "1d0h0m1s"),
        (90061, "1d1h1m1s"),
        (10 * 86400 + 59, "10d0h0m59s"),
        (-90, "-1m30s"),
    ],
)
def test_format_span(seconds, text):
    assert format_span(seconds) == text


@pytest.mark.parametrize("seconds", [float("inf"), float("-inf"), float("nan")])
def test_format_span_refuses_what_is_not_a_span(seconds):
    with pytest.raises(ValueError):
        format_span(seconds)


@given(st.integers(min_value=0, max_value=10**8))
def test_format_span_reads_back(seconds):
    text = format_span(seconds)
    assert parse_duration(text) == seconds
    assert parse_when("+" + text, NOW) - NOW == timedelta(seconds=seconds)
    assert parse_when("+" + text, NOW1) - NOW1 == timedelta(seconds=seconds)


# --- usec and moment --------------------------------------------------------------------


@pytest.mark.parametrize(
    "when, micros",
    [
        (EPOCH, 0),
        (datetime(1970, 1, 1, 0, 0, 0, 1, tzinfo=UTC), 1),
        (datetime(1969, 12, 31, 23, 59, 59, 999999, tzinfo=UTC), -1),
        (datetime(1970, 1, 1, 1, 0, tzinfo=PLUS1), 0),
        (datetime(2026, 12, 1, 14, 30, 0, 123456, tzinfo=UTC), 1796135400123456),
    ],
)
def test_usec(when, micros):
    assert usec(when) == micros
    assert moment(micros, UTC) == when


def test_moment_is_in_the_zone_asked_for():
    m = moment(usec(NOW), PLUS1)
    assert m == NOW
    assert m.tzinfo is PLUS1
    assert (m.hour, m.minute) == (15, 30)


def test_usec_wants_an_aware_moment():
    with pytest.raises(ValueError, match="timezone-aware"):
        usec(datetime(2026, 12, 1))


# Far beyond 2**53 microseconds, where a float would lose the last digits.
@given(st.integers(min_value=usec(datetime(1, 1, 2, tzinfo=UTC)),
                   max_value=usec(datetime(9999, 12, 30, tzinfo=UTC))))
def test_usec_and_moment_round_trip(micros):
    assert usec(moment(micros, UTC)) == micros
    assert usec(moment(micros, PLUS1)) == micros


@given(st.datetimes(min_value=datetime(2, 1, 1), max_value=datetime(9998, 12, 31),
                    timezones=st.sampled_from([UTC, PLUS1])))
def test_moment_and_usec_round_trip(when):
    assert moment(usec(when), when.tzinfo) == when


def test_a_day_word_alone_is_its_start_and_yesterday_reads_back():
    from datetime import UTC, datetime, timedelta

    from resourced.protocol.when import format_when, parse_when

    now = datetime(2026, 12, 1, 15, 30, tzinfo=UTC)
    assert parse_when("yesterday", now) == datetime(2026, 11, 30, tzinfo=UTC)
    assert parse_when("today", now) == datetime(2026, 12, 1, tzinfo=UTC)
    then = now - timedelta(hours=20)
    assert parse_when(format_when(then, now), now) == then  # "yesterday 19:30"


@pytest.mark.parametrize("now", [NOW, NOW1], ids=["utc", "plus1"])
@pytest.mark.parametrize("text, says", [
    ("14:30", "14:30 is this very minute"),
    ("14:30:59", "14:30:59 is this very minute"),
    ("14:29", "14:29 has passed today (it is 14:30)"),
    ("09:00", "09:00 has passed today (it is 14:30)"),
    ("2:31", "2:31 has passed today"),
])
def test_a_bare_time_of_day_never_adds_a_day_silently(now, text, says):
    with pytest.raises(ValueError, match=re.escape(says)) as info:
        parse_when(text, now)
    hhmm = f"{int(text.split(':')[0]):02d}:{text.split(':')[1]}"
    assert f"say now, +DURATION or tomorrow {hhmm} (today {hhmm} is past)" in str(info.value)
