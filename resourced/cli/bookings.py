"""gpuctl book, bookings, edit, extend, cancel, slots, blackout, notice, timeline: the
calendar.

Times are read as people type them (``+30m``, ``20:00``, ``tomorrow 09:00``, ISO 8601)
and shown in local time; the daemon stores UTC.  With the simulated backend, *now* is
``$RESOURCED_SIMULATED_CLOCK``'s.
"""

import contextlib

import click

from resourced.protocol.names import JSON_SCHEMA
from resourced.protocol.time import (
    HOUR,
    MINUTE,
    Usec,
    iso_utc,
    local_now,
    local_text,
    now_usec,
    seconds_of_usec,
    usec_of_seconds,
    whole_second,
    with_times,
)

from ._options import (
    CommandAfterDashes,
    Count,
    Duration,
    GpuList,
    Memory,
    PoolAmount,
    bus_option,
    client,
    dry_run_option,
    echo_table,
    emit_json,
    for_each_ref,
    json_option,
    named_gpu_count,
    session_option,
    split_at_dashes,
    stray_word,
    window_hours,
    window_options,
)
from .status import in_units, table

SLOT_NOW_USEC = MINUTE
"""A slot starting within this of now is offered as --at now."""
MAX_ROWS = 50
"""Bookings a table shows: a person does not read 5,000 lines; --json has them all."""


class When(click.ParamType):
    """A moment: ``now``, ``+30m``, ``20:00``, ``tomorrow 09:00``, ``mon 09:00``, ISO 8601;
    for a bound in the past (``past=True``: ``--since``) also a duration, that long ago
    (``--since 1h``).  Microseconds since the epoch, as ``Usec`` (the client takes them as
    they are)."""

    name = "WHEN"

    def __init__(self, past: bool = False):
        self.past = past

    def convert(self, value, param, ctx):
        from resourced.client.bookings import instant
        from resourced.errors import InvalidArgs
        from resourced.protocol.when import parse_duration

        if isinstance(value, int):
            return Usec(value)
        if self.past:
            with contextlib.suppress(ValueError):
                return Usec(now_usec() - usec_of_seconds(parse_duration(value)))
        try:
            return Usec(instant("time", value))
        except InvalidArgs as exc:
            self.fail(exc.message.removeprefix("time: "), param, ctx)


def booking_options(fn):
    """What a booking asks for: shared by book, edit and slots."""
    options = [
        click.option("--gpus", "-G", type=click.IntRange(1, 2**32 - 1),
                     help="Whole GPUs (default 1 when nothing else is asked for)."),
        click.option("--gpu", "named", type=GpuList(),
                     help="These GPUs, whole (alias, index or UUID; comma-separated)."),
        click.option("--exclude", type=GpuList(), help="Never these GPUs."),
        click.option("--vram", type=Memory(), help="A share of one GPU's memory, e.g. 24G."),
        click.option("--ram", type=Memory(), help="Host RAM from the ram pool, e.g. 4G."),
        click.option("--cpu", type=Count(), help="CPU cores from the cpu pool."),
        click.option("--pool", "pools", type=PoolAmount(), multiple=True,
                     help="An amount of a named pool, NAME=AMOUNT (repeatable)."),
        click.option("--exclusive", is_flag=True, default=None,
                     help="With --vram: the GPU whole, nobody else on it."),
        click.option("--label", default=None, help="A short label shown in listings."),
        click.option("--task-name", default=None, help="What the booking is for."),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def _request(gpus, named, exclude, vram, ram, cpu, pools, exclusive, label, task_name,
             default_gpu: bool) -> dict:
    """Client keyword arguments for what was given (None: not given)."""
    names = [name for name, _ in pools]
    if len(set(names)) != len(names):
        raise click.UsageError("give each --pool once, with the whole amount")
    gpus = named_gpu_count(gpus, named, vram)
    nothing = gpus is None and not named and vram is None and ram is None and cpu is None \
        and not pools
    if nothing and default_gpu:
        gpus = 1
    request = dict(gpus=gpus, gpu_names=list(named) if named else None,
                   exclude=list(exclude) if exclude else None, vram=vram, ram=ram, cpu=cpu,
                   pools=dict(pools) if pools else None, exclusive=exclusive, label=label,
                   task_name=task_name)
    return {k: v for k, v in request.items() if v is not None}


@click.command(cls=CommandAfterDashes)
@booking_options
@click.option("--for", "-t", "duration", type=Duration(),
              help="How long: 30m, 2h, 1d2h, 2:00:00 (or the second word of COUNT DURATION).")
@click.option("--at", "start", type=When(),
              help="Exactly when (else the earliest start that fits): +30m, 20:00, "
              "tomorrow 09:00, an ISO time (local unless it has a zone).")
@click.option("--op-id", default=None, metavar="ID",
              help="Retry-safe: the same request with the same id answers the first result.")
@click.option("--isolate", is_flag=True, default=None,
              help="Run its COMMAND where it can open the booked GPUs and no others (a "
              "systemd scope; the system service, [daemon] isolation).")
@session_option
@dry_run_option
@bus_option
@json_option
@click.argument("command", nargs=-1, metavar="[COUNT] [DURATION] [-- COMMAND [ARGS]...]")
def book(gpus, named, exclude, vram, ram, cpu, pools, exclusive, label, task_name, duration,
         start, op_id, isolate, session, dry_run, bus, as_json, command):
    """Book GPUs and/or pool amounts for a time window, all or nothing over all of it.

    With --at it is placed exactly then or refused (exit 3, naming the nearest start that
    fits); without, it takes the earliest start that fits from now. Prints the reference;
    with --json an object with status (created, queued: it starts later than now,
    exists: an --op-id replayed, or dry-run) and the booking.

    After -- a COMMAND is kept for you alone (a job file in your state directory, never
    sent to the daemon), and your runner (gpuctl runner, or the resourced-runner user
    unit) starts it at the booking's start on its GPUs and stops it at the end; gpuctl
    bookings shows its state, gpuctl logs REF its output.

    COUNT and DURATION may come first, as GPUBK takes them: gpuctl book 2 30m is
    gpuctl book --gpus 2 --for 30m.

    Example: gpuctl book --gpus 1 --for 2h --at 20:00 --ram 4G -- python train.py
    """

    form = "gpuctl book [COUNT] [DURATION] [OPTIONS] -- COMMAND [ARGS]..."
    words, command = split_at_dashes(command)
    given_gpus, duration = _count_and_duration(words, gpus, duration, form)
    gpus = gpus if given_gpus is None else given_gpus
    request = _request(gpus, named, exclude, vram, ram, cpu, pools, exclusive, label,
                       task_name, default_gpu=True)
    if op_id is not None:
        request["op_id"] = op_id
    if isolate:
        request["isolate"] = True
    now = now_usec()
    with client(bus) as c:
        result = c.book(duration, start=start, dry_run=dry_run, session=session, **request)
        if command and not dry_run:
            result["booking"] = _keep_command(c, result["booking"], list(command))
    booking = result["booking"]
    # (a booking asked for now starts at the next whole second: that is not a queue)
    if result["status"] == "created" and start is None and \
            booking["start_usec"] > whole_second(now):
        result["status"] = "queued"
    if as_json:
        emit_json({"schema": JSON_SCHEMA, **result, "booking": with_times(booking)})
        return
    if not dry_run:
        click.echo(booking["id"])
    where = ", ".join(f"gpu{i}" for i in booking["gpu_indices"]) or "pools"
    span = f"{_when(booking['start_usec'])} to {_when(booking['end_usec'])}"
    said = {"created": "booked", "queued": "queued to start at the earliest fit:",
            "exists": "already booked (same --op-id):",
            "dry-run": "would book (nothing booked):"}[result["status"]]
    click.echo(f"gpuctl: {said} {where}, {span}", err=True)
    if command and dry_run:
        click.echo("gpuctl: the command would be kept for your runner (nothing kept)", err=True)


def _count_and_duration(words: tuple, gpus, duration, form: str) -> tuple:
    """GPUBK's positional ``COUNT DURATION`` (either may be left out, in that order): the
    count of GPUs (None: not given) and the duration; any other word is refused as stray."""
    count = None
    rest = list(words)
    if rest and rest[0].isascii() and rest[0].isdigit():
        if gpus is not None:
            raise click.UsageError(f"the count {rest[0]} and --gpus {gpus} both say how many "
                                   "GPUs: give one")
        count = int(rest.pop(0))
        if count < 1:
            raise click.BadParameter("must be at least 1", param_hint="COUNT")
    if rest:
        try:
            length = Duration().convert(rest[0], None, None)
        except click.BadParameter as exc:
            if len(rest) == 1 and any(c.isdigit() for c in rest[0]):
                raise click.BadParameter(exc.message, param_hint="DURATION") from None
            length = None
        if length is not None:
            if duration is not None:
                raise click.UsageError(f"{rest[0]} and --for both say how long: give one")
            duration = length
            rest.pop(0)
    if rest:
        raise stray_word(rest[0], form)
    if duration is None:
        raise click.UsageError(f"how long? --for 2h, or the DURATION word: {form}")
    return count, duration


def _say_grace(booking: dict) -> None:
    """Where the runner's grace is cut to a quarter of this booking, say so at once."""
    from resourced.exits import GpuctlError
    from resourced.protocol.when import format_span
    from resourced.runner.jobs import grace_for
    from resourced.runner.service import configured_grace

    try:
        grace = usec_of_seconds(configured_grace())
    except GpuctlError:  # the runner will say what is wrong with the file
        return
    capped = grace_for(booking, grace)
    if capped < grace:
        click.echo(f"gpuctl: the runner's grace ({format_span(seconds_of_usec(grace))}) is "
                   f"more than a quarter of this booking: its command gets SIGTERM "
                   f"{format_span(seconds_of_usec(capped))} before the end", err=True)


def _keep_command(c, booking: dict, command: list[str]) -> dict:
    """Write the booking's job file (private: the owner's state directory), report the job
    pending, and warn when no runner is there to start it; the booking's record then."""
    import os

    from resourced.errors import ResourcedError
    from resourced.exits import GpuctlError
    from resourced.runner.jobs import (
        JobError,
        create,
        ensure_dir,
        jobs_dir,
        load,
        new_job,
        runner_is_running,
    )

    ref = booking["id"]
    directory = jobs_dir()
    try:
        ensure_dir(directory)
        if load(directory, ref) is not None:  # an --op-id replayed: the first call's stays
            return booking
        create(directory, new_job(ref, command, os.getcwd(), os.environ, c.bus, now_usec(),
                                  c.instance()))
    except (JobError, OSError) as exc:
        raise GpuctlError(f"booked {ref}, but cannot keep its command: {exc}; cancel it "
                          f"(gpuctl cancel {ref}) or book again") from None
    try:
        booking = c.report_job(ref, "pending")
    except ResourcedError as exc:  # the runner reports it when it sees the job
        click.echo(f"gpuctl: warning: cannot report the job as pending: {exc}", err=True)
    _say_grace(booking)
    if not runner_is_running(directory, c.bus):
        click.echo(f"gpuctl: warning: no runner is running for the {c.bus} bus to start the "
                   f"command: run `gpuctl runner --bus {c.bus}`, or enable it: "
                   "systemctl --user enable --now resourced-runner.service", err=True)
    return booking


@click.command()
@click.argument("refs", nargs=-1, metavar="[REF]...")
@click.option("--all", "all_users", is_flag=True, help="Everyone's, not only mine.")
@click.option("--since", type=When(past=True),
              help="Also those that ended since then, or this long ago (default: 24h).")
@bus_option
@json_option
def bookings(refs, all_users, since, bus, as_json):
    """List bookings: active and future ones, and those ended lately with how they ended;
    with REF, that booking alone (anyone's), as book shows it.

    The table shows the first 50 by start; --json lists them all.

    Example: gpuctl bookings --all --since yesterday

    Example: gpuctl bookings b3x9k2q
    """
    if refs:
        if all_users or since is not None:
            raise click.UsageError("REF names the booking: --all and --since do not apply")
        with client(bus) as c:
            for_each_ref(refs, lambda ref: _show_one(c.booking(ref), as_json), as_json)
        return
    with client(bus) as c:
        if as_json:  # the daemon's text is what --json prints: passed on unread
            emit_json(c.bookings_json(all_users=all_users, since=since, until=None, offset=0,
                                      limit=None))
            return
        found = c.bookings(all_users=all_users, since=since, limit=MAX_ROWS + 1)
        units = {p["name"]: p["unit"] for p in c.status()["pools"]} \
            if any(b["pools"] for b in found) else {}
    if not found:
        click.echo("no bookings" + ("" if all_users else " of yours (--all shows everyone's)"))
        return
    jobs = any(b.get("job") for b in found[:MAX_ROWS])
    rows = [("REF", "USER", "STATE", "FROM", "TO", "GPUS", "WANTS", *(("JOB",) if jobs else ()),
             "NOTE")]
    for b in found[:MAX_ROWS]:
        rows.append((b["id"], b["user"], b["state"], _when(b["start_usec"]), _when(b["end_usec"]),
                     ",".join(f"gpu{i}" for i in b["gpu_indices"]) or "-", _wants(b, units),
                     *((_job(b),) if jobs else ()), _note(b)))
    lines = table(rows)
    if len(found) > MAX_ROWS:
        lines.append(f"... and more after {_when(found[MAX_ROWS]['start_usec'])} "
                     "(--json lists them all)")
    echo_table("\n".join(lines))


@click.command()
@click.argument("ref")
@booking_options
@click.option("--at", "start", type=When(), help="A new start (exactly then).")
@click.option("--earliest", is_flag=True, help="Move it to the earliest start that fits.")
@click.option("--for", "-t", "duration", type=Duration(), help="A new duration.")
@click.option("--until", type=When(), help="A new end.")
@click.option("--op-id", default=None, metavar="ID", help="Retry-safe: a replay changes nothing.")
@dry_run_option
@bus_option
@json_option
def edit(ref, gpus, named, exclude, vram, ram, cpu, pools, exclusive, label, task_name, start,
         earliest, duration, until, op_id, dry_run, bus, as_json):
    """Change a booking that has not started; what is not given stays as it is.

    It is admitted again against the calendar without itself (exit 3 if it no longer
    fits). After the start only the end may change: see gpuctl extend.

    Example: gpuctl edit b3x9k2q --at 21:00 --for 3h
    """
    if duration is not None and until is not None:
        raise click.UsageError("use --for or --until, not both")
    if start is not None and earliest:
        raise click.UsageError("use --at or --earliest, not both")
    if until is not None and earliest:
        raise click.UsageError("--earliest moves the start: give the length with --for, "
                               "not an end with --until")
    changes = _request(gpus, named, exclude, vram, ram, cpu, pools, exclusive, label,
                       task_name, default_gpu=False)
    with client(bus) as c:
        if until is not None:
            begins = start if start is not None else c.booking(ref)["start_usec"]
            if until <= begins:
                raise click.UsageError("--until must be after the start")
            duration = Usec(until - begins)
        if duration is not None:
            changes["duration"] = duration
        if start is not None:
            changes["start"] = start
        if earliest:
            changes["earliest"] = True
        if op_id is not None:
            changes["op_id"] = op_id
        if not changes:
            raise click.UsageError("nothing to change: give --at, --for, --gpus, ...")
        booking = c.edit(ref, **changes, dry_run=dry_run)
    _show_one(booking, as_json, dry_run, status="changed")


@click.command()
@click.argument("ref")
@click.option("--by", type=Duration(), help="Add this much to its end.")
@click.option("--until", type=When(), help="End then instead (earlier shrinks it, not before now).")
@click.option("--op-id", default="", metavar="ID", help="Retry-safe: a replay changes nothing.")
@dry_run_option
@bus_option
@json_option
def extend(ref, by, until, op_id, dry_run, bus, as_json):
    """Move a booking's end: later (admitted on the added part only) or earlier (what is
    given back is free at once).

    Example: gpuctl extend b3x9k2q --by 1h
    """
    if (by is None) == (until is None):
        raise click.UsageError("give exactly one of --by or --until")
    with client(bus) as c:
        booking = c.extend(ref, by=by, until=until, op_id=op_id, dry_run=dry_run)
    _show_one(booking, as_json, dry_run, status="changed")


@click.command()
@click.argument("refs", nargs=-1, required=True, metavar="REF...")
@click.option("--reason", default="", help="Why (needed for someone else's booking).")
@click.option("--op-id", default="", metavar="ID", help="Retry-safe: a replay changes nothing.")
@dry_run_option
@bus_option
@json_option
def cancel(refs, reason, op_id, dry_run, bus, as_json):
    """Cancel bookings (an active one gives its GPUs back at once).

    Someone else's booking needs the administrators' polkit action and a --reason, which
    its owner then sees. With several REFs each is cancelled in turn; one refused is said
    and the rest still go (--json: a line each).

    Example: gpuctl cancel b3x9k2q
    """
    from resourced.client.bookings import cancelled_already

    if op_id and len(refs) > 1:
        raise click.UsageError("--op-id names one change: cancel one REF with it")

    def one(ref):
        asked = now_usec()
        booking = c.cancel(ref, reason, op_id=op_id, dry_run=dry_run)
        again = cancelled_already(booking, asked)
        if again:
            click.echo(f"gpuctl: {ref} was cancelled already, {_when(booking['ended_usec'])} "
                       "(nothing changed)", err=True)
        _show_one(booking, as_json, dry_run, status="unchanged" if again else "changed")

    with client(bus) as c:
        for_each_ref(refs, one, as_json)


@click.command()
@booking_options
@click.option("--for", "-t", "duration", type=Duration(), required=True, help="How long.")
@click.option("--after", "start", type=When(), help="Not before then (default: now).")
@click.option("--count", type=click.IntRange(1, 20), default=3, show_default=True,
              help="How many places to show.")
@bus_option
@json_option
def slots(gpus, named, exclude, vram, ram, cpu, pools, exclusive, label, task_name, duration,
          start, count, bus, as_json):
    """Show the earliest places where a booking would fit, with a command to book each
    (nothing is booked).

    Example: gpuctl slots --gpus 2 --for 4h
    """
    import shlex
    import sys

    request = _request(gpus, named, exclude, vram, ram, cpu, pools, exclusive, label,
                       task_name, default_gpu=True)
    with client(bus) as c:
        found = c.slots(duration, count=count, start=start, **request)
    if as_json:
        emit_json([with_times(s) for s in found])
        return
    if not found:
        click.echo("it fits nowhere within the booking horizon")
        return

    asked = _without(sys.argv[sys.argv.index("slots") + 1:], ("--after", "--count"))
    soon = now_usec() + SLOT_NOW_USEC
    for s in found:
        # A slot that starts now is booked "now": its instant is past by the time it is pasted.
        at = "now" if s["start_usec"] <= soon else iso_utc(s["start_usec"])
        command = ["gpuctl", "book", *asked, "--at", at]
        click.echo(f"{_when(s['start_usec'])} to {_when(s['end_usec'])} on "
                   f"{', '.join(f'gpu{i}' for i in s['gpu_indices']) or 'the pools'}:  "
                   f"{shlex.join(command)}")


@click.group()
def blackout():
    """Block windows for maintenance: nothing new is booked in them.

    Example: gpuctl blackout list
    """


@blackout.command("add")
@click.option("--from", "start", type=When(), required=True, help="When it begins.")
@click.option("--until", type=When(), required=True, help="When it ends.")
@click.option("--reason", required=True, help="Shown to everyone it affects.")
@bus_option
@json_option
def blackout_add(start, until, reason, bus, as_json):
    """Add a blackout (administrators): bookings already in it stay, and their owners are
    told.

    Example: gpuctl blackout add --from "tomorrow 18:00" --until "tomorrow 20:00" --reason "driver update"
    """
    if until <= start:
        raise click.UsageError("--until must be after --from")
    with client(bus) as c:
        result = c.add_blackout(start, until, reason)
    if as_json:
        emit_json({"schema": JSON_SCHEMA, **result})
        return
    click.echo(result["id"])
    if result["bookings_inside"]:
        click.echo(f"gpuctl: bookings already in it (kept, owners told): "
                   f"{', '.join(result['bookings_inside'])}", err=True)


@blackout.command("list")
@bus_option
@json_option
def blackout_list(bus, as_json):
    """List the blackouts.

    Example: gpuctl blackout list --json
    """
    with client(bus) as c:
        found = c.blackouts()
    if as_json:
        emit_json([with_times(b) for b in found])
    elif not found:
        click.echo("no blackouts")
    else:
        rows = [("ID", "FROM", "TO", "REASON")]
        rows += [(b["id"], _when(b["start_usec"]), _when(b["end_usec"]), b["reason"]) for b in found]
        click.echo("\n".join(table(rows)))


@blackout.command("remove")
@click.argument("blackout_id", metavar="ID")
@bus_option
def blackout_remove(blackout_id, bus):
    """Remove a blackout (administrators).

    Example: gpuctl blackout remove x4k2m9a
    """
    with client(bus) as c:
        c.remove_blackout(blackout_id)


@click.group()
def notice():
    """Messages for everyone, shown by gpuctl status and as desktop notifications.

    Example: gpuctl notice list
    """


@notice.command("add")
@click.argument("text")
@click.option("--until", type=When(), help="Show it until then (default: until removed).")
@bus_option
@json_option
def notice_add(text, until, bus, as_json):
    """Add a notice (administrators).

    Example: gpuctl notice add "GPU 3 is being replaced on Friday" --until "fri 18:00"
    """
    with client(bus) as c:
        notice_id = c.add_notice(text, until)
    if as_json:
        emit_json({"schema": JSON_SCHEMA, "id": notice_id})
    else:
        click.echo(notice_id)


@notice.command("list")
@bus_option
@json_option
def notice_list(bus, as_json):
    """List the notices in force.

    Example: gpuctl notice list --json
    """
    with client(bus) as c:
        found = c.notices()
    if as_json:
        emit_json(found)
    elif not found:
        click.echo("no notices")
    else:
        rows = [("ID", "UNTIL", "TEXT")]
        rows += [(n["id"], _when(n["until_usec"]) if n["until_usec"] else "removed", n["text"])
                 for n in found]
        click.echo("\n".join(table(rows)))


@notice.command("remove")
@click.argument("notice_id", metavar="ID")
@bus_option
def notice_remove(notice_id, bus):
    """Remove a notice (administrators).

    Example: gpuctl notice remove n7c2p0q
    """
    with client(bus) as c:
        c.remove_notice(notice_id)


@click.command()
@window_options(low=1800, text="How far ahead to draw")
@click.option("--width", type=click.IntRange(40, 1000), default=None,
              help="Columns (default: the terminal's, at most 100 when not a terminal).")
@bus_option
@json_option
def timeline(span, hours, width, bus, as_json):
    """Draw GPUs (rows) against time (columns): who holds what, now marked.

    Example: gpuctl timeline --span 1d
    """
    import shutil

    from resourced.tui.timeline import render_timeline

    hours = window_hours(span, hours, low=1800)
    now = now_usec()
    end = now + int(hours * HOUR)
    with client(bus) as c:
        state = c.status()
        found = c.bookings(all_users=True, since=Usec(now), until=Usec(end))
    entries = [{"id": cl["id"], "user": cl["user"], "gpus": cl["gpu_uuids"],
                "start_usec": cl["created_usec"], "end_usec": cl["until_usec"],
                "kind": "slurm job" if cl["mode"] == "slurm" else "claim",
                "shared": bool(cl["vram_bytes"])}
               for cl in state["claims"] if cl["state"] == "granted" and cl["mode"] != "booking"]
    entries += [{"id": b["id"], "user": b["user"], "gpus": b["gpu_uuids"],
                 "start_usec": b["start_usec"], "end_usec": b["end_usec"], "kind": "booking",
                 "shared": b["shared"]} for b in found if b["state"] != "ended"]
    if as_json:
        alias = {g["uuid"]: g["alias"] for g in state["gpus"]}
        emit_json({"schema": JSON_SCHEMA, "now_usec": now, "until_usec": end,
                   "gpus": state["gpus"],  # (as status: an entry's gpus are aliases, as a claim's)
                   "entries": [{**e, "gpus": [alias.get(u, u) for u in e["gpus"]],
                                "gpu_uuids": e["gpus"]} for e in entries]})
        return
    gpus = [{"index": g["index"], "uuid": g["uuid"], "label": g["alias"]} for g in state["gpus"]]
    columns = width or min(shutil.get_terminal_size((100, 24)).columns, 200)
    click.echo(render_timeline(gpus, entries, now, hours, local_now(now).tzinfo, columns))


# -- shown -------------------------------------------------------------------------------
def _show_one(booking: dict, as_json: bool, dry_run: bool = False,
              status: str | None = None) -> None:
    """One booking: with --json, a read answers its record (as an item of bookings --json)
    and a change answers as book does, {status, booking}: changed, unchanged (a cancel
    its owner repeated) or dry-run."""
    if as_json:
        if status is None:
            emit_json({"schema": JSON_SCHEMA, **with_times(booking)})
        else:
            emit_json({"schema": JSON_SCHEMA, "status": "dry-run" if dry_run else status,
                       "booking": with_times(booking)})
        return
    where = ", ".join(f"gpu{i}" for i in booking["gpu_indices"]) or "pools"
    state = booking["state"] if booking["state"] != "ended" else booking["ended"]
    would = "would be (nothing changed): " if dry_run else ""
    click.echo(f"{booking['id']}: {would}{state}, {where}, {_when(booking['start_usec'])} to "
               f"{_when(booking['end_usec'])}")


def _when(usec: int) -> str:
    return local_text(usec)


def _wants(b: dict, units: dict[str, str]) -> str:
    """What a booking asks for, amounts as a person reads them (``ram 4G``, not bytes)."""
    from resourced.protocol.amounts import format_bytes

    parts = [f"{b['gpus_requested']} GPU(s)"] if b["gpus_requested"] else []
    if b["vram_bytes"]:
        parts.append(f"VRAM {format_bytes(b['vram_bytes'])}" + (" excl." if b["exclusive"] else ""))
    parts += [f"{name} {in_units(amount, units.get(name, 'count'))}"
              for name, amount in b["pools"].items()]
    return ", ".join(parts)


def _job(b: dict) -> str:
    """The state of the booking's command (its exit code when it failed); - for none."""
    job = b.get("job") or "-"
    return f"{job} ({b['job_exit']})" if job == "failed" and b.get("job_exit", -1) >= 0 else job


def _note(b: dict) -> str:
    if b["state"] == "ended":
        how = "released as a no-show" if b["ended"] == "no-show" else b["ended"]
        if b["reason"]:
            from resourced.linux.users import user_name

            # -1: the daemon; an account by its name, as everywhere else a person is shown
            by = f" by {user_name(b['ended_by'])}" if b["ended_by"] >= 0 else ""
            how += f"{by}: {b['reason']}"
        return how
    if b["state"] == "active" and b["claim_state"] == "queued":
        holders = ", ".join(b["waiting_for"]) or "a claim granted before it"
        return f"WAITING for {holders} to give its GPUs back (gpuctl verify)"
    return b["label"] or b["task_name"]


def _without(args: list[str], options: tuple[str, ...]) -> list[str]:
    """``args`` less the given options and their values."""
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
            continue
        name = a.split("=", 1)[0]
        if name in options:
            skip = "=" not in a
            continue
        out.append(a)
    return out
