"""gpuctl top: the live timeline, driven by keys, against a real daemon on the private bus.

Two ways in:

* textual's own harness (``App.run_test()`` and its pilot), in this process, on the
  simulated clock (09:00 UTC on 1 December 2026): changes made through the Client show
  within a second (the daemon's signals, not polling), and the keys book, extend, cancel,
  zoom and pan;
* once end to end, ``gpuctl top`` as a real program in a detached tmux session, read with
  ``capture-pane`` and typed at with ``send-keys``, while another "terminal" books with
  ``gpuctl book``.

Every wait is bounded; the pilot tests run their coroutine with ``asyncio.run``.
"""

import asyncio
import importlib.util
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

from resourced.client.sync import Client

from ..conftest import eventually, gpuctl
from .conftest import at

LIVE = 1.0        # a change made elsewhere is on screen within this many seconds
STARTUP = 20.0    # the first read (textual's start and the feed's subscription included)
ACTION = 5.0      # a key's booking, extension or cancellation reaches the daemon


def client() -> Client:
    return Client(timeout=5)


def bookings() -> list[dict]:
    with client() as c:
        return c.bookings(all_users=True)


def booking(ref: str) -> dict:
    with client() as c:
        return c.booking(ref)


def book(**kw) -> dict:
    with client() as c:
        reply = c.book(**kw)
    assert reply["status"] == "created"
    return reply["booking"]


# -- textual's pilot ---------------------------------------------------------------------
needs_textual = pytest.mark.skipif(importlib.util.find_spec("textual") is None,
                                   reason="textual is not installed: pip install "
                                   "'resourced[tui]' (or ./dev test)")


async def until(pilot, predicate, timeout: float, what: str):
    """Let the app run until ``predicate()`` is truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout}s")
        await pilot.pause(0.02)


def run_app(scenario, size=(140, 40), hours=12.0, length=3_600_000_000):
    """Run ``scenario(app, top, pilot)`` in ``TopApp`` under the pilot, once it has read."""
    from resourced.tui.app import TopApp

    async def main():
        app = TopApp(hours=hours, length=length)
        async with app.run_test(size=size) as pilot:
            top = app.top
            await until(pilot, lambda: top.reads >= 1 and top.live, STARTUP, "the first read")
            await scenario(app, top, pilot)
    asyncio.run(main())


@needs_textual
def test_a_booking_made_elsewhere_shows_within_a_second(clocked_daemon):
    clocked_daemon()

    async def scenario(app, top, pilot):
        reads = top.reads
        await pilot.pause(1.0)
        assert top.reads == reads, "it read again with nothing changed: it polls"
        made = await asyncio.to_thread(book, duration="1h", gpus=1,
                                       start=at("2026-12-01T11:00:00Z") // 1_000_000)
        await until(pilot, lambda: made["id"] in top.shown, LIVE, "the booking on screen")
        # in the legend, with its letter on its GPU's row
        legend = next(line for line in top.shown.splitlines() if made["id"] in line)
        row = next(line for line in top.shown.splitlines()
                   if line.startswith(f"gpu{made['gpu_indices'][0]} "))
        assert legend[0] in row and "booking" in legend and "11:00-12:00" in legend

    run_app(scenario)


@needs_textual
def test_the_book_key_books_the_highlighted_gpu_at_the_cursor(clocked_daemon):
    clocked_daemon()

    async def scenario(app, top, pilot):
        await pilot.press("down", *["right"] * 6)
        gpu, start = top.cursor_place()
        assert gpu["index"] == 1
        assert start > at("2026-12-01T09:00:00Z") and start % 60_000_000 == 0
        await pilot.press("b")
        made = await until(pilot, lambda: bookings(), ACTION, "the booking")
        assert len(made) == 1
        assert made[0]["gpu_indices"] == [1]
        assert made[0]["start_usec"] == start and made[0]["end_usec"] == start + 3600 * 10**6
        await until(pilot, lambda: made[0]["id"] in top.shown, LIVE, "the booking on screen")
        assert top.message.startswith(f"booked {made[0]['id']}")

    run_app(scenario)


@needs_textual
def test_where_the_cursor_does_not_fit_it_books_the_earliest_fit_and_says_so(clocked_daemon):
    clocked_daemon()
    taken = book(duration="2h", gpu_names=["1"], start=at("2026-12-01T10:00:00Z") // 10**6)

    async def scenario(app, top, pilot):
        await until(pilot, lambda: taken["id"] in top.shown, LIVE, "the other booking")
        await pilot.press("down", "tab")        # onto the other booking, at 10:00 on gpu1
        assert top.cursor_place() == (top.gpus[1], at("2026-12-01T10:00:00Z"))
        await pilot.press("b")
        await until(pilot, lambda: len(bookings()) == 2, ACTION, "the second booking")
        mine = next(b for b in bookings() if b["id"] != taken["id"])
        # the earliest fit on that GPU: now, an hour before the other booking
        assert mine["gpu_indices"] == [1]
        assert mine["start_usec"] == at("2026-12-01T09:00:00Z")
        assert mine["end_usec"] == at("2026-12-01T10:00:00Z")
        await until(pilot, lambda: "earliest fit" in top.message, LIVE, "the message")
        assert "does not fit" in top.message and mine["id"] in top.message

    run_app(scenario)


@needs_textual
def test_extend_cancel_and_details_keys(clocked_daemon):
    clocked_daemon()
    from resourced.tui.app import Confirm, Details, TopScreen

    async def scenario(app, top, pilot):
        made = await asyncio.to_thread(book, duration="1h", gpu_names=["2"],
                                       start=at("2026-12-01T10:00:00Z") // 10**6)
        ref = made["id"]
        await until(pilot, lambda: ref in top.shown, LIVE, "the booking on screen")
        await pilot.press("tab")
        assert top.cursor_place() == (top.gpus[2], at("2026-12-01T10:00:00Z"))

        await pilot.press("enter")                   # details
        assert isinstance(app.screen, Details)
        assert ("reference", ref) in app.screen.rows
        await pilot.press("escape")
        assert isinstance(app.screen, TopScreen)

        await pilot.press("e")                       # extend by the length, 1h
        await until(pilot, lambda: booking(ref)["end_usec"] == at("2026-12-01T12:00:00Z"),
                    ACTION, "the extension")
        await until(pilot, lambda: "10:00-12:00" in top.shown, LIVE, "the longer booking")
        assert top.message.startswith(f"extended {ref}")

        await pilot.press("c", "n")                  # asked, and kept
        assert isinstance(app.screen, TopScreen)
        assert booking(ref)["state"] == "scheduled"
        await pilot.press("c")
        assert isinstance(app.screen, Confirm)
        await pilot.press("y")
        await until(pilot, lambda: booking(ref)["state"] == "ended", ACTION, "the cancellation")
        await until(pilot, lambda: ref not in top.shown, LIVE, "the booking gone from screen")
        assert top.message == f"cancelled {ref}"

        await pilot.press("e")                       # nothing under the cursor now
        assert "no booking under the cursor" in top.message

    run_app(scenario)


@needs_textual
def test_zoom_and_pan_change_the_visible_window(clocked_daemon):
    clocked_daemon()
    hour = 3600 * 10**6

    def times_line(top) -> str:
        return top.frame.header[-2]

    async def scenario(app, top, pilot):
        first = (top.frame.start, top.frame.span)
        assert first[1] == 12 * hour and top.frame.now_column is not None
        labels = times_line(top)
        await pilot.press("plus")
        assert top.frame.span == 6 * hour and times_line(top) != labels
        await pilot.press("minus", "minus")
        assert top.frame.span == 24 * hour
        start = top.frame.start
        await pilot.press("right_square_bracket")
        assert top.frame.start == start + 6 * hour and not top.viewport.follow
        await pilot.press("right_square_bracket", "right_square_bracket",
                          "right_square_bracket")
        assert top.frame.start == start + 24 * hour
        assert top.frame.now_column is None             # now is left of the window
        await pilot.press("left_square_bracket")
        assert top.frame.start == start + 18 * hour
        await pilot.press("n")
        assert top.viewport.follow and top.frame.start == start and top.frame.now_column

        assert top.viewport.length == hour
        await pilot.press("d")
        assert top.viewport.length == 2 * hour and "2h" in top.message
        await pilot.press("D", "D")
        assert top.viewport.length == hour // 2

    run_app(scenario)


# -- the layout: gpuctl timeline's, with the left edge free ----------------------------------
GPUS = [{"index": i, "uuid": f"GPU-{i}", "label": f"gpu{i}"} for i in range(3)]
ENTRIES = [
    {"id": "c1", "user": "alice", "uid": 1, "gpus": ["GPU-0"], "kind": "claim",
     "start_usec": at("2026-12-01T08:00:00Z"), "end_usec": 0, "shared": False},
    {"id": "b1", "user": "bob", "uid": 2, "gpus": ["GPU-1", "GPU-2"], "kind": "booking",
     "start_usec": at("2026-12-01T11:00:00Z"), "end_usec": at("2026-12-01T13:00:00Z"),
     "shared": False},
]


def test_at_now_the_layout_is_gpuctl_timelines():
    from datetime import UTC

    from resourced.tui.model import HOUR, layout
    from resourced.tui.timeline import render_timeline

    now = at("2026-12-01T09:00:00Z")
    frame = layout(GPUS, ENTRIES, now, 12 * HOUR, now, UTC, 100)
    assert frame.text() == render_timeline(GPUS, ENTRIES, now, 12, UTC, 100)
    assert frame.now_column == 0


def test_panned_now_is_marked_at_its_own_column_or_not_at_all():
    from datetime import UTC

    from resourced.tui.model import HOUR, layout

    now = at("2026-12-01T09:00:00Z")
    frame = layout(GPUS, ENTRIES, now - 3 * HOUR, 12 * HOUR, now, UTC, 100)
    axis = frame.header[-1]
    assert frame.now_column == frame.cells // 4
    assert axis[frame.label_w + 1 + frame.now_column] == "|" and axis.count("|") == 1
    assert frame.header[-2].split()[0] == "06:00"
    later = layout(GPUS, ENTRIES, now + HOUR, 12 * HOUR, now, UTC, 100)
    assert later.now_column is None and "|" not in later.header[-1]


def test_the_cursor_steps_on_round_times_and_drags_the_window():
    from datetime import UTC

    from resourced.tui.model import HOUR, MINUTE, Viewport

    now, cells = at("2026-12-01T09:07:00Z"), 94      # 12h over 94 cells: 10-minute steps
    vp = Viewport(12 * HOUR, HOUR, UTC)
    assert vp.step(cells) == 10 * MINUTE
    assert vp.window(now, cells)[0] == at("2026-12-01T07:30:00Z")
    vp.move(1, now, cells)
    assert vp.cursor == at("2026-12-01T09:10:00Z") and vp.follow
    vp.move(-2, now, cells)
    assert vp.cursor == at("2026-12-01T08:50:00Z")
    vp.move(-9, now, cells)                               # past the left edge: it follows
    assert vp.cursor == at("2026-12-01T07:20:00Z") and not vp.follow
    assert vp.window(now, cells)[0] == at("2026-12-01T07:20:00Z")
    vp.home()
    assert vp.follow and vp.cursor_at(now, cells) == now


# -- without textual ---------------------------------------------------------------------
def test_without_textual_it_says_how_to_install_it_and_exits_2():
    code = ("import sys; sys.modules['textual'] = None\n"
            "from resourced.cli import main\n"
            "sys.exit(main(['top']))")
    done = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True,
                          text=True, timeout=30)
    assert done.returncode == 2, done
    assert "pip install 'resourced[tui]'" in done.stderr
    assert done.stdout == ""


@needs_textual
def test_without_a_terminal_it_says_so_and_exits_2():
    done = gpuctl("top")
    assert done.returncode == 2, done
    assert "needs a terminal" in done.stderr and "gpuctl timeline" in done.stderr


# -- end to end, in tmux -----------------------------------------------------------------
@pytest.mark.slow
@needs_textual
@pytest.mark.skipif(shutil.which("tmux") is None,
                    reason="tmux is not installed (Debian: apt-get install tmux)")
def test_gpuctl_top_in_tmux(daemon):
    folder = tempfile.mkdtemp(prefix="top-tmux-")
    tmux = ["tmux", "-S", os.path.join(folder, "socket")]
    passed = {k: v for k, v in os.environ.items() if k.startswith(("DBUS_", "RESOURCED_"))}
    command = shlex.join(["env", *(f"{k}={v}" for k, v in passed.items()),
                          sys.executable, "-m", "resourced.cli", "top"])

    def screen() -> str:
        return subprocess.run([*tmux, "capture-pane", "-p", "-t", "top"], capture_output=True,
                              text=True, timeout=10, check=True).stdout

    try:
        subprocess.run([*tmux, "new-session", "-d", "-s", "top", "-x", "120", "-y", "40",
                        "exec " + command], check=True, timeout=10, env=os.environ)
        eventually(lambda: "bus  now" in screen() and "(not live)" not in screen()
                   and "queue" in screen(), STARTUP, interval=0.1)

        made = gpuctl("book", "--gpus", "1", "--for", "1h", "--at", "+2h")
        assert made.returncode == 0, made.stderr
        ref = made.stdout.split()[0]
        eventually(lambda: ref in screen(), LIVE, interval=0.05)

        subprocess.run([*tmux, "send-keys", "-t", "top", "b"], check=True, timeout=10)
        eventually(lambda: len(bookings()) == 2, ACTION)
        mine = next(b for b in bookings() if b["id"] != ref)
        eventually(lambda: f"booked {mine['id']}" in screen(), ACTION, interval=0.05)
    finally:
        subprocess.run([*tmux, "kill-server"], check=False, capture_output=True, timeout=10)
        shutil.rmtree(folder, ignore_errors=True)
