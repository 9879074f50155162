"""gpuctl usage: who held GPUs, and who used what they held."""

import click

from ._options import bus_option, client, echo_table, emit_json, json_option
from .bookings import When
from .status import table


@click.command()
@click.option("--user", metavar="USER", help="One user (a name or a uid).")
@click.option("--since", type=When(past=True),
              help="From then, or this long ago (1h, 2d; default: 7d ago).")
@click.option("--until", type=When(), help="Until then (default: now).")
@click.option("--by", type=click.Choice(["user", "gpu"]), default="user", show_default=True,
              help="One row per user, or per GPU (with its mean utilisation and memory in "
              "use, where sampled).")
@bus_option
@json_option
def usage(user, since, until, by, bus, as_json):
    """GPU-hours held, used and held-but-idle, per user or per GPU; bookings apart.

    "Used" is the held time during which the daemon saw a process of the holder on the
    GPUs (at any utilisation); what it could not see is not counted. Live claims count
    so far. This is what shows who books and does not use.

    Example: gpuctl usage --since "mon 00:00" --by gpu
    """
    from resourced.protocol.time import now_usec

    from .sessions import uid_of

    end = now_usec() if until is None else until
    if since is not None and since >= end:
        # (the daemon's own words name its bus options, SinceUSec and UntilUSec)
        raise click.UsageError(f"--since must be before {'--until' if until else 'now'}: "
                               "usage is what was held in that time")
    uid = None if user is None else uid_of(user)
    with client(bus) as c:
        rows = c.usage(since=since, until=until, uid=uid, by_gpu=by == "gpu")
    if as_json:
        emit_json(rows)
        return
    if not rows:
        click.echo("nothing was held in that time")
        return
    head = ("GPU",) if by == "gpu" else ("USER",)
    lines = [(*head, "HELD h", "USED h", "IDLE h", "BOOKED h", "BOOKED IDLE h", "CLAIMS",
              "BOOKINGS", *(("UTIL %", "MEM") if by == "gpu" else ()))]
    for r in rows:
        lines.append((r["gpu"] if by == "gpu" else r["user"], _h(r["held_gpu_hours"]),
                      _h(r["used_gpu_hours"]), _h(r["idle_gpu_hours"]),
                      _h(r["booked_gpu_hours"]), _h(r["booked_idle_gpu_hours"]), r["claims"],
                      r["bookings"], *(_load(r) if by == "gpu" else ())))
    echo_table("\n".join(table(lines)))


def _h(hours: float) -> str:
    return f"{hours:.1f}"


def _load(row: dict) -> tuple[str, str]:
    """A GPU's mean utilisation (%) and memory in use; - where nothing was sampled."""
    from resourced.protocol.amounts import format_bytes

    util, memory = row.get("mean_utilization_pct"), row.get("mean_memory_used_bytes")
    return ("-" if util is None else f"{util:g}", "-" if memory is None else format_bytes(memory))
