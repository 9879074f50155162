"""gpuctl init: write a configuration file that lists the GPUs this machine has."""

import os
import sys
from pathlib import Path

import click

from ._options import emit_json, json_option

HEADER = """\
# resourced configuration, written by `gpuctl init` from what the GPU driver reported.
# Every key is documented in examples/config.toml of the resourced sources (installed
# as share/resourced/examples/config.toml beside the package's environment).
# Once [[gpu]] entries exist, only the listed GPUs are managed: delete an entry to keep
# resourced away from that GPU; change an alias to rename it.

[daemon]
# probe_timeout = 10        # seconds before a driver or disk probe counts as failed
# dead_owner_grace = 600    # release a dev claim this long after its owner died; 0 = never
"""


def render(gpus) -> str:
    parts = [HEADER]
    for g in gpus:
        parts.append(
            f'\n# {g.name}, {g.memory_bytes // 2**20} MiB, PCI {g.pci_bus_id}\n'
            f'[[gpu]]\nuuid = "{g.uuid}"\nalias = "gpu{g.index}"\nindex = {g.index}\n'
        )
    return "".join(parts)


def default_path(system: bool) -> Path:
    if system:
        return Path("/etc/resourced/config.toml")
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "resourced" / "config.toml"


@click.command()
@click.option("--system", is_flag=True, help="Write /etc/resourced/config.toml (the shared install).")
@click.option("--output", "-o", type=click.Path(dir_okay=False, path_type=Path),
              help="Write here instead ('-' for standard output).")
@click.option("--force", is_flag=True, help="Overwrite an existing file.")
@json_option
def init(system, output, force, as_json):
    """Read the GPUs (NVML, or the simulation) and write a commented config listing them.

    Example: gpuctl init --system
    """
    from resourced.backends import BackendError, select_backend
    from resourced.exits import GpuctlError
    from resourced.linux.atomic_file import write_atomically
    from resourced.protocol.names import JSON_SCHEMA

    if as_json and str(output) == "-":
        raise click.UsageError("-o - prints the TOML itself; --json reports a file written")
    try:
        backend = select_backend()
    except ValueError as exc:
        raise GpuctlError(str(exc), 2) from exc
    try:
        gpus = backend.inventory()
    except BackendError as exc:
        raise GpuctlError(f"cannot read the GPUs: {exc}") from exc
    if not gpus:
        raise GpuctlError(f"no GPUs found: {getattr(backend, 'reason', 'the driver lists none')}")
    text = render(gpus)
    if str(output) == "-":
        click.echo(text, nl=False)
        return
    path = output or default_path(system)
    if path.exists() and not force:
        raise GpuctlError(f"{path} exists; use --force to overwrite it", exit_code=1)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, text, mode=0o644)
    if as_json:
        emit_json({"schema": JSON_SCHEMA, "path": str(path), "backend": backend.name,
                   "gpus": [{"index": g.index, "uuid": g.uuid, "name": g.name} for g in gpus]})
    else:
        click.echo(f"wrote {path} ({len(gpus)} GPU(s), {backend.name} backend)", err=True)
    sys.stdout.flush()
