"""gpuctl slurm: what this machine looks like to Slurm, from resourced's own view."""

import click

from ._options import bus_option, client, emit_json, json_option


@click.group()
def slurm():
    """Help move this machine into a Slurm cluster.

    Example: gpuctl slurm config
    """


@slurm.command(short_help="Print gres.conf lines and the slurm.conf NodeName= line.")
@bus_option
@json_option
def config(bus, as_json):
    """Print the gres.conf lines (one per GPU resourced manages) and the slurm.conf
    NodeName= line (CPUs and RealMemory from the cpu and ram pools), ready to copy.

    The GPU type is a short word from the NVML name ("NVIDIA H100 80GB HBM3" -> h100);
    File= names /dev/nvidia<NVML index>: check those are the real device nodes.

    Example: gpuctl slurm config --json
    """
    import socket

    from ..slurm_export import export, render

    with client(bus) as c:
        view = c.status()
    data = export(view["gpus"], view["pools"], socket.gethostname().split(".")[0])
    if as_json:
        emit_json(data)
    else:
        click.echo(render(data))
