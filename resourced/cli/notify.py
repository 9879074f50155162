"""gpuctl notify: the resourced-notify service, in the foreground."""

import click

from ._options import bus_option


@click.command()
@bus_option
def notify(bus):
    """Show desktop notifications while RAM or disk health is not OK.

    A long-running agent for a graphical session: one bubble per check (critical for
    STOP, normal for WARN, ERROR and UNAVAILABLE), updated in place, closed when the check
    is OK again.  It keeps running while resourced or the notification server restarts.
    Where the server supports actions, clicking a bubble opens gpuctl resources (or, for
    a booking, gpuctl bookings) in $TERMINAL, else x-terminal-emulator.
    The systemd user unit resourced-notify.service runs it with the session.

    Example: gpuctl notify --bus system
    """
    import asyncio

    from resourced.linux.sd import setup_logging
    from resourced.notify.service import run_agent

    setup_logging()
    asyncio.run(run_agent(bus))
    return 0
