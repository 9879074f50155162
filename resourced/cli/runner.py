"""gpuctl runner and gpuctl logs: the resourced-runner service, and a booking's output."""

import contextlib
import os
import time

import click

from resourced.exits import EXIT_NO_SUCH_CLAIM, GpuctlError

from ._options import Duration, bus_option, client


@click.command()
@click.option("--grace", type=Duration(),
              help="SIGTERM the command's process group this long before the booking's end "
              "(SIGKILL at the end); after a cancellation, SIGKILL this long after SIGTERM. "
              "Default: [runner] grace in the configuration file, else 30s.")
@bus_option
def runner(grace, bus):
    """Start the commands of your bookings at their start (gpuctl book ... -- COMMAND).

    Runs in the foreground until SIGTERM or Ctrl-C; the systemd user unit
    resourced-runner.service runs it for you. Each command runs as you, in its own
    process group, with the booking's GPUs (CUDA_VISIBLE_DEVICES, RESOURCED_ALLOCATION,
    as gpuctl run --allocation gives) and the environment it was booked from; its output
    goes to a log (gpuctl logs REF). It is stopped at the booking's end (SIGTERM --grace
    seconds before, SIGKILL at the end) or when the booking is cancelled, and its state
    (running, succeeded, failed, timed-out, cancelled, missed) shows in gpuctl bookings.
    Commands keep running when the runner stops; a runner started again adopts them and
    never starts a command twice.

    Example: gpuctl runner --grace 1m
    """
    from resourced.protocol.time import DAY, usec_of_seconds

    if grace is not None and grace > DAY:
        raise click.BadParameter("must be at most 1d", param_hint="--grace")
    from resourced.linux.sd import setup_logging

    setup_logging()
    from resourced.runner.service import Runner, configured_grace

    return Runner(bus, usec_of_seconds(configured_grace()) if grace is None else grace).run()


@click.command()
@click.argument("ref")
@click.option("--follow", "-f", is_flag=True, help="Keep printing new output until the job ends.")
def logs(ref, follow):
    """Print the output (stdout and stderr) of a booking's command.

    Job files and logs are in your own state directory ($XDG_STATE_HOME/resourced/jobs),
    so only you can read yours. A log keeps the last 5 to 10 MiB of output. Exit 6 if
    REF has no command here, 7 if it is another user's booking.

    Example: gpuctl logs b3x9k2q --follow
    """
    from resourced.runner.jobs import JobError, job_ids, jobs_dir, load, valid_id

    directory = jobs_dir()
    try:
        job = load(directory, ref) if valid_id(ref) else None
    except JobError as exc:
        raise GpuctlError(str(exc)) from None
    if job is None:
        _not_here(ref, job_ids(directory) if directory.is_dir() else [])
    out = click.get_binary_stream("stdout")

    def write(data: bytes) -> None:
        out.write(data)
        out.flush()

    shown = print_log(directory, ref, write, follow=follow)
    if not shown and not follow:
        click.echo(f"gpuctl: {ref}: no output yet (the job is {job.state})", err=True)
    return 0


def _not_here(ref: str, known: list[str]) -> None:
    """No job file of ``ref`` here: another user's booking is not yours (exit 7), since
    its command's output is kept where only its owner reads it; else exit 6, listing the
    bookings that have a command here."""
    from resourced.errors import ResourcedError
    from resourced.exits import EXIT_NOT_YOURS

    booking = None
    with contextlib.suppress(ResourcedError, OSError):
        with client(None) as c:
            booking = c.booking(ref)
    if booking is not None and booking["uid"] != os.getuid():
        raise GpuctlError(f"booking {ref} is {booking['user']}'s, not yours: its command's "
                          "output is kept in their own state directory, which only they "
                          "can read", EXIT_NOT_YOURS)
    listed = (f"those with one: {', '.join(known[-10:])}" if known else "none has one yet")
    raise GpuctlError(f"no command for {ref} ({listed}; gpuctl book ... -- COMMAND gives "
                      "a booking one)", EXIT_NO_SUCH_CLAIM)


def print_log(directory, ref: str, write, follow: bool, poll: float = 0.2) -> bool:
    """Write the job's log (the older half first); with ``follow``, go on writing what
    comes until the job is in a final state, across the log's turnovers.  Whether
    anything was written."""
    from resourced.runner.jobs import job_path, load, older_log

    path = job_path(directory, ref, ".log")
    fd = ino = None
    wrote = older_done = False
    try:
        while True:
            job = load(directory, ref) if follow else None
            done = not follow or job is None or job.final
            while True:  # everything there is now, across turnovers
                if fd is None:
                    try:
                        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
                    except FileNotFoundError:
                        break
                    ino = os.fstat(fd).st_ino
                    if not older_done:
                        older_done = True
                        wrote |= _print_older(older_log(path), ino, write)
                wrote |= _copy(fd, write)
                if _inode(path) == ino:
                    break
                _copy(fd, write)  # it became the older half: finish it, then the new one
                os.close(fd)
                fd = None
            if done:
                return wrote
            time.sleep(poll)
    finally:
        if fd is not None:
            os.close(fd)


def _print_older(path, current_ino: int, write) -> bool:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return False
    try:
        if os.fstat(fd).st_ino == current_ino:
            return False
        click.echo("gpuctl: (a log keeps the last 5 to 10 MiB of output: any earlier output "
                   "was dropped)", err=True)
        return _copy(fd, write)
    finally:
        os.close(fd)


def _copy(fd: int, write) -> bool:
    wrote = False
    while data := os.read(fd, 65536):
        write(data)
        wrote = True
    return wrote


def _inode(path) -> int | None:
    with contextlib.suppress(OSError):
        return os.stat(path).st_ino
    return None
