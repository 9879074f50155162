"""Option bundles shared by gpuctl's commands."""

import json

import click


def bus_option(fn):
    return click.option(
        "--bus", type=click.Choice(["session", "system"]), default=None,
        help="Which bus to use (default: $RESOURCED_BUS, else the session bus if a daemon "
        "runs there, else the system bus).",
    )(fn)


def json_option(fn):
    return click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")(fn)


def emit_json(data) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=True))


def client(bus: str | None):
    """A blocking client; imported here so --help never loads the bus library."""
    import sys

    from ..client import Client

    return Client(bus=bus, interactive=sys.stdin.isatty())
