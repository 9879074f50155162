"""gpuctl top: the live, full-screen timeline (textual: ``pip install 'resourced[tui]'``)."""

import sys

import click

from resourced.exits import EXIT_USAGE, GpuctlError

from ._options import Duration, bus_option, window_hours, window_options

INSTALL_HINT = "pip install 'resourced[tui]'"
KEYS = """\b
Keys:
  left/right, h/l   the cursor earlier/later (one step, about a cell)
  up/down, k/j      the cursor to another GPU
  + / -             zoom in / out (1 hour to 30 days)
  [ / ]             pan a quarter of the window earlier / later
  n, home           back to now (the window follows now again)
  tab, shift+tab    to the next / previous claim or booking
  b                 book the highlighted GPU at the cursor for the length
                    (where that does not fit: the earliest fit, and says so)
  e                 extend the booking under the cursor by the length
  c                 cancel the booking under the cursor (asks y/n)
  enter, i          the details of the claim or booking under the cursor
  d / D             the next / previous length (15m to 1d)
  r                 read again;  q, ctrl+c  quit"""


@click.command(epilog=KEYS)
@window_options(low=3600, text="The window's span at start")
@click.option("--length", type=Duration(), default="1h", show_default=True,
              help="What b books and e extends by at start (d changes it).")
@bus_option
def top(span, hours, length, bus):
    """A live, full-screen timeline: GPUs against time, who holds and books what, the
    queue, health and notices; keys to zoom, pan, book, extend and cancel.

    Live from the daemon's bus signals (redrawn once a minute for the moving now).

    Example: gpuctl top --span 1d
    """
    try:
        import textual  # noqa: F401
    except ImportError:
        raise GpuctlError(f"gpuctl top needs textual: {INSTALL_HINT}", EXIT_USAGE) from None
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise GpuctlError("gpuctl top needs a terminal (for text: gpuctl timeline)", EXIT_USAGE)
    hours = window_hours(span, hours, low=3600)
    if not length > 0:
        raise click.BadParameter("must be more than 0", param_hint="--length")
    from resourced.client.sync import Client

    with Client(bus=bus, interactive=False) as c:  # unreachable: exit 5 before the screen
        c.ping()
        bus = c.bus
    from resourced.tui.app import TopApp

    TopApp(bus=bus, hours=hours, length=length).run()
