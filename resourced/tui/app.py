"""The textual application behind ``gpuctl top`` (needs ``pip install 'resourced[tui]'``).

One screen: a title line (bus, now, the window, the cursor, the booking length), the
timeline (``model.layout``: GPUs against time, now marked, the cursor's cell reversed),
the legend (who holds what), the queue, health and notices, the last action's outcome,
and the keys.

Live: a ``feed.Feed`` thread hears the daemon's signals; each one schedules a re-read
``DEBOUNCE`` seconds later (a burst of signals is one re-read), done in a worker thread
(``Describe`` and everyone's bookings), then drawn.  Nothing polls the daemon; a timer
redraws once a minute, on the minute, for the moving *now* (``booking_calls.now_usec``:
the simulated clock where one is set).

Every bus call runs in a worker thread, one at a time (a lock around one ``Client``), so
the screen never waits on the daemon.
"""

import contextlib
import os
import time
from functools import partial

from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.message import Message
from textual.screen import ModalScreen, Screen
from textual.widgets import Footer, Static

from resourced.client.sync import SharedClient
from resourced.errors import NotEnoughCapacity, ResourcedError
from resourced.protocol.time import (
    DAY,
    HOUR,
    USEC,
    Usec,
    local_now,
    local_text,
    now_usec,
    seconds_of_usec,
    whole_second,
)
from resourced.protocol.when import format_span

from . import model
from .feed import Feed

DEBOUNCE = 0.1
"""Seconds from a signal to the re-read: the signals of one change come together."""
MIN_DELAY = 0.01
TICK = 60.0
"""Seconds between redraws for the moving now (on the minute)."""
CALL_TIMEOUT = 10.0
PALETTE = ("cyan", "magenta", "green", "yellow", "bright_blue", "red", "bright_cyan",
           "bright_magenta", "bright_green", "bright_yellow", "blue", "bright_red")


def _span_text(usec: int) -> str:
    return format_span(seconds_of_usec(usec))


class Timeline(Static):
    """The timeline and its legend; redrawn whenever its width changes."""

    def on_resize(self) -> None:
        if isinstance(self.screen, TopScreen):
            self.screen.redraw()


class TopScreen(Screen):
    """The live view, its keys, and what they do."""

    BINDINGS = [
        Binding("q", "app.quit", "Quit"),
        Binding("left,h", "move(-1)", "Earlier", show=False),
        Binding("right,l", "move(1)", "Later", show=False),
        Binding("up,k", "row(-1)", "GPU up", show=False),
        Binding("down,j", "row(1)", "GPU down", show=False),
        Binding("plus,equals_sign", "zoom(-1)", "Zoom in", key_display="+"),
        Binding("minus", "zoom(1)", "Zoom out", key_display="-"),
        Binding("left_square_bracket", "pan(-1)", "Pan", key_display="[ ]"),
        Binding("right_square_bracket", "pan(1)", "Pan later", show=False),
        Binding("n,home", "home", "Now"),
        Binding("tab", "jump(1)", "Next", show=False),
        Binding("shift+tab", "jump(-1)", "Previous", show=False),
        Binding("b", "book", "Book"),
        Binding("e", "extend", "Extend"),
        Binding("c", "cancel", "Cancel"),
        Binding("enter,i", "details", "Details"),
        Binding("d", "length(1)", "Length"),
        Binding("D", "length(-1)", "Shorter", show=False),
        Binding("r", "reload", "Re-read", show=False),
    ]

    class Changed(Message):
        """A signal of the daemon (posted from the feed's thread)."""

        def __init__(self, member: str):
            super().__init__()
            self.member = member

    class Lost(Message):
        """The feed's bus connection is gone."""

        def __init__(self, reason: str):
            super().__init__()
            self.reason = reason

    def __init__(self, bus: str | None, hours: float, length: int):
        super().__init__()
        self.bus = bus
        now = now_usec()
        self.tz = local_now(now).tzinfo
        self.viewport = model.Viewport(max(model.MINUTE, round(hours * model.HOUR)),
                                       max(model.MINUTE, length), self.tz)
        self.uid = os.getuid()
        self.status: dict | None = None
        self.bookings: list[dict] = []
        self.since = 0                  # the bookings read cover ended ones since then
        self.entries: list[dict] = []
        self.gpus: list[dict] = []
        self.frame: model.Layout | None = None
        self.shown = ""                 # the timeline as last drawn, in plain text
        self.message = ""
        self.reads = 0                  # snapshots applied (for tests)
        self.feed: Feed | None = None
        self.live = False               # the feed's rules are in place
        self._closed = False
        self._read_error = False        # the last read failed: say so until one works
        self._shared = SharedClient(bus=self.bus, timeout=CALL_TIMEOUT, interactive=False)
        self._reload_timer = None
        self._reading = False
        self._dirty = False

    # -- layout ------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield Static(id="title")
        yield Timeline(id="timeline")
        yield Static(id="info")
        yield Static(id="message")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#timeline").focus()
        self.redraw()
        self._reading = True
        self.run_worker(partial(self._start, self._since()), thread=True, group="bus")
        self.set_timer(TICK - time.time() % TICK + 0.05, self._start_ticking)

    def _start_ticking(self) -> None:
        self.redraw()
        self.set_interval(TICK, self.redraw)

    def on_unmount(self) -> None:
        self._closed = True
        if self.feed is not None:
            self.feed.stop()
        self._shared.close()

    # -- the bus, in worker threads ------------------------------------------------------
    def _call(self, fn):
        """``fn(client)`` in this worker thread (``SharedClient``)."""
        return self._shared.call(fn)

    def _start(self, since: int) -> None:
        """Subscribe first, then read: no change falls in between."""
        try:
            bus = self._call(lambda c: (c.ping(), c.bus)[1])
            feed = Feed(bus, lambda member: self.post_message(self.Changed(member)),
                        lambda reason: self.post_message(self.Lost(reason)))
            feed.subscribe()
            feed.start()
            self.feed = feed
            self.live = True
            if self._closed:  # the screen went while this subscribed
                feed.stop()
        except Exception as exc:  # noqa: BLE001 - shown, and r tries again
            self._post(self._say, f"not live: {exc}", True)
        self._read(since)

    def _read(self, since: int) -> None:
        try:
            status, bookings = self._call(lambda c: (c.status(), c.bookings(
                all_users=True, since=Usec(since))))
        except Exception as exc:  # noqa: BLE001 - shown; the next signal or r reads again
            self._post(self._read_failed, str(exc))
        else:
            self._post(self._apply, status, bookings, since)

    def _post(self, fn, *args) -> None:
        with contextlib.suppress(RuntimeError):  # the app is closing
            self.app.call_from_thread(fn, *args)

    # -- reading, on the event loop ----------------------------------------------------
    def _since(self) -> int:
        now = now_usec()
        start, _ = self.viewport.window(now, self._cells())
        return min(start, now - DAY)

    def on_top_screen_changed(self, message: Changed) -> None:
        self.schedule_read()

    def on_top_screen_lost(self, message: Lost) -> None:
        self.live = False
        self._say(f"live updates stopped: {message.reason} (r re-reads)", True)

    def schedule_read(self, delay: float = DEBOUNCE) -> None:
        """Read again ``delay`` seconds from now, once however often asked meanwhile."""
        if self._reload_timer is None:  # (textual's set_timer(0) never fires: at least 10 ms)
            self._reload_timer = self.set_timer(max(delay, MIN_DELAY), self._read_now)

    def _read_now(self) -> None:
        self._reload_timer = None
        if self._reading:
            self._dirty = True  # read again once this read is in
            return
        self._reading = True
        self.run_worker(partial(self._read, self._since()), thread=True, group="bus")

    def _apply(self, status: dict, bookings: list[dict], since: int) -> None:
        self._reading = False
        self.status, self.bookings, self.since = status, bookings, since
        self.gpus = model.gpus_of(status)
        self.entries = model.entries_of(status, bookings)
        self.viewport.select_row(0, len(self.gpus))
        self.reads += 1
        if self._read_error:
            self._read_error = False
            self._say("read again: the daemon answers")
        self.redraw()
        if self._dirty:
            self._dirty = False
            self.schedule_read(0)

    def _read_failed(self, error: str) -> None:
        self._reading = False
        self._read_error = True
        self._say(f"cannot read: {error}", True)
        if self._dirty:
            self._dirty = False
            self.schedule_read(0)

    # -- drawing -----------------------------------------------------------------------
    def _width(self) -> int:
        widget = self.query_one("#timeline")
        return widget.size.width or self.app.size.width or 80

    def _cells(self) -> int:
        return model.cell_count(self.gpus, self._width())

    def redraw(self) -> None:
        timeline = self.query_one("#timeline", Static)
        now = now_usec()
        width = self._width()
        self.query_one("#title", Static).update(self._title(now))
        self.query_one("#info", Static).update(self._info())
        if self.status is None:
            timeline.update("reading from the daemon...")
            return
        if width < model.MIN_WIDTH:
            timeline.update(f"the terminal is too narrow: the timeline needs {model.MIN_WIDTH} "
                            "columns")
            return
        vp = self.viewport
        cells = model.cell_count(self.gpus, width)
        start, _ = vp.window(now, cells)
        frame = model.layout(self.gpus, self.entries, start, vp.span, now, self.tz, width)
        self.frame = frame
        timeline.update(self._styled(frame, vp.row, frame.column_of(vp.cursor_at(now, cells))))
        self.shown = frame.text()

    def _styled(self, frame: model.Layout, cursor_row: int, cursor_col: int) -> Text:
        styles = []
        for e in frame.visible:
            colour = PALETTE[len(styles) % len(PALETTE)]
            styles.append(f"bold {colour}" if e["uid"] == self.uid else colour)
        out = Text(no_wrap=True, overflow="crop")
        for line in frame.header[:-1]:
            out.append(line + "\n", style="dim")
        axis = frame.header[-1]
        mark = axis.find(model.NOW_MARK, frame.label_w + 1)
        if mark < 0:
            out.append(axis + "\n", style="dim")
        else:
            out.append(axis[:mark], style="dim")
            out.append(model.NOW_MARK, style="bold yellow")
            out.append(axis[mark + 1:] + "\n", style="dim")
        for r, label in enumerate(frame.labels):
            out.append(label.ljust(frame.label_w),
                       style="bold reverse" if r == cursor_row else "bold")
            out.append(" ")
            run, run_style = "", None
            for c in range(frame.cells):
                here = frame.holders[r][c]
                style = styles[here[0]] if here else "dim"
                if c == frame.now_column:
                    style += " on grey23"
                if r == cursor_row and c == cursor_col:
                    style += " reverse"
                if style != run_style and run:
                    out.append(run, style=run_style)
                    run = ""
                run, run_style = run + frame.char(r, c), style
            out.append(run + "\n", style=run_style)
        out.append("\n")
        for line in frame.legend:
            letter = line[:1]
            i = frame.letters.index(letter) if letter in frame.letters else -1
            out.append(line[:1], style=styles[i] if i >= 0 else "")
            out.append(line[1:] + "\n")
        out.rstrip()
        return out

    def _title(self, now: int) -> Text:
        vp = self.viewport
        cells = self._cells()
        start, _ = vp.window(now, cells)
        cursor = vp.cursor_at(now, cells)
        gpu = self.gpus[vp.row]["label"] if self.gpus else "-"
        where = "following now" if vp.follow else "panned (n: back to now)"
        bus = self._shared.bus_in_use or self.bus or "?"
        text = Text(no_wrap=True, overflow="ellipsis")
        text.append("gpuctl top", style="bold")
        text.append(f"  {bus} bus{'' if self.live else ' (not live)'}  now {local_text(now, now)}"
                    f"  window {_span_text(vp.span)} from {local_text(start, now)}, {where}"
                    f"  cursor {gpu} {local_text(cursor, now)}"
                    f"  b/e: {_span_text(vp.length)}")
        return text

    def _info(self) -> Text:
        out = Text()
        if self.status is None:
            return out
        claims = {c["id"]: c for c in self.status.get("claims", [])}
        queue = self.status.get("queue", [])
        out.append("queue   ", style="bold")
        if not queue:
            out.append("empty")
        else:
            out.append(f"{len(queue)} waiting: ")
            out.append("; ".join(_queued(claims.get(ref), ref) for ref in queue[:8]))
            if len(queue) > 8:
                out.append(f"; and {len(queue) - 8} more")
        health = self.status.get("health", {})
        level = health.get("level", "?")
        out.append("\nhealth  ", style="bold")
        out.append(level, style={"OK": "green", "WARN": "yellow"}.get(level, "bold red"))
        bad = [c for c in health.get("checks", []) if c.get("level") not in ("OK", None)]
        for check in bad:
            name = f"disk {check['path']}" if check.get("type") == "disk" and check.get("path") \
                else check.get("name", "?")
            out.append(f"  {name} {check.get('level')}: {check.get('reason', '')}")
        notices = self.status.get("notices", [])
        out.append("\nnotices ", style="bold")
        if not notices:
            out.append("none")
        for n in notices:
            until = f" (until {local_text(n['until_usec'])})" if n.get("until_usec") else ""
            out.append(f"\n  {n.get('text', '')}{until}", style="bold")
        if not self.gpus:
            out.append("\nno GPUs: the daemon has none to show")
        return out

    def _say(self, text: str, error: bool = False) -> None:
        self.message = text
        self.query_one("#message", Static).update(
            Text(text, style="bold red" if error else "bold green"))
        if error:
            self.app.bell()

    # -- the cursor and the window --------------------------------------------------------
    def _now_cells(self) -> tuple[int, int]:
        return now_usec(), self._cells()

    def action_move(self, steps: int) -> None:
        self.viewport.move(steps, *self._now_cells())
        self.redraw()

    def action_row(self, delta: int) -> None:
        self.viewport.select_row(delta, len(self.gpus))
        self.redraw()

    def action_zoom(self, direction: int) -> None:
        now, cells = self._now_cells()
        if not self.viewport.zoom(direction, now, cells):
            self._say("no further zoom level", True)
        self._after_window_change(now, cells)

    def action_pan(self, direction: int) -> None:
        now, cells = self._now_cells()
        self.viewport.pan(direction, now, cells)
        self._after_window_change(now, cells)

    def action_home(self) -> None:
        self.viewport.home()
        self._after_window_change(*self._now_cells())

    def _after_window_change(self, now: int, cells: int) -> None:
        self.redraw()
        start, _ = self.viewport.window(now, cells)
        if self.status is not None and start < self.since:
            self.schedule_read(0)  # ended bookings further back than those read

    def action_jump(self, direction: int) -> None:
        now, cells = self._now_cells()
        found = model.next_entry(self.entries, self.gpus, self.viewport.cursor_at(now, cells),
                                 now, direction)
        if found is None:
            self._say("no claims or bookings to go to")
            return
        entry, row = found
        self.viewport.row = row
        self.viewport.place(max(entry["start_usec"], now), now, cells)
        self.redraw()

    def action_length(self, direction: int) -> None:
        length = self.viewport.cycle_length(direction)
        self._say(f"b books and e extends by {_span_text(length)}")
        self.redraw()

    def action_reload(self) -> None:
        if self.feed is None or not self.feed.is_alive():
            self.live = False
            self._reading = True
            self.run_worker(partial(self._start, self._since()), thread=True, group="bus")
        else:
            self.schedule_read(0)

    # -- acting on the calendar ------------------------------------------------------------
    def under_cursor(self, kind: str | None = None) -> dict | None:
        """The claim or booking under the cursor's cell (a booking, one's own, first)."""
        if self.frame is None or not self.gpus:
            return None
        now, cells = self._now_cells()
        column = self.frame.column_of(self.viewport.cursor_at(now, cells))
        return model.pick(self.frame.entries_at(self.viewport.row, column), self.uid, kind)

    def cursor_place(self) -> tuple[dict, int] | None:
        """The highlighted GPU and instant."""
        if not self.gpus:
            return None
        now, cells = self._now_cells()
        return self.gpus[self.viewport.row], self.viewport.cursor_at(now, cells)

    def action_book(self) -> None:
        place = self.cursor_place()
        if place is None or self.status is None:
            self._say("nothing to book: no GPUs shown", True)
            return
        gpu, at = place
        now = now_usec()
        start = None if at <= now else Usec(whole_second(at))  # whole seconds, as typed times are
        self._act(partial(self._book, gpu, start, self.viewport.length))

    def _book(self, gpu: dict, start: int | None, length: int) -> str:
        whole = Usec(length - length % USEC)  # whole seconds
        what = f"{gpu['label']} for {_span_text(length)}"
        try:
            made = self._call(lambda c: c.book(whole, start=start, gpu_names=[gpu["uuid"]]))
        except NotEnoughCapacity as exc:
            if start is None:
                raise
            made = self._call(lambda c: c.book(whole, start=None, gpu_names=[gpu["uuid"]]))
            b = made["booking"]
            return (f"{what} does not fit at {local_text(start)} ({exc}); booked "
                    f"the earliest fit instead: {b['id']} {_window(b)}")
        b = made["booking"]
        return f"booked {b['id']}: {what}, {_window(b)}"

    def action_extend(self) -> None:
        entry = self.under_cursor("booking")
        if entry is None:
            self._say("no booking under the cursor (tab goes to the next)", True)
            return
        ref, by = entry["id"], Usec(self.viewport.length - self.viewport.length % USEC)

        def extend() -> str:
            b = self._call(lambda c: c.extend(ref, by=by))
            return f"extended {ref} by {_span_text(by)}: {_window(b)}"

        self._act(extend)

    def action_cancel(self) -> None:
        entry = self.under_cursor("booking")
        if entry is None:
            self._say("no booking under the cursor (tab goes to the next)", True)
            return
        ref = entry["id"]

        def cancel() -> str:
            self._call(lambda c: c.cancel(ref))
            return f"cancelled {ref}"

        def confirmed(yes: bool | None) -> None:
            if yes:
                self._act(cancel)
            else:
                self._say(f"{ref} kept")

        self.app.push_screen(Confirm(f"Cancel booking {ref} ({entry['user']}, "
                                     f"{_window(entry['record'])})?"), confirmed)

    def action_details(self) -> None:
        entry = self.under_cursor()
        if entry is None:
            self._say("nothing under the cursor (tab goes to the next claim or booking)")
            return
        labels = {g["uuid"]: g["label"] for g in self.gpus}
        self.app.push_screen(Details(details(entry, labels)))

    def _act(self, fn) -> None:
        """``fn()`` (returning what to say) in a worker thread; then read again."""
        def work() -> None:
            try:
                said, error = fn(), False
            except ResourcedError as exc:
                said, error = f"{exc.code}: {exc.message}", True
            except Exception as exc:  # noqa: BLE001 - shown, never a crash of the screen
                said, error = f"failed: {exc}", True
            self._post(self._acted, said, error)

        self._say("...")
        self.run_worker(work, thread=True, group="bus")

    def _acted(self, said: str, error: bool) -> None:
        self._say(said, error)
        self.schedule_read(0)  # the signal comes too; this makes it sooner


def _queued(claim: dict | None, ref: str) -> str:
    if claim is None:
        return ref
    from resourced.protocol.amounts import format_bytes

    wants = [f"{claim['gpus_requested']} GPU(s)"] if claim.get("gpus_requested") else []
    if claim.get("vram_bytes"):
        wants.append(f"VRAM {format_bytes(claim['vram_bytes'])}")
    wants += [f"{name} {amount}" for name, amount in claim.get("pools", {}).items()]
    return f"{ref} {claim['user']} {', '.join(wants) or '-'} (priority {claim['priority']})"


def _window(record: dict) -> str:
    if "start_usec" in record:
        start, end = record["start_usec"], record["end_usec"]
    else:
        start, end = record["created_usec"], record["until_usec"]
    if not end:
        return f"from {local_text(start)}, open"
    return f"{local_text(start)} to {local_text(end)} ({_span_text(end - start)})"


def details(entry: dict, labels: dict[str, str]) -> list[tuple[str, str]]:
    """A claim's or booking's record as (field, value) lines."""
    r = entry["record"]
    gpus = ", ".join(labels.get(u, u) for u in r.get("gpu_uuids", [])) or "-"
    rows = [("reference", entry["id"]), ("kind", entry["kind"]),
            ("user", f"{r['user']} (uid {r.get('uid', '?')})")]
    if entry["kind"] == "booking":
        state = r["state"]
        if r.get("claim_state"):
            state += f", its claim {r['claim_state']}"
        if r.get("waiting_for"):
            state += f", waiting for {', '.join(r['waiting_for'])}"
        rows += [("state", state), ("GPUs", gpus), ("when", _window(r)),
                 ("booked", local_text(r["created_usec"]))]
    else:
        rows += [("state", f"{r['state']} ({r['mode']})"), ("GPUs", gpus), ("when", _window(r)),
                 ("owner pid", f"{r.get('owner_pid')} ({'alive' if r.get('owner_alive') else 'DEAD'})"),
                 ("priority", str(r.get("priority", 0)))]
        if r.get("until_booking"):
            rows.append(("until booking", r["until_booking"]))
    if r.get("vram_bytes"):
        from resourced.protocol.amounts import format_bytes

        rows.append(("VRAM", format_bytes(r["vram_bytes"])))
    if r.get("pools"):
        rows.append(("pools", ", ".join(f"{k} {v}" for k, v in r["pools"].items())))
    for key, name in (("label", "label"), ("task_name", "task"), ("session", "session"),
                      ("op_id", "op id"), ("reason", "reason")):
        if r.get(key):
            rows.append((name, str(r[key])))
    return rows


class Details(ModalScreen):
    """A claim's or booking's details; any of escape, enter, i or q closes it."""

    BINDINGS = [Binding("escape,enter,i,q", "app.pop_screen", "Close")]
    DEFAULT_CSS = """
    Details { align: center middle; }
    Details > Static { width: auto; max-width: 90%; border: round $accent; padding: 0 1;
                       background: $surface; }
    """

    def __init__(self, rows: list[tuple[str, str]]):
        super().__init__()
        self.rows = rows

    def compose(self) -> ComposeResult:
        width = max(len(k) for k, _ in self.rows)
        text = Text()
        for i, (key, value) in enumerate(self.rows):
            text.append(f"{key:<{width}}  ", style="bold")
            text.append(value + ("\n" if i < len(self.rows) - 1 else ""))
        yield Static(text, id="details")


class Confirm(ModalScreen[bool]):
    """A yes/no question: y answers yes; n or escape, no."""

    BINDINGS = [Binding("y", "answer(True)", "Yes"),
                Binding("n,escape", "answer(False)", "No")]
    DEFAULT_CSS = """
    Confirm { align: center middle; }
    Confirm > Static { width: auto; border: round $warning; padding: 0 1; background: $surface; }
    """

    def __init__(self, question: str):
        super().__init__()
        self.question = question

    def compose(self) -> ComposeResult:
        yield Static(Text.assemble((self.question, "bold"), "  y / n"), id="question")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)


class TopApp(App):
    """``gpuctl top``."""

    TITLE = "gpuctl top"
    ENABLE_COMMAND_PALETTE = False
    BINDINGS = [Binding("ctrl+c", "quit", "Quit", show=False, priority=True)]
    CSS = """
    #title { height: 1; background: $boost; }
    #timeline { height: auto; padding: 1 0 0 0; }
    #info { height: auto; margin: 1 0 0 0; }
    #message { height: auto; margin: 1 0 0 0; }
    """

    def __init__(self, bus: str | None = None, hours: float = 12.0, length: int = HOUR):
        super().__init__()
        self.top = TopScreen(bus, hours, length)

    def get_default_screen(self) -> Screen:
        return self.top
