"""gpuctl run, claim, release, env: taking and giving back GPUs."""

import contextlib
import os
import shlex

import click

from ._options import bus_option, client, emit_json, json_option


def _positive(ctx, param, value):
    if value is not None and value < 1:
        raise click.BadParameter(f"must be at least 1, not {value}")
    return value


gpus_option = click.option("--gpus", type=int, callback=_positive, help="How many GPUs.")
label_option = click.option("--label", default="", help="A short label shown in status.")
task_option = click.option("--task-name", default="", help="What the GPUs are for.")
index_option = click.option(
    "--index", "use_index", is_flag=True,
    help="CUDA_VISIBLE_DEVICES as PCI-ordered indices (with CUDA_DEVICE_ORDER=PCI_BUS_ID) "
    "instead of UUIDs.",
)


@click.command(context_settings={"allow_interspersed_args": False})
@gpus_option
@click.option("--allocation", metavar="REF", help="Run on this development claim instead.")
@index_option
@label_option
@task_option
@bus_option
@click.argument("command", nargs=-1, required=True, metavar="-- COMMAND [ARGS]...")
def run(gpus, allocation, use_index, label, task_name, bus, command):
    """Run COMMAND on GPUs and return its exit code.

    With --gpus N (default 1) it takes N free GPUs, all or nothing (exit 3 if too few are
    free), and they are released when the command's process is gone, however it ends.
    With --allocation it runs on a development claim, which stays.

    Example: gpuctl run --gpus 2 -- python train.py
    """
    from ..errors import NoSuchClaim
    from .launch import PendingChild

    if allocation and gpus is not None:
        raise click.UsageError("use either --gpus or --allocation, not both")
    with client(bus) as c:
        child = PendingChild(list(command))
        try:
            if allocation:
                granted = c.allocation(allocation, use_index)
            else:
                granted = c.claim(mode="run", gpus=gpus or 1, owner_pid=child.pid, label=label,
                                  task_name=task_name, use_index=use_index)
        except BaseException:
            child.cancel()
            raise
        code = child.start({**os.environ, **granted["env"]})
        if not allocation:
            # The daemon also releases when it sees the command exit; releasing here too
            # means the GPUs are free the moment gpuctl returns, so a next run finds them.
            with contextlib.suppress(NoSuchClaim):
                c.release(granted["allocation"]["ref"])
    return code


@click.command()
@gpus_option
@click.option("--owner-pid", type=int, required=True,
              help="The long-lived process the claim belongs to (for an agent: its own pid).")
@label_option
@task_option
@index_option
@bus_option
@json_option
def claim(gpus, owner_pid, label, task_name, use_index, bus, as_json):
    """Claim GPUs until released, and print the reference.

    Example: gpuctl claim --gpus 1 --owner-pid $PPID --task-name "tune kernels"
    """
    with client(bus) as c:
        result = c.claim(mode="dev", gpus=gpus or 1, owner_pid=owner_pid, label=label,
                         task_name=task_name, use_index=use_index)
    if as_json:
        emit_json(result)
    else:
        click.echo(result["allocation"]["ref"])


@click.command()
@click.option("--allocation", metavar="REF", required=True, help="The claim to release.")
@click.option("--force", is_flag=True, help="Release even if its processes still run.")
@bus_option
def release(allocation, force, bus):
    """Release a claim.

    Example: gpuctl release --allocation c4x9k2a
    """
    with client(bus) as c:
        c.release(allocation, force=force)


@click.command()
@click.option("--allocation", metavar="REF", required=True, help="The claim.")
@index_option
@bus_option
@json_option
def env(allocation, use_index, bus, as_json):
    """Print `export` lines that put a shell on a claim's GPUs.

    Example: eval "$(gpuctl env --allocation c4x9k2a)"
    """
    with client(bus) as c:
        variables = c.allocation(allocation, use_index)["env"]
    if as_json:
        emit_json(variables)
    else:
        for name, value in variables.items():
            click.echo(f"export {name}={shlex.quote(value)}")
