"""gpuctl timeline as text: GPUs in rows, time in columns, who holds what.

The layout, for ``width`` characters::

                   Tue 1 Dec                                Wed 2 Dec
          14:07      15:00      16:00  ...                  00:00
    now   |          '          '                           '
    gpu0  AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA
    big   ......BBBBBBB.........CCCC..............................

    A  c7f2m1p  alice  claim    since 09:12, open
    B  b3x9k2q  bob    booking  today 15:20-16:00

The label column is as wide as the longest GPU label (at least 5), then one space, then
``cells = width - label column - 1`` cells.  The left edge is now exactly and the window is
``hours`` long, so cell ``c`` covers the half-open interval ``[b(c), b(c + 1))`` with
``b(c) = now + c * window / cells``.  A cell shows ``.`` when no entry touches it, the entry's
letter when exactly one does, and ``*`` when more than one does (VRAM shares at once, or one
entry ending and another starting within the cell).  An entry is an interval
``[start, end)``; ``end == 0`` is open-ended and runs to the right edge.

Letters go to the entries that show, in order of start then ref: ``A``-``Z``, ``a``-``z``,
``0``-``9``, then ``#`` for any beyond those.  The time labels sit on round local times (an
interval chosen so that they fall about every 10 or more columns), each starting at the column
that holds its time; the line under them marks now with ``|`` and each label's column with
``'``.  A line of dates appears above when the window crosses a local midnight.

Standard library only: this runs on the CLI path.
"""

from datetime import date, datetime, time, timedelta, tzinfo

from resourced.protocol.time import USEC

MIN_WIDTH = 40
"""The narrowest rendering there is; below it ``render_timeline`` raises ValueError."""
MIN_LABEL = 5
"""The label column is never narrower than this."""
MIN_CELLS = 20
"""Labels are cut so that at least this many cells remain."""
FREE, MANY, OVERFLOW = ".", "*", "#"
NOW_MARK, TICK_MARK = "|", "'"
LETTERS = ("ABCDEFGHIJKLMNOPQRSTUVWXYZ" "abcdefghijklmnopqrstuvwxyz" "0123456789")
TICK_MINUTES = (1, 2, 5, 10, 15, 20, 30, 60, 120, 180, 240, 360, 480, 720, 1440, 2880, 10080)
"""Candidate spacings of the time labels, in minutes; the first wide enough is used."""
TICK_COLUMNS = 10
"""The fewest columns wanted between two time labels."""

_DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


def render_timeline(gpus: list[dict], entries: list[dict], now_usec: int, hours: float,
                    tz: tzinfo | None, width: int = 100) -> str:
    """The timeline from now to now + ``hours``, at most ``width`` characters a line.

    ``gpus`` are ``{"index", "uuid", "label"}`` in display order; ``entries`` are
    ``{"id", "user", "gpus", "start_usec", "end_usec", "kind", "shared"}``.  Times are
    microseconds since the epoch, shown in ``tz`` (``None``: the system's local time).
    """
    if width < MIN_WIDTH:
        raise ValueError(f"the timeline needs a width of at least {MIN_WIDTH}, not {width}")
    if not hours > 0 or hours == float("inf"):
        raise ValueError(f"the window must be a positive number of hours, not {hours}")
    if not gpus:
        return "no GPUs to show"
    label_w = min(max(MIN_LABEL, *(len(g["label"]) for g in gpus)), width - 1 - MIN_CELLS)
    cells = width - label_w - 1
    window = max(1, round(hours * 3600 * USEC))
    grid = Grid(now_usec, window, cells)

    shown = {g["uuid"] for g in gpus}
    visible = [e for e in entries if shown & set(e["gpus"]) and grid.columns(e) is not None]
    visible.sort(key=lambda e: (e["start_usec"], str(e["id"])))
    letters = [LETTERS[i] if i < len(LETTERS) else OVERFLOW for i in range(len(visible))]

    rows, several = [], False
    for g in gpus:
        holders: list[list[int]] = [[] for _ in range(cells)]
        for i, e in enumerate(visible):
            if g["uuid"] in e["gpus"]:
                first, last = grid.columns(e)
                for c in range(first, last + 1):
                    holders[c].append(i)
        several = several or any(len(h) > 1 for h in holders)
        row = "".join(FREE if not h else letters[h[0]] if len(h) == 1 else MANY
                      for h in holders)
        rows.append(g["label"][:label_w].ljust(label_w) + " " + row)

    dates, times, axis = axis_lines(grid, tz)
    pad = " " * (label_w + 1)
    lines = [pad + dates] if dates else []
    lines += [pad + times, "now".ljust(label_w) + " " + axis, *rows]
    lines.append("")
    lines += legend_lines(visible, letters, now_usec, tz, width)
    # the marks that are no entry's letter, when they are shown
    if several:
        lines.append(f"{MANY}  two or more at once (shares of one GPU, or one ending as the "
                     "next starts within the cell)"[:width])
    if OVERFLOW in letters:
        lines.append(f"{OVERFLOW}  an entry past the {len(LETTERS)} that have a letter"[:width])
    return "\n".join(lines)


class Grid:
    """Cell arithmetic, in integers: cell ``c`` is ``[b(c), b(c + 1))``,
    ``b(c) = now + c * window / cells``."""

    def __init__(self, now: int, window: int, cells: int):
        self.now, self.window, self.cells = now, window, cells

    def column_of(self, t: int) -> int:
        """The cell holding instant ``t`` (which may lie outside the window)."""
        return (t - self.now) * self.cells // self.window

    def columns(self, entry: dict) -> tuple[int, int] | None:
        """The first and last cells the entry touches, or None when it misses the window."""
        start, end = entry["start_usec"], entry["end_usec"]
        if end != 0 and end <= start:
            return None
        first = max(0, self.column_of(start))
        if end == 0:
            last = self.cells - 1
        else:
            # the last c with b(c) < end: c * window < (end - now) * cells
            last = min(self.cells - 1, -((self.now - end) * self.cells // self.window) - 1)
        return (first, last) if first <= last else None


def axis_lines(grid: Grid, tz) -> tuple[str, str, str]:
    """The date line (or an empty one), the time line and the axis line, cells only."""
    end = grid.now + grid.window
    start_local = local_time(grid.now, tz)
    span_minutes = next((m for m in TICK_MINUTES
                         if m * 60 * USEC * grid.cells >= TICK_COLUMNS * grid.window),
                        TICK_MINUTES[-1])
    step = span_minutes * 60 * USEC
    base = midnight_of(start_local.date(), tz)
    times = _Line(grid.cells)
    axis = [" "] * grid.cells
    times.put(0, _hhmm(start_local))
    axis[0] = NOW_MARK
    tick = base + ((grid.now - base) // step + 1) * step
    while tick < end:
        column = grid.column_of(tick)
        if column > 0 and times.put(column, _hhmm(local_time(tick, tz))):
            axis[column] = TICK_MARK
        tick += step

    dates = _Line(grid.cells)
    day = start_local.date() + timedelta(days=1)
    midnight = midnight_of(day, tz)
    crossed = midnight < end
    while midnight < end:
        dates.put(grid.column_of(midnight), _day(day))
        day += timedelta(days=1)
        midnight = midnight_of(day, tz)
    if crossed:  # today's date, where it fits before the first change
        dates.put(0, _day(start_local.date()))
    return dates.text(), times.text(), "".join(axis).rstrip()


class _Line:
    """Labels placed left to right, each at its column, with a space between any two,
    none running past the end; one that does not fit is left out."""

    def __init__(self, width: int):
        self.chars = [" "] * width
        self.used: list[tuple[int, int]] = []

    def put(self, column: int, text: str) -> bool:
        stop = column + len(text)
        if column < 0 or stop > len(self.chars):
            return False
        if any(column <= b and a <= stop for a, b in self.used):
            return False
        self.chars[column:stop] = text
        self.used.append((column, stop))
        return True

    def text(self) -> str:
        return "".join(self.chars).rstrip()


def legend_lines(visible: list[dict], letters: list[str], now: int, tz, width: int) -> list[str]:
    if not visible:
        return ["no claims or bookings in this window"]
    today = local_time(now, tz).date()
    rows = [(letter, str(e["id"]), str(e["user"]), _kind(e), _when(e, now, today, tz))
            for letter, e in zip(letters, visible)]
    ref_w = max(len(r[1]) for r in rows)
    user_w = max(len(r[2]) for r in rows)
    kind_w = max(len(r[3]) for r in rows)
    when_w = max(len(r[4]) for r in rows)
    fixed = 1 + 2 + 2 + 2 + kind_w + 2 + when_w
    while fixed + ref_w + user_w > width and max(ref_w, user_w) > 4:
        if ref_w >= user_w:
            ref_w -= 1
        else:
            user_w -= 1
    return [f"{letter}  {ref[:ref_w]:<{ref_w}}  {user[:user_w]:<{user_w}}  {kind:<{kind_w}}"
            f"  {when}"[:width].rstrip()
            for letter, ref, user, kind, when in rows]


def _kind(entry: dict) -> str:
    """``claim`` or ``booking``; a VRAM share is ``share`` (or ``booking share``)."""
    kind = str(entry.get("kind", "claim"))
    if not entry.get("shared"):
        return kind
    return "share" if kind == "claim" else f"{kind} share"


def _when(entry: dict, now: int, today: date, tz) -> str:
    start = local_time(entry["start_usec"], tz)
    if entry["end_usec"] == 0:
        day = "" if start.date() == today else _day(start.date()) + " "
        return f"{'since' if entry['start_usec'] <= now else 'from'} {day}{_hhmm(start)}, open"
    end = local_time(entry["end_usec"], tz)
    day = "today" if start.date() == today else _day(start.date())
    end_day = "" if end.date() == start.date() else _day(end.date()) + " "
    return f"{day} {_hhmm(start)}-{end_day}{_hhmm(end)}"


def local_time(usec: int, tz) -> datetime:
    seconds, micro = divmod(usec, USEC)
    return datetime.fromtimestamp(seconds, tz).replace(microsecond=micro)


def midnight_of(day: date, tz) -> int:
    """The instant a local day begins, in microseconds since the epoch."""
    return int(datetime.combine(day, time(0), tzinfo=tz).timestamp()) * USEC


def _hhmm(moment: datetime) -> str:
    return f"{moment.hour:02d}:{moment.minute:02d}"


def _day(day: date) -> str:
    return f"{_DAYS[day.weekday()]} {day.day} {_MONTHS[day.month - 1]}"
