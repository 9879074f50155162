"""gpuctl resources: the RAM and disk checks, their limits and live figures."""

import os

import click

from resourced.exits import EXIT_USAGE, GpuctlError
from resourced.protocol.names import JSON_SCHEMA

from ._options import bus_option, echo_table, emit_json, json_option
from .status import table

COLUMNS = ("CHECK", "TYPE", "PATH", "LEVEL", "FREE", "TOTAL", "USED%", "LIMITS", "REASON")


def _bytes(n: int | None) -> str:
    from resourced.protocol.amounts import format_bytes

    return "-" if n is None else format_bytes(n)


def _limits(limits: dict) -> str:
    return ",".join(f"{k}={v:g}" for k, v in limits.items()) or "-"


def render_resources(health: dict) -> str:
    """The table, from the same data ``--json`` prints."""
    rows = [COLUMNS]
    for c in health["checks"]:
        used = "-" if c["used_pct"] is None else f"{c['used_pct']:.1f}"
        rows.append((c["name"], c["type"], c["path"] or "-", c["level"], _bytes(c["free_bytes"]),
                     _bytes(c["total_bytes"]), used, _limits(c["limits"]), c["reason"]))
    if len(rows) > 1:
        lines = table(rows)
    else:
        lines = ["no checks configured ([[check]] in the config file)"]
    lines.append(f"health: {health['level']}")
    return "\n".join(lines)


def measure_locally(config_file: str | None) -> tuple[dict, str]:
    """One round of every check of the config the daemon would read; (health, where from)."""
    import asyncio

    from resourced.config import ConfigError, find_config, load_config
    from resourced.daemon.health_monitor import HealthMonitor

    try:
        path = find_config(config_file, os.environ)
        cfg = load_config(path)
    except ConfigError as exc:
        raise GpuctlError(str(exc), EXIT_USAGE) from exc

    async def one_round() -> dict:
        monitor = HealthMonitor(cfg.checks, cfg.daemon.sample_interval,
                                cfg.daemon.probe_timeout, audit=False)
        try:
            await monitor.sample_now()
        finally:
            monitor.close()
        return monitor.describe()

    where = str(path) if path is not None else "the defaults (no config file)"
    return asyncio.run(one_round()), where


@click.command()
@bus_option
@json_option
@click.option("--config", "config_file", metavar="FILE",
              help="The config to measure from when the daemon is unreachable "
              "(default: the daemon's lookup).")
def resources(bus, as_json, config_file):
    """Show the RAM and disk checks: level, free space, limits, and why.

    Levels: OK, WARN, STOP (a warn_/stop_ limit reached; limits are inclusive), ERROR (the
    measurement failed) and UNAVAILABLE (no answer within probe_timeout); the last line is
    the machine's health, the worst check.  The figures come from the daemon; when it is
    unreachable, gpuctl measures locally from the same config and says so on stderr.
    Levels are advice: the exit code is 0 whatever they are (2 for a bad config, and the
    usual codes when the daemon answers with an error).

    Example: gpuctl resources --json | jq -r .level
    """
    from resourced.errors import DaemonUnreachable

    from ._options import client

    try:
        with client(bus) as c:
            health = c.status().get("health")
        source = "daemon"
        if health is None:
            health, where = measure_locally(config_file)
            source = "local"
            click.echo(f"daemon reports no health: measured locally from {where}", err=True)
    except DaemonUnreachable:
        health, where = measure_locally(config_file)
        source = "local"
        click.echo(f"daemon unreachable: measured locally from {where}", err=True)
    if as_json:
        emit_json({"schema": JSON_SCHEMA, **health, "source": source})
    else:
        echo_table(render_resources(health))
    return 0
