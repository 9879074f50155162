"""gpuctl run, claim, release, env: taking and giving back GPUs."""

import contextlib
import os
import shlex
import sys
import time

import click

from resourced.exits import EXIT_NO_SUCH_CLAIM, GpuctlError
from resourced.protocol.names import JSON_SCHEMA

from ._options import (
    CommandAfterDashes,
    Count,
    Duration,
    GpuList,
    Memory,
    PoolAmount,
    bus_option,
    client,
    complete_claims,
    complete_gpus,
    dry_run_option,
    emit_json,
    for_each_ref,
    json_option,
    named_gpu_count,
    refs_given,
    refuse_stray_words,
    said,
    session_option,
)

UINT32_MAX = 2**32 - 1  # what a D-Bus 'u' can carry (the client checks it too)
INT32 = click.IntRange(-2**31, 2**31 - 1)


def demand_options(fn):
    """What a claim asks for, and how it waits: shared by run and claim."""
    options = [
        click.option("--gpus", "-G", type=click.IntRange(1, UINT32_MAX),
                     help="Whole GPUs (default 1 when nothing else is asked for)."),
        click.option("--gpu", "named", type=GpuList(),
                     help="These GPUs, whole (alias, index or UUID; comma-separated); with "
                     "--vram, the one GPU of the share."),
        click.option("--exclude", type=GpuList(), help="Never these GPUs."),
        click.option("--vram", type=Memory(), help="A share of one GPU's memory, e.g. 20G."),
        click.option("--ram", type=Memory(), help="Host RAM from the ram pool, e.g. 4G."),
        click.option("--cpu", type=Count(), help="CPU cores from the cpu pool."),
        click.option("--pool", "pools", type=PoolAmount(), multiple=True,
                     help="An amount of a named pool, NAME=AMOUNT (repeatable)."),
        click.option("--priority", type=INT32, default=0, show_default=True,
                     help="Higher is served first when waiting (FIFO among equals)."),
        click.option("--wait", is_flag=True, help="Queue until it fits instead of exit 3."),
        click.option("--timeout", type=Duration(),
                     help="With --wait: give up after this long (30s, 5m, 1h); exit 11."),
        click.option("--for", "-t", "duration", type=Duration(),
                     help="End the claim this long after asking (30m, 2h): `run` stops the "
                     "command then (SIGTERM, SIGKILL 10 s later)."),
        click.option("--quiet", "-q", is_flag=True,
                     help="With --wait: say nothing while queued (on a terminal, the place in "
                     "the queue and who holds what it waits for are shown)."),
        click.option("--isolate/--no-isolate", default=None,
                     help="Run the claim's commands where they can open its GPUs and no others "
                     "(a systemd scope; the system service, [daemon] isolation). Default: "
                     "as the daemon is configured."),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


class WaitingLine:
    """While a claim waits, one line on a terminal's stderr saying where it stands, redrawn
    when that changes (Slurm's srun and apt's lock wait are the models); nothing when
    stderr is not a terminal or when ``on`` is false (--quiet, or not --wait)."""

    def __init__(self, on: bool):
        self.on = on and sys.stderr.isatty()
        self.drawn = False

    def __enter__(self) -> "WaitingLine":
        return self

    def __exit__(self, *exc) -> None:
        if self.drawn:
            sys.stderr.write("\r\x1b[K")  # the line goes: the command's output follows
            sys.stderr.flush()

    @property
    def show(self):
        """The ``progress`` callback for ``Client.claim``, or None when nothing is shown."""
        return self._draw if self.on else None

    def _draw(self, place: dict) -> None:
        from .status import wanted

        me = place["claim"]
        held = [f"{c['user']} ({c['id']})" for c in place["holders"]]
        holders = ", ".join(held[:3]) + (f" and {len(held) - 3} more" if len(held) > 3 else "")
        line = (f"gpuctl: {me['id']} waits for {wanted(me, place['units'])}: "
                f"{place['position']} of {place['waiting']} in the queue"
                + (f"; held by {holders}" if holders else ""))
        sys.stderr.write("\r\x1b[K" + line)
        sys.stderr.flush()
        self.drawn = True


def waits_with(wait: bool, timeout) -> None:
    """--timeout is how long --wait waits: alone, it was silently ignored."""
    if timeout is not None and not wait:
        raise click.UsageError("--timeout is how long --wait waits: add --wait (without it, "
                               "a claim that does not fit now exits 3 at once)")


def demand(gpus, named, exclude, vram, ram, cpu, pools) -> dict:
    """claim() keyword arguments; one whole GPU when nothing at all is asked for, one of
    each GPU named (--gpu), as book reads them."""
    gpus = named_gpu_count(gpus, named, vram)
    if named and vram is None:
        gpus = len(named)
    if gpus is None and vram is None and ram is None and cpu is None and not pools:
        gpus = 1
    names = [name for name, _ in pools]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise click.UsageError(f"--pool {', '.join(twice)} given more than once; give each "
                               "pool once, with the whole amount")
    return dict(gpus=gpus or 0, vram=vram, ram=ram, cpu=cpu, pools=dict(pools),
                gpu_names=list(named) if named else None,
                exclude=list(exclude) if exclude else None)


label_option = click.option("--label", default="", help="A short label shown in status.")
task_option = click.option("--task-name", default="", help="What the GPUs are for.")
index_option = click.option(
    "--index", "use_index", is_flag=True,
    help="CUDA_VISIBLE_DEVICES as PCI-ordered indices (with CUDA_DEVICE_ORDER=PCI_BUS_ID) "
    "instead of UUIDs.",
)


@click.command(cls=CommandAfterDashes, context_settings={"allow_interspersed_args": False})
@demand_options
@click.option("--allocation", metavar="REF", shell_complete=complete_claims,
              help="Run on this development claim instead.")
@click.option("--reclaimable", is_flag=True,
              help="The daemon may ask the GPUs back for a higher-priority waiter: the command "
              "then gets --reclaim-signal and should finish soon.")
@click.option("--reclaim-signal", default="SIGUSR1", show_default=True, metavar="SIGNAL",
              help="The signal that forwards a reclaim request to the command.")
@index_option
@label_option
@task_option
@session_option
@dry_run_option
@bus_option
@click.argument("command", nargs=-1, required=True, metavar="-- COMMAND [ARGS]...")
def run(gpus, named, exclude, vram, ram, cpu, pools, priority, wait, timeout, duration, quiet,
        isolate,
        allocation, reclaimable, reclaim_signal, use_index, label, task_name, session, dry_run,
        bus, command):
    """Run COMMAND on GPUs and/or pool amounts and return its exit code.

    It takes what is asked (--gpus N, default 1; --vram on a shared GPU; --ram, --cpu,
    --pool), all or nothing: exit 3 if it does not fit now, or with --wait it queues by
    --priority. Everything is released when the command's processes are gone, however
    they end. With --allocation it runs on a development claim, which stays, or on an
    active booking. A claim with an end (--for), or a booking, stops the command at that
    end (SIGTERM, then SIGKILL 10 s later). A claim granted only until a booking's start
    (a warning says so) forwards the request to give it back as --reclaim-signal. When
    `gpuctl stop` ends its session, the command gets --reclaim-signal, then SIGTERM and
    SIGKILL 10 s later. --dry-run says what would be granted and runs nothing.

    Example: gpuctl run --vram 20G --ram 4G --cpu 1 --wait -- python infer.py
    """
    from resourced.supervision.launch import PendingChild
    from resourced.supervision.stopping import forward_reclaims, stop_at_end

    refuse_stray_words(command, "gpuctl run ... -- COMMAND [ARGS]...")
    asked = demand(gpus, named, exclude, vram, ram, cpu, pools)
    if allocation and (gpus is not None or named or exclude or vram or ram or cpu or pools
                       or duration
                       or session is not None or isolate is not None):
        raise click.UsageError("use either --allocation or amounts to claim, not both")
    waits_with(wait, timeout)
    signum = _signal_number(reclaim_signal)
    if dry_run:
        if allocation:
            raise click.UsageError("--dry-run is for a new claim, not --allocation")
        with client(bus) as c:
            result = c.claim(mode="run", label=label, task_name=task_name, use_index=use_index,
                             priority=priority, wait=wait, timeout=timeout,
                             reclaimable=reclaimable, duration=duration, session=session,
                             dry_run=True, isolate=isolate, **asked)
        _warn(result["warnings"])
        _say_dry_run(result, f"then run: {shlex.join(command)}")
        return 0
    with client(bus) as c:
        child = PendingChild(list(command))
        try:
            if allocation:
                with naming_bookings(c, allocation):
                    granted = c.allocation(allocation, use_index)
            else:
                with WaitingLine(wait and not quiet) as line:
                    granted = c.claim(mode="run", owner_pid=child.pid, label=label,
                                      task_name=task_name, use_index=use_index,
                                      member_pids=[os.getpid()], priority=priority, wait=wait,
                                      timeout=timeout, reclaimable=reclaimable,
                                      progress=line.show, duration=duration, session=session,
                                      isolate=isolate, **asked)
            if granted["allocation"]["isolated"]:  # inside its scope before it execs
                _confine(c, granted["allocation"]["ref"], child.pid, not allocation)
        except BaseException:
            child.cancel()
            raise
        _warn(granted.get("warnings", []))
        held = granted["allocation"]
        forward_reclaims(c.bus, held["ref"], child.pid, signum)
        if held["until_usec"] and not held["until_booking"]:
            stop_at_end(c.bus, held["ref"], child.pid)
        inherited = {"RESOURCED_SESSION": held["session"]} if held.get("session") else {}
        code = child.start({**os.environ, **granted["env"], **inherited})
        if not allocation:
            _release_after_run(c, granted["allocation"]["ref"])
    return code


def _signal_number(name: str) -> int:
    import signal

    try:
        return int(getattr(signal.Signals, name.upper() if name.upper().startswith("SIG")
                           else "SIG" + name.upper()))
    except AttributeError:
        raise click.BadParameter(f"no signal {name!r}", param_hint="--reclaim-signal") from None


def _warn(warnings: list[str]) -> None:
    for w in warnings:
        click.echo(f"gpuctl: warning: {said(w)}", err=True)


def _confine(c, ref: str, pid: int, ours: bool) -> None:
    """Put the command's process in the claim's scope; a failure ends a claim made for it."""
    try:
        c.confine(ref, pid)
    except BaseException:
        if ours:
            with contextlib.suppress(Exception):
                c.release(ref, force=True)
        raise


def _release_after_run(c, ref: str) -> None:
    """Release a run's claim once the driver has cleared its GPUs, waiting at most
    $RESOURCED_RELEASE_WAIT seconds (default 10), then anyway, with a warning.

    The daemon releases by itself when the command's processes are gone; releasing here
    too means the GPUs are free the moment gpuctl returns, so a next run finds them.
    """
    from resourced.errors import NoSuchClaim, StillInUse

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
@demand_options
@click.option("--owner-pid", type=click.IntRange(1, UINT32_MAX), required=True,
              help="The long-lived process the claim belongs to (for an agent: its own pid).")
@click.option("--reclaimable", is_flag=True,
              help="The daemon may ask it back for a higher-priority waiter (see status).")
@label_option
@task_option
@index_option
@session_option
@dry_run_option
@bus_option
@json_option
def claim(gpus, named, exclude, vram, ram, cpu, pools, priority, wait, timeout, duration,
          quiet, isolate, owner_pid, reclaimable, label, task_name, use_index, session,
          dry_run, bus, as_json):
    """Claim GPUs and/or pool amounts until released, and print the reference.

    --dry-run says what would be granted (or that it would wait), limits included, and
    claims nothing: no reference is printed.

    Example: gpuctl claim --gpus 1 --ram 8G --owner-pid $PPID --task-name "tune kernels"
    """
    waits_with(wait, timeout)
    with client(bus) as c, WaitingLine(wait and not quiet and not dry_run) as line:
        result = c.claim(mode="dev", owner_pid=owner_pid, label=label, task_name=task_name,
                         use_index=use_index, priority=priority, wait=wait, timeout=timeout,
                         reclaimable=reclaimable, progress=line.show, duration=duration,
                         session=session, dry_run=dry_run, isolate=isolate,
                         **demand(gpus, named, exclude, vram, ram, cpu, pools))
    _warn(result["warnings"])
    if as_json:
        emit_json({"schema": JSON_SCHEMA, **result})
    elif dry_run:
        _say_dry_run(result)
    else:
        click.echo(result["allocation"]["ref"])
        _say_named_by_number(named, gpus, result)


def _say_named_by_number(named, gpus, result: dict) -> None:
    """``--gpu 2`` is GPU 2, whole, not two GPUs: said on stderr when the one name given
    was a bare number and no count was, with the option a count would have been."""
    if gpus or not named or len(named) != 1 or not str(named[0]).isdigit():
        return
    granted = ", ".join(f"gpu{i}" for i in result["allocation"]["gpu_indices"])
    click.echo(f"gpuctl: granted {granted} (--gpu names a GPU by alias, index or UUID; for a "
               f"number of GPUs: --gpus {named[0]})", err=True)


def _say_dry_run(result: dict, then: str = "") -> None:
    """What a dry-run claim would get, on stderr (stdout stays empty: nothing to use)."""
    held = result["allocation"]
    if held["state"] == "queued":
        said = "would wait in the queue"
    else:
        where = [f"gpu{i}" for i in held["gpu_indices"]] + [f"{n} {a}" for n, a in
                                                           held["pools"].items()]
        said = f"would be granted {', '.join(where) or 'nothing'}"
        if held["until_usec"]:
            from resourced.protocol.time import iso_utc

            said += f" until {iso_utc(held['until_usec'])}"
    click.echo(f"gpuctl: {said} (dry run: nothing claimed){'; ' + then if then else ''}",
               err=True)


@click.command()
@click.argument("refs", nargs=-1, metavar="[REF]...", shell_complete=complete_claims)
@click.option("--allocation", metavar="REF", shell_complete=complete_claims,
              help="The claim to release (as REF; the predecessor's spelling).")
@click.option("--gpu", metavar="GPU", shell_complete=complete_gpus,
              help="Release whatever claim holds this GPU (with --force).")
@click.option("--force", is_flag=True, help="Release even if the claim's processes still run.")
@click.option("--reason", default="", help="Why (with --gpu); goes to the daemon's log.")
@dry_run_option
@bus_option
@json_option
def release(refs, allocation, gpu, force, reason, dry_run, bus, as_json):
    """Release claims: by reference (several at once), or (to recover a lost claim) by GPU.

    A release is refused (exit 9) while the claim's processes still use its GPUs;
    --force overrides. `--gpu` always forces and needs no TTY. --dry-run makes the same
    checks (it is yours, nothing of it still runs) and releases nothing. With several
    REFs each is released in turn; one refused is said and the rest still go (--json: a
    line each).

    Example: gpuctl release c4x9k2a

    Example: gpuctl release --force --gpu gpu1 --reason "agent crashed"
    """
    if gpu and (refs or allocation):
        raise click.UsageError("name the claim by REF or by --gpu, not both")
    if gpu and not force:
        raise click.UsageError("--gpu releases by force: add --force")
    if gpu and dry_run:
        raise click.UsageError("--dry-run works with REF")
    with client(bus) as c:
        if gpu:
            _released(c.release_gpu(gpu, reason), [], dry_run, as_json, by_gpu=True)
            return
        def one(ref):
            with naming_bookings(c, ref):
                _released(ref, c.release(ref, force=force, dry_run=dry_run), dry_run, as_json)

        for_each_ref(refs_given(refs, allocation), one, as_json)


@contextlib.contextmanager
def naming_bookings(c, ref: str):
    """An unknown claim that is a booking not yet started is named as such ("b3x9k2q is a
    booking that starts today 21:00"), not as unknown (the exit code stays 6)."""
    from resourced.errors import NoSuchClaim, ResourcedError

    try:
        yield
    except NoSuchClaim:
        if not ref.startswith("b"):  # (a claim's id starts with c, a booking's with b)
            raise
        try:
            booking = c.booking(ref)
        except ResourcedError:
            booking = None
        if booking is None or booking["state"] != "scheduled":
            raise
        from resourced.protocol.time import local_text

        raise GpuctlError(f"{ref} is a booking that starts {local_text(booking['start_usec'])}: "
                          "its claim exists from then", EXIT_NO_SUCH_CLAIM) from None


def _released(ref: str, warnings: list, dry_run: bool, as_json: bool, by_gpu=False) -> None:
    if as_json:
        emit_json({"schema": JSON_SCHEMA, "ref": ref, "released": not dry_run,
                   "dry_run": dry_run, "warnings": warnings})  # (MCP's release answers the same)
    elif dry_run:
        _warn(warnings)
        click.echo(f"gpuctl: would release {ref} (dry run: nothing released)", err=True)
    elif by_gpu:
        click.echo(f"released {ref}", err=True)
    else:
        _warn(warnings)


@click.command()
@click.argument("ref", required=False, metavar="REF", shell_complete=complete_claims)
@click.option("--allocation", metavar="REF", shell_complete=complete_claims,
              help="The claim (as REF; the predecessor's spelling).")
@index_option
@click.option("--docker", "engine", flag_value="docker",
              help="Print `docker run` options instead: the claim's GPUs and nothing else.")
@click.option("--podman", "engine", flag_value="podman",
              help="Print `podman run` options instead (CDI device names, by index).")
@bus_option
@json_option
def env(ref, allocation, use_index, engine, bus, as_json):
    """Print `export` lines that put a shell on a claim's GPUs.

    With --docker or --podman: the options that give a container the claim's GPUs and no
    others, and its variables (RESOURCED_ALLOCATION among them, by which the daemon knows
    the container's processes for the claim's), on one line for `$(...)`; --json prints
    them as a list.

    Example: eval "$(gpuctl env c4x9k2a)"

    Example: docker run --rm $(gpuctl env "$RESOURCED_ALLOCATION" --docker) IMAGE
    """
    [allocation] = refs_given((ref,) if ref else (), allocation, several=False)
    from resourced.client.environment import container_options

    if engine and use_index:
        raise click.UsageError("--index does not apply to --docker or --podman: a container "
                               "sees only its GPUs")
    with client(bus) as c:
        with naming_bookings(c, allocation):
            granted = c.allocation(allocation, use_index)
    _warn(granted["warnings"])
    if engine:
        options = container_options(engine, granted["allocation"], granted["env"])
        if as_json:
            emit_json(options)
        else:
            click.echo(" ".join(options))
        return
    variables = granted["env"]
    if as_json:
        emit_json(variables)
    else:
        for name, value in variables.items():
            click.echo(f"export {name}={shlex.quote(value)}")
