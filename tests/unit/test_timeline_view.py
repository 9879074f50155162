"""gpuctl timeline as text: which cells each entry takes (half-open, from the arithmetic),
open ends, shares, letters, the legend, and every line within the width."""

import itertools
from datetime import UTC, datetime, timedelta, timezone
from fractions import Fraction

import pytest

from resourced.tui.timeline import LETTERS, render_timeline

S = 1_000_000  # a second, in microseconds
M = 60 * S
H = 3600 * S
PLUS_0530 = timezone(timedelta(hours=5, minutes=30))
NOW = int(datetime(2026, 12, 1, 14, 7, tzinfo=UTC).timestamp()) * S  # a Tuesday


def gpu(i: int, label: str | None = None) -> dict:
    return {"index": i, "uuid": f"GPU-{i}", "label": label or f"gpu{i}"}


GPUS = [gpu(0), gpu(1), gpu(2)]


def entry(ref, start, end, *gpus, user="alice", kind="claim", shared=False) -> dict:
    return {"id": ref, "user": user, "gpus": [f"GPU-{i}" for i in gpus],
            "start_usec": start, "end_usec": end, "kind": kind, "shared": shared}


def render(entries, gpus=GPUS, hours=8, tz=UTC, width=100) -> str:
    return render_timeline(gpus, entries, NOW, hours, tz, width)


def cells_of(text: str, label: str, label_w: int) -> str:
    (line,) = [line for line in text.splitlines() if line.startswith(label + " ")]
    return line[label_w + 1:]


def expected_columns(start: int, end: int, hours: float, cells: int) -> list[int]:
    """Cell c covers [now + c * window / cells, now + (c + 1) * window / cells)."""
    window = Fraction(round(hours * 3600 * S))
    def edge(c):
        return NOW + c * window / cells
    return [c for c in range(cells) if edge(c) < end and start < edge(c + 1)]


def legend(text: str) -> list[str]:
    return text.split("\n\n", 1)[1].splitlines()


def test_free_gpus_are_all_dots():
    text = render([])
    for g in GPUS:
        cells = cells_of(text, g["label"], 5)
        assert len(cells) == 100 - 6
        assert set(cells) == {"."}
    assert legend(text) == ["no claims or bookings in this window"]


@pytest.mark.parametrize("tz", [UTC, PLUS_0530])
@pytest.mark.parametrize("hours", [8, 5.5, 27])
def test_a_booking_in_the_middle_takes_its_columns(tz, hours):
    start, end = NOW + 2 * H + 7 * M + 13 * S, NOW + 3 * H + 31 * M
    text = render([entry("b1", start, end, 1, kind="booking")], hours=hours, tz=tz)
    cells = cells_of(text, "gpu1", 5)
    taken = [c for c, ch in enumerate(cells) if ch != "."]
    assert taken == expected_columns(start, end, hours, len(cells))
    assert {cells[c] for c in taken} == {"A"}
    assert set(cells_of(text, "gpu0", 5)) == set(cells_of(text, "gpu2", 5)) == {"."}


def test_a_booking_ending_on_a_column_edge_leaves_the_next_column_free():
    # label column 9 wide: 100 - 10 = 90 cells over 9 hours, six minutes each
    gpus = [gpu(0, "gpu0-wide"), gpu(1, "gpu1")]
    start, end = NOW + 10 * 6 * M, NOW + 20 * 6 * M
    text = render([entry("b1", start, end, 1, kind="booking")], gpus=gpus, hours=9)
    cells = cells_of(text, "gpu1", 9)
    assert len(cells) == 90
    assert [c for c, ch in enumerate(cells) if ch == "A"] == list(range(10, 20))
    assert expected_columns(start, end, 9, 90) == list(range(10, 20))
    # one microsecond more touches the next column; one less before the start, the previous
    text = render([entry("b1", start - 1, end + 1, 1)], gpus=gpus, hours=9)
    assert [c for c, ch in enumerate(cells_of(text, "gpu1", 9)) if ch == "A"] == list(range(9, 21))


def test_an_open_claim_runs_to_the_right_edge():
    start = NOW + 3 * H
    text = render([entry("c1", start, 0, 0)])
    cells = cells_of(text, "gpu0", 5)
    first = expected_columns(start, NOW + 8 * H, 8, len(cells))[0]
    assert cells == "." * first + "A" * (len(cells) - first)
    assert "from 17:07, open" in legend(text)[0]


def test_an_entry_from_before_now_starts_at_column_zero():
    start, end = NOW - 5 * H + 5 * M, NOW + 1 * H
    text = render([entry("c1", start, end, 2), entry("c2", start, 0, 0)])
    cells = cells_of(text, "gpu2", 5)
    assert cells.startswith("A")
    assert [c for c, ch in enumerate(cells) if ch == "A"] == expected_columns(
        start, end, 8, len(cells))
    assert set(cells_of(text, "gpu0", 5)) == {"B"}
    assert "since 09:12, open" in legend(text)[1]
    assert "today 09:12-15:07" in legend(text)[0]


def test_entries_wholly_outside_the_window_or_on_other_gpus_are_left_out():
    text = render([entry("past", NOW - 3 * H, NOW, 0), entry("later", NOW + 8 * H, 0, 0),
                   entry("elsewhere", NOW, 0, 7), entry("empty", NOW + H, NOW + H, 0)])
    assert all(set(cells_of(text, g["label"], 5)) == {"."} for g in GPUS)
    assert legend(text) == ["no claims or bookings in this window"]


def test_overlapping_shares_give_a_star():
    a = entry("s1", NOW - H, NOW + 3 * H, 2, user="dave", shared=True)
    b = entry("s2", NOW + 2 * H, NOW + 6 * H, 2, user="erin", shared=True)
    text = render([a, b])
    cells = cells_of(text, "gpu2", 5)
    both = [c for c in expected_columns(NOW - H, NOW + 3 * H, 8, len(cells))
            if c in expected_columns(NOW + 2 * H, NOW + 6 * H, 8, len(cells))]
    assert both and [c for c, ch in enumerate(cells) if ch == "*"] == both
    assert set(cells) == {"A", "B", "*", "."}
    assert "share" in legend(text)[0] and "share" in legend(text)[1]
    # the star is in the legend (it was not), and only where one is shown
    assert legend(text)[2].startswith("*  two or more at once")
    assert "two or more at once" not in render([a])


def test_two_entries_meeting_inside_a_cell_give_a_star_and_at_an_edge_do_not():
    # 90 cells of six minutes (see above): a change at 3 minutes into cell 10 is shared
    gpus = [gpu(0, "gpu0-wide")]
    mid = NOW + 10 * 6 * M + 3 * M
    text = render([entry("c1", NOW, mid, 0), entry("c2", mid, 0, 0)], gpus=gpus, hours=9)
    assert cells_of(text, "gpu0-wide", 9) == "A" * 10 + "*" + "B" * 79
    edge = NOW + 10 * 6 * M
    text = render([entry("c1", NOW, edge, 0), entry("c2", edge, 0, 0)], gpus=gpus, hours=9)
    assert cells_of(text, "gpu0-wide", 9) == "A" * 10 + "B" * 80


def example() -> list[dict]:
    return [entry("c7f2m1p", NOW - 5 * H + 5 * M, 0, 0, user="alice"),
            entry("b3x9k2q", NOW + H + 13 * M, NOW + 2 * H + 53 * M, 1, user="bob",
                  kind="booking"),
            entry("b8h4w0z", NOW + 5 * H + 53 * M, NOW + 11 * H, 1, user="carol",
                  kind="booking"),
            entry("c1s5v6d", NOW - 30 * M, NOW + 3 * H, 2, user="dave", shared=True),
            entry("c9r2t7e", NOW + 2 * H, NOW + 6 * H, 2, user="erin", shared=True)]


@pytest.mark.parametrize("width", [100, 60, 40])
@pytest.mark.parametrize("hours", [0.25, 8, 30, 24 * 7])
@pytest.mark.parametrize("tz", [UTC, PLUS_0530])
def test_every_line_fits_the_width(width, hours, tz):
    many = [entry(f"ref-{i:03d}-with-a-long-name", NOW + i * 7 * M, NOW + i * 7 * M + 3 * H,
                  i % 3, user="someone-with-a-very-long-user-name", kind="booking")
            for i in range(30)]
    gpus = [gpu(0), gpu(1, "big"), gpu(2, "a-rather-long-gpu-label-indeed")]
    for entries in (example(), many):
        text = render(entries, gpus=gpus, hours=hours, tz=tz, width=width)
        assert max(len(line) for line in text.splitlines()) <= width
        for g in gpus:  # every row is there once
            assert sum(line.startswith(g["label"][:10]) for line in text.splitlines()) == 1


def test_the_legend_lists_each_entry_once_with_its_letter():
    text = render(example())
    lines = legend(text)
    assert [line.split()[:5] for line in lines] == [
        ["A", "c7f2m1p", "alice", "claim", "since"],
        ["B", "c1s5v6d", "dave", "share", "today"],
        ["C", "b3x9k2q", "bob", "booking", "today"],
        ["D", "c9r2t7e", "erin", "share", "today"],
        ["E", "b8h4w0z", "carol", "booking", "today"],
        ["*", "two", "or", "more", "at"],  # the mark two overlapping shares make
    ]
    assert lines[2].endswith("today 15:20-17:00")
    assert lines[4].endswith("today 20:00-Wed 2 Dec 01:07")
    assert set(cells_of(text, "gpu1", 5)) == {".", "C", "E"}


def test_an_entry_on_several_gpus_has_one_letter_and_one_legend_line():
    text = render([entry("c1", NOW, NOW + H, 0, 2)])
    assert len(legend(text)) == 1
    assert cells_of(text, "gpu0", 5) == cells_of(text, "gpu2", 5)
    assert set(cells_of(text, "gpu1", 5)) == {"."}


def test_legend_times_are_in_the_zone_with_a_date_when_not_today():
    # 14:07 UTC is 19:37 in +05:30; 04:00 UTC tomorrow is 09:30 Wed 2 Dec there
    b = entry("b1", NOW + 13 * H + 53 * M, NOW + 15 * H + 53 * M, 0, kind="booking")
    text = render([b], hours=24, tz=PLUS_0530)
    assert legend(text)[0].endswith("booking  Wed 2 Dec 09:30-11:30")
    assert "19:37" in text.splitlines()[1]


def test_labels_of_different_length_align():
    gpus = [gpu(0, "big"), gpu(1, "gpu1"), gpu(2, "the-huge-one")]
    text = render([entry("c1", NOW, 0, 0, 1, 2)], gpus=gpus)
    lines = text.splitlines()
    rows = [line for g in gpus for line in lines if line.startswith(g["label"] + " ")]
    assert len(rows) == 3
    assert {len(line) for line in rows} == {100}
    assert {line.index("A") for line in rows} == {len("the-huge-one") + 1}
    now_line = next(line for line in lines if line.startswith("now"))
    assert now_line.index("|") == len("the-huge-one") + 1


def test_now_is_marked_and_the_header_has_times_and_dates():
    text = render([], hours=14)
    lines = text.splitlines()
    assert lines[0].split() == ["Tue", "1", "Dec", "Wed", "2", "Dec"]
    assert lines[1].split()[0] == "14:07" and "00:00" in lines[1]
    assert lines[2].startswith("now   |")
    # a label sits where its tick is, and at least 10 columns from the next
    ticks = [i for i, ch in enumerate(lines[2]) if ch in "|'"]
    assert ticks == [i for i, ch in enumerate(lines[1]) if ch != " " and lines[1][i - 1] == " "]
    assert all(b - a >= 10 for a, b in itertools.pairwise(ticks))
    assert "Dec" not in render([], hours=8)  # no day change, no dates


def test_thirty_entries_render_with_letters_wrapping():
    entries = [entry(f"r{i:02d}", NOW + i * 15 * M, NOW + i * 15 * M + 10 * M, i % 3)
               for i in range(30)]
    text = render(entries)
    lines = legend(text)
    assert len(lines) == 30
    assert [line[0] for line in lines] == list(LETTERS[:30])
    assert lines[26].startswith("a  r26")
    grid = "".join(cells_of(text, g["label"], 5) for g in GPUS)
    assert set(LETTERS[:30]) <= set(grid)


def test_beyond_the_letters_entries_are_marked_with_a_hash():
    entries = [entry(f"r{i:02d}", NOW, NOW + H, i % 3, shared=True) for i in range(70)]
    lines = legend(render(entries))
    assert len(lines) == 70 + 2  # and the keys of * and #
    assert [line[0] for line in lines[len(LETTERS):70]] == ["#"] * (70 - len(LETTERS))
    assert lines[70:] == [
        "*  two or more at once (shares of one GPU, or one ending as the next starts within "
        "the cell)",
        f"#  an entry past the {len(LETTERS)} that have a letter"]


def test_no_gpus_is_one_line():
    text = render([entry("c1", NOW, 0, 0)], gpus=[])
    assert text == "no GPUs to show"


@pytest.mark.parametrize("width", [0, 20, 39])
def test_a_width_under_40_is_refused(width):
    with pytest.raises(ValueError):
        render([], width=width)
    render([], width=40)


@pytest.mark.parametrize("hours", [0, -1, float("nan")])
def test_a_window_of_no_time_is_refused(hours):
    with pytest.raises(ValueError):
        render([], hours=hours)
