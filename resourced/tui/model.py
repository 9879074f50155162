"""What ``gpuctl top`` shows, as plain data: the window on the time axis, the cursor, and
the layout of GPUs against time.  No terminal, no bus, no clock (callers pass ``now``).

The layout is ``gpuctl timeline``'s (``cli.timeline_view``): the same label column, the
same cells (cell ``c`` covers ``[b(c), b(c + 1))`` with ``b(c) = start + c * span /
cells``), the same letters, time labels and legend.  The one difference: the left edge is
the window's start, which panning moves off *now*, so *now* is marked (``|``) at its own
column, wherever that is, or not at all when it lies outside the window.

The cursor is a GPU (a row) and an instant.  Moving it steps by a round duration about
one cell wide (``STEPS``), aligned on local midnight, so that a booking made at the cursor
starts on a round time.  While the window *follows now* (until panned, and again after
``home``), it starts an eighth of its span before now, on a step.

Standard library only.
"""

from dataclasses import dataclass
from datetime import tzinfo

from resourced.protocol.time import HOUR, MINUTE

from .timeline import (
    FREE,
    LETTERS,
    MANY,
    MIN_CELLS,
    MIN_LABEL,
    MIN_WIDTH,
    NOW_MARK,
    OVERFLOW,
    TICK_MARK,
    Grid,
    axis_lines,
    legend_lines,
    local_time,
    midnight_of,
)

SPANS = tuple(h * HOUR for h in (1, 2, 3, 6, 12, 24, 48, 72, 168, 336, 720))
"""The zoom levels: the window's span, 1 hour to 30 days."""
STEPS = tuple(m * MINUTE for m in (1, 2, 5, 10, 15, 20, 30, 60, 120, 180, 240, 360, 720, 1440))
"""The cursor's steps: the first at least one cell wide is used."""
LENGTHS = tuple(m * MINUTE for m in (15, 30, 60, 120, 240, 480, 720, 1440))
"""What the book key books and the extend key extends by, in turn (``d`` cycles)."""
LEAD = 8
"""Following now, the window starts ``span / LEAD`` before now."""
PAN = 4
"""Panning moves the window by ``span / PAN``."""


def label_width(gpus: list[dict], width: int) -> int:
    """The label column's width, as ``render_timeline`` has it."""
    longest = max((len(g["label"]) for g in gpus), default=0)
    return min(max(MIN_LABEL, longest), width - 1 - MIN_CELLS)


def cell_count(gpus: list[dict], width: int) -> int:
    """How many cells a line of ``width`` characters holds (at least 1)."""
    return max(1, width - label_width(gpus, max(width, MIN_WIDTH)) - 1)


def snap(t: int, step: int, tz: tzinfo | None) -> int:
    """``t`` down to a multiple of ``step`` counted from its local day's midnight."""
    midnight = midnight_of(local_time(t, tz).date(), tz)
    return midnight + (t - midnight) // step * step


def snap_up(t: int, step: int, tz: tzinfo | None) -> int:
    down = snap(t, step, tz)
    return down if down == t else snap(down + step, step, tz)


class Viewport:
    """The window on the time axis, and the cursor: one GPU row and one instant."""

    def __init__(self, span: int, length: int, tz: tzinfo | None):
        self.span = span
        self.length = length
        self.tz = tz
        self.follow = True      # the window moves with now
        self._start = 0         # the window's left edge when not following
        self.row = 0
        self.cursor: int | None = None  # None: at now

    # -- reading ---------------------------------------------------------------------
    def step(self, cells: int) -> int:
        return next((s for s in STEPS if s * cells >= self.span), STEPS[-1])

    def start(self, now: int, cells: int) -> int:
        if self.follow:
            return snap(now - self.span // LEAD, self.step(cells), self.tz)
        return self._start

    def window(self, now: int, cells: int) -> tuple[int, int]:
        """The window's start and end (half-open)."""
        start = self.start(now, cells)
        return start, start + self.span

    def cursor_at(self, now: int, cells: int) -> int:
        """The cursor's instant, kept inside the window (now moves; the cursor may not)."""
        start, end = self.window(now, cells)
        t = now if self.cursor is None else self.cursor
        if t < start:
            return start
        if t >= end:
            return snap(end - 1, self.step(cells), self.tz)
        return t

    # -- moving ----------------------------------------------------------------------
    def move(self, steps: int, now: int, cells: int) -> None:
        """The cursor ``steps`` steps later (earlier when negative), on a step; the window
        goes along when the cursor leaves it."""
        step, t = self.step(cells), self.cursor_at(now, cells)
        if steps > 0:
            t = snap(t, step, self.tz) + steps * step
        elif steps < 0:
            t = snap_up(t, step, self.tz) + steps * step
        self.place(t, now, cells)

    def place(self, t: int, now: int, cells: int) -> None:
        """The cursor at ``t``; the window moves (by whole steps) only if ``t`` is outside."""
        start, end = self.window(now, cells)
        self.cursor = t
        if t < start or t >= end:
            step = self.step(cells)
            shift = t - start if t < start else t - end + step
            self._start = start + (shift // step if shift >= 0 else -(-shift // step)) * step
            if self._start > t or t >= self._start + self.span:  # a far jump: put it near the left
                self._start = snap(t - self.span // LEAD, step, self.tz)
            self.follow = False

    def select_row(self, delta: int, rows: int) -> None:
        self.row = min(max(0, self.row + delta), max(0, rows - 1))

    def zoom(self, direction: int, now: int, cells: int) -> bool:
        """In (``direction`` < 0: a shorter span) or out, keeping the cursor where it is on
        screen; False when there is no further level."""
        if direction < 0:
            shorter = [s for s in SPANS if s < self.span]
            if not shorter:
                return False
            span = shorter[-1]
        else:
            longer = [s for s in SPANS if s > self.span]
            if not longer:
                return False
            span = longer[0]
        start, t = self.start(now, cells), self.cursor_at(now, cells)
        if not self.follow:
            self._start = t - (t - start) * span // self.span
        self.span = span
        if self.cursor is not None:
            self.cursor = self.cursor_at(now, cells)
        return True

    def pan(self, direction: int, now: int, cells: int) -> None:
        """The window (and the cursor with it) a quarter span later or earlier."""
        delta = direction * (self.span // PAN)
        t = self.cursor_at(now, cells)
        self._start = self.start(now, cells) + delta
        self.follow = False
        self.cursor = t + delta

    def home(self) -> None:
        """Back to now: the window follows now again, the cursor at now."""
        self.follow = True
        self.cursor = None

    def cycle_length(self, direction: int = 1) -> int:
        """The next longer (``direction`` > 0) or shorter of ``LENGTHS``, round the ends."""
        if direction > 0:
            self.length = next((n for n in LENGTHS if n > self.length), LENGTHS[0])
        else:
            self.length = next((n for n in reversed(LENGTHS) if n < self.length), LENGTHS[-1])
        return self.length


# -- what is shown -----------------------------------------------------------------------
def gpus_of(status: dict) -> list[dict]:
    """The rows: ``{"index", "uuid", "label"}`` in the daemon's order."""
    return [{"index": g["index"], "uuid": g["uuid"], "label": g.get("alias") or f"gpu{g['index']}"}
            for g in status.get("gpus", [])]


def entries_of(status: dict, bookings: list[dict]) -> list[dict]:
    """What holds GPUs over time, as ``gpuctl timeline`` draws it: granted claims (not a
    booking's own claim: the booking stands for it) and bookings not ended; each keeps its
    record (``record``) and its user's uid."""
    entries = [{"id": c["id"], "user": c["user"], "uid": c.get("uid", -1),
                "gpus": c["gpu_uuids"], "start_usec": c["created_usec"],
                "end_usec": c["until_usec"], "kind": "claim", "shared": bool(c["vram_bytes"]),
                "record": c}
               for c in status.get("claims", [])
               if c["state"] == "granted" and c["mode"] != "booking"]
    entries += [{"id": b["id"], "user": b["user"], "uid": b.get("uid", -1),
                 "gpus": b["gpu_uuids"], "start_usec": b["start_usec"],
                 "end_usec": b["end_usec"], "kind": "booking", "shared": b["shared"],
                 "record": b}
                for b in bookings if b["state"] != "ended"]
    return entries


@dataclass
class Layout:
    """One frame: the header lines, a row of cells per GPU, the legend."""

    label_w: int
    cells: int
    start: int
    span: int
    now_column: int | None      # None: now is outside the window
    header: list[str]           # (dates,) times, axis: each with the label column in front
    labels: list[str]           # each GPU's label, cut to label_w
    holders: list[list[tuple[int, ...]]]   # per GPU, per cell: the visible entries there
    visible: list[dict]         # by start, then ref; ``letters`` name them
    letters: list[str]
    legend: list[str]

    def char(self, row: int, column: int) -> str:
        here = self.holders[row][column]
        return FREE if not here else self.letters[here[0]] if len(here) == 1 else MANY

    def row_text(self, row: int) -> str:
        return self.labels[row].ljust(self.label_w) + " " + "".join(
            self.char(row, c) for c in range(self.cells))

    def text(self) -> str:
        """The frame as plain text (what a test reads)."""
        return "\n".join([*self.header, *(self.row_text(r) for r in range(len(self.labels))),
                          "", *self.legend])

    def column_of(self, t: int) -> int:
        return Grid(self.start, self.span, self.cells).column_of(t)

    def entries_at(self, row: int, column: int) -> list[dict]:
        if not (0 <= row < len(self.holders) and 0 <= column < self.cells):
            return []
        return [self.visible[i] for i in self.holders[row][column]]


def layout(gpus: list[dict], entries: list[dict], start: int, span: int, now: int,
           tz: tzinfo | None, width: int) -> Layout:
    """The frame for the window ``[start, start + span)`` in ``width`` characters;
    ValueError below ``MIN_WIDTH``."""
    if width < MIN_WIDTH:
        raise ValueError(f"the timeline needs a width of at least {MIN_WIDTH}, not {width}")
    label_w = label_width(gpus, width)
    cells = width - label_w - 1
    grid = Grid(start, span, cells)
    shown = {g["uuid"] for g in gpus}
    visible = [e for e in entries if shown & set(e["gpus"]) and grid.columns(e) is not None]
    visible.sort(key=lambda e: (e["start_usec"], str(e["id"])))
    letters = [LETTERS[i] if i < len(LETTERS) else OVERFLOW for i in range(len(visible))]
    spans = [grid.columns(e) for e in visible]
    holders = []
    for g in gpus:
        row: list[list[int]] = [[] for _ in range(cells)]
        for i, e in enumerate(visible):
            if g["uuid"] in e["gpus"]:
                first, last = spans[i]
                for c in range(first, last + 1):
                    row[c].append(i)
        holders.append([tuple(h) for h in row])

    dates, times, axis = axis_lines(grid, tz)
    now_column = grid.column_of(now) if start <= now < start + span else None
    marks = list(axis.ljust(cells))
    if marks[0] == NOW_MARK and now_column != 0:  # the left edge is now only when it is
        marks[0] = TICK_MARK
    if now_column is not None:
        marks[now_column] = NOW_MARK
    pad = " " * (label_w + 1)
    header = [pad + dates] if dates else []
    header += [pad + times, "now".ljust(label_w) + " " + "".join(marks).rstrip()]
    return Layout(label_w=label_w, cells=cells, start=start, span=span, now_column=now_column,
                  header=header, labels=[g["label"][:label_w] for g in gpus], holders=holders,
                  visible=visible, letters=letters,
                  legend=legend_lines(visible, letters, now, tz, width))


def pick(candidates: list[dict], uid: int, kind: str | None = None) -> dict | None:
    """The entry meant among those under the cursor: a booking before a claim, one's own
    before another's."""
    found = [e for e in candidates if kind is None or e["kind"] == kind]
    found.sort(key=lambda e: (e["kind"] != "booking", e["uid"] != uid))
    return found[0] if found else None


def next_entry(entries: list[dict], gpus: list[dict], after: int, now: int,
               direction: int = 1) -> tuple[dict, int] | None:
    """The entry on a shown GPU whose place (its start, or now while it runs) comes next
    after ``after`` (before it, for ``direction`` < 0), wrapping around; with the row of
    its first shown GPU."""
    rows = {g["uuid"]: i for i, g in enumerate(gpus)}
    placed = sorted(((max(e["start_usec"], now), str(e["id"])), e) for e in entries
                    if any(u in rows for u in e["gpus"]))
    if not placed:
        return None
    if direction > 0:
        entry = next((e for (t, _), e in placed if t > after), placed[0][1])
    else:
        entry = next((e for (t, _), e in reversed(placed) if t < after), placed[-1][1])
    return entry, min(rows[u] for u in entry["gpus"] if u in rows)
