"""gpuctl run, claim, release, env: taking and giving back GPUs."""

import contextlib
import os
import shlex
import time

import click

from ._options import bus_option, client, emit_json, json_option


UINT32_MAX = 2**32 - 1  # what a D-Bus 'u' can carry

gpus_option = click.option("--gpus", type=click.IntRange(1, UINT32_MAX), help="How many GPUs.")
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
                                  task_name=task_name, use_index=use_index,
                                  member_pids=[os.getpid()])
        except BaseException:
            child.cancel()
            raise
        _warn(granted.get("warnings", []))
        code = child.start({**os.environ, **granted["env"]})
        if not allocation:
            _release_after_run(c, granted["allocation"]["ref"])
    return code


def _warn(warnings: list[str]) -> None:
    for w in warnings:
        click.echo(f"gpuctl: warning: {w}", err=True)


def _release_after_run(c, ref: str) -> None:
    """Release a run's claim once the driver has cleared its GPUs, waiting at most
    $RESOURCED_RELEASE_WAIT seconds (default 10), then anyway, with a warning.

    The daemon releases by itself when the command's processes are gone; releasing here
    too means the GPUs are free the moment gpuctl returns, so a next run finds them.
    """
    from ..errors import NoSuchClaim, StillInUse

    try:
        wait = float(os.environ.get("RESOURCED_RELEASE_WAIT", "10"))
    except ValueError:
        wait = 10.0
    deadline = time.monotonic() + wait
    while True:
        try:
            _warn(c.release(ref))
            return
        except NoSuchClaim:
            return
        except StillInUse as exc:
            if time.monotonic() >= deadline:
                _warn([f"{exc.message.split('; ')[0]} after {wait:g} s; released anyway"])
                with contextlib.suppress(NoSuchClaim):
                    c.release(ref, force=True)
                return
        time.sleep(0.1)


@click.command()
@gpus_option
@click.option("--owner-pid", type=click.IntRange(1, UINT32_MAX), required=True,
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
    _warn(result["warnings"])
    if as_json:
        emit_json(result)
    else:
        click.echo(result["allocation"]["ref"])


@click.command()
@click.option("--allocation", metavar="REF", help="The claim to release.")
@click.option("--gpu", metavar="GPU", help="Release whatever claim holds this GPU (with --force).")
@click.option("--force", is_flag=True, help="Release even if the claim's processes still run.")
@click.option("--reason", default="", help="Why (with --gpu); goes to the daemon's log.")
@bus_option
def release(allocation, gpu, force, reason, bus):
    """Release a claim: by reference, or (to recover a lost claim) by GPU.

    A release is refused (exit 9) while the claim's processes still use its GPUs;
    --force overrides. `--gpu` always forces and needs no TTY.

    Example: gpuctl release --force --gpu gpu1 --reason "agent crashed"
    """
    if bool(allocation) == bool(gpu):
        raise click.UsageError("name the claim with exactly one of --allocation or --gpu")
    if gpu and not force:
        raise click.UsageError("--gpu releases by force: add --force")
    with client(bus) as c:
        if gpu:
            ref = c.release_gpu(gpu, reason)
            click.echo(f"released {ref}", err=True)
        else:
            _warn(c.release(allocation, force=force))


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
