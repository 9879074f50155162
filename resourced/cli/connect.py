"""gpuctl connect: use a shared bus that an ordinary account hosts (resourced --shared)."""

import os
from pathlib import Path

import click

from resourced.protocol.names import JSON_SCHEMA, shared_bus_address

from ._options import emit_json, json_option


@click.command()
@click.argument("directory", required=False,
                type=click.Path(file_okay=False, path_type=Path))
@click.option("--forget", is_flag=True, help="Stop using a shared bus by default.")
@click.option("--no-check", is_flag=True,
              help="Record DIRECTORY without connecting first (the bus may be down now).")
@json_option
def connect(directory, forget, no_check, as_json):
    """Use the shared bus hosted in DIRECTORY (`resourced --shared DIRECTORY` on this
    machine) from now on: gpuctl and the Python client talk to it when no bus is named.

    It connects first and checks that the account owning DIRECTORY owns the service
    there (exit 8 if not, or if you are not in its group; exit 5 if it is down), then
    writes the path to $XDG_CONFIG_HOME/resourced/client.toml. $RESOURCED_BUS_ADDRESS
    (unix:path=DIRECTORY/bus) does the same for one shell.

    Example: gpuctl connect /srv/gpu-lab/resourced
    """
    from resourced.client import discovery

    if forget:
        path = Path(discovery.client_file())
        path.unlink(missing_ok=True)
        _say(as_json, {"shared_dir": None, "file": str(path)},
             f"gpuctl no longer uses a shared bus by default ({path} removed)")
        return
    if directory is None:
        raise click.UsageError("name the directory of the shared bus, or give --forget")
    directory = directory.absolute()
    info = {"shared_dir": str(directory)}
    if not no_check:
        info.update(_check(directory))
    path = discovery.write_connection(directory)
    info["file"] = str(path)
    host = f", hosted by {info['host']} ({info['gpu_count']} GPU(s))" if "host" in info else ""
    _say(as_json, info, f"gpuctl now uses the shared bus in {directory}{host}; written to "
                        f"{path}")


def _check(directory: Path) -> dict:
    """Connect to the bus in ``directory`` as every later call will; who hosts it."""
    from resourced.client import discovery
    from resourced.client.sync import Client
    from resourced.linux.users import user_name

    saved = os.environ.get(discovery.ADDRESS_VARIABLE)
    os.environ[discovery.ADDRESS_VARIABLE] = shared_bus_address(directory)
    try:
        with Client(bus="shared") as c:
            gpus = len(c.status()["gpus"])
    finally:
        if saved is None:
            del os.environ[discovery.ADDRESS_VARIABLE]
        else:
            os.environ[discovery.ADDRESS_VARIABLE] = saved
    uid = directory.stat().st_uid
    return {"host": user_name(uid), "host_uid": uid, "gpu_count": gpus}


def _say(as_json: bool, data: dict, text: str) -> None:
    if as_json:
        emit_json({"schema": JSON_SCHEMA, **data})
    else:
        click.echo(text)
