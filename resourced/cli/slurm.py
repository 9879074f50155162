"""gpuctl slurm: what this machine looks like to Slurm, from resourced's own view."""

import click

from ._options import bus_option, client, emit_json, json_option


@click.group()
def slurm():
    """Live beside Slurm on this machine, or move this machine into a Slurm cluster.

    Example: gpuctl slurm config
    """


@slurm.command(short_help="Print gres.conf lines and the slurm.conf NodeName= line.")
@bus_option
@json_option
def config(bus, as_json):
    """Print the gres.conf lines (one per GPU that [slurm] gpus gives Slurm, else per GPU
    resourced manages) and the slurm.conf NodeName= line (CPUs and RealMemory from the
    cpu and ram pools), ready to copy.

    The GPU type is a short word from the NVML name ("NVIDIA H100 80GB HBM3" -> h100);
    File= names /dev/nvidia<NVML index>: check those are the real device nodes.

    Example: gpuctl slurm config --json
    """
    import socket

    from resourced.slurm.export import export, render

    with client(bus) as c:
        view = c.status()
    data = export(view["gpus"], view["pools"], socket.gethostname().split(".")[0])
    if as_json:
        emit_json(data)
    else:
        click.echo(render(data))


_HOOK_HELP = """

    Run by slurmd as root, never by hand: it reads the job from SLURM_JOB_ID,
    SLURM_JOB_UID and the GPUs from SLURM_JOB_GPUS (else SLURM_STEP_GPUS, else
    CUDA_VISIBLE_DEVICES: indices or UUIDs).  Exits 0 whatever happens, within 1.5 s
    (Slurm drains a node whose {what} fails); problems go to stderr and syslog
    (gpuctl-slurm).  Exit 2: not run by slurmd (no SLURM_JOB_ID).

    Example: Prolog=/etc/slurm/resourced-prolog.sh, a script that runs: exec gpuctl slurm {what}
    """


@slurm.command(short_help="Slurm's Prolog=: make a job's GPUs here its claim.",
               help="Make a Slurm job's GPUs on this machine its claim (mode slurm, "
               "labelled \"slurm JOBID USER NAME\"), ended by the epilog or when the job's "
               "processes are gone." + _HOOK_HELP.format(what="prolog"))
def prolog():
    from resourced.slurm.hooks import run

    return run("prolog")


@slurm.command(short_help="Slurm's Epilog=: end a job's claim.",
               help="End a Slurm job's claim on this machine." + _HOOK_HELP.format(what="epilog"))
def epilog():
    from resourced.slurm.hooks import run

    return run("epilog")
