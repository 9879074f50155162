"""gpuctl config check: read a configuration file as the daemon would, and start nothing."""

import os

import click

from resourced.config import ConfigError, find_config, load_config
from resourced.exits import EXIT_USAGE, GpuctlError
from resourced.protocol.names import JSON_SCHEMA

from ._options import emit_json, json_option


@click.group()
def config():
    """Work with resourced's configuration file.

    Example: gpuctl config check /etc/resourced/config.toml
    """


@config.command(short_help="Check a configuration file; exit 2 if it has a problem.")
@click.argument("file", required=False)
@click.option("--system", is_flag=True,
              help="Without FILE, look where the system service looks (no per-user file).")
@json_option
def check(file, system, as_json):
    """Check FILE, or the file the daemon would use; exit 2 if it has a problem.

    Without FILE the lookup is the daemon's: $RESOURCED_CONFIG, then
    $XDG_CONFIG_HOME/resourced/config.toml (not with --system), then
    /etc/resourced/config.toml.  Prints "FILE: ok", or the one problem found.

    Example: gpuctl config check ~/.config/resourced/config.toml
    """
    path = None
    try:
        path = find_config(file, os.environ, system=system)
        cfg = load_config(path)
    except ConfigError as exc:
        if as_json:
            emit_json({"schema": JSON_SCHEMA, "path": exc.source if path is None else str(path),
                       "ok": False, "error": str(exc), "config": None})
        raise GpuctlError(str(exc), EXIT_USAGE, printed_json=as_json) from exc
    if as_json:
        emit_json({"schema": JSON_SCHEMA, "path": None if path is None else str(path),
                   "ok": True, "error": None, "config": cfg.as_dict()})
    elif path is None:
        click.echo("no config file found; defaults apply")
    else:
        click.echo(f"{path}: ok")
        for note in cfg.notes:
            click.echo(f"{path}: note: {note}")
