"""gpuctl doctor and gpuctl metrics: the administrator's view of the service."""

import click

from resourced.exits import EXIT_CHECK_FAILED
from resourced.protocol.names import JSON_SCHEMA

from ._options import bus_option, client, echo_table, emit_json, json_option

SHOWN = {"ok": "ok", "warn": "WARN", "fail": "FAIL", "skipped": "skipped"}


@click.command()
@bus_option
@click.option("--probe", is_flag=True,
              help="Also make and release a claim, and book and cancel a booking a week "
              "ahead, each timed (the only checks that change anything).")
@click.option("--strict", is_flag=True, help="A warning fails too (exit 13).")
@json_option
def doctor(bus, probe, strict, as_json):
    """Check that resourced works here: one line per check, with what to do.

    Checks, each with a stable id: the bus and the daemon that answers (bus, version),
    the service's unit, bus policy, activation and polkit files as `gpuctl service enable`
    wrote them (service), the configuration (config), the daemon's directories, GPU
    backend, GPUs and view of /proc (daemon.*), device nodes (devices), device isolation
    (isolation), Slurm's share of the GPUs (slurm), clock synchronisation (clock), and
    lingering for a user service (linger).  Read-only unless --probe.

    Exit 0 when no check failed (--strict: none warned either), 13 otherwise.

    Example: gpuctl doctor --probe
    """
    from resourced.client.doctor import run
    from resourced.core.diagnosis import passed

    checks = run(bus, probe)
    ok = passed(checks, strict)
    if as_json:
        emit_json({"schema": JSON_SCHEMA, "ok": ok, "strict": strict, "checks": checks,
                   "exit_code": 0 if ok else EXIT_CHECK_FAILED})
    else:
        width = max(len(c["id"]) for c in checks)
        lines = []
        for c in checks:
            lines.append(f"{SHOWN[c['status']]:<7}  {c['id']:<{width}}  {c['summary']}")
            if c["fix"] and c["status"] != "ok":
                lines.append(f"{'':<7}  {'':<{width}}  fix: {c['fix']}")
        echo_table("\n".join(lines))
    if not ok:
        raise click.exceptions.Exit(EXIT_CHECK_FAILED)


@click.command()
@bus_option
def metrics(bus):
    """Print the daemon's metrics in the Prometheus text format.

    GPUs by state, claims and GPUs held by user and mode, the queue, bookings, pools,
    health levels, GPU-hours held and used per user (a day and a week), bus calls by
    method and error, starts and memory.  For node_exporter's textfile collector, set
    [metrics] textfile in the configuration instead: the daemon keeps that file current.

    Example: gpuctl metrics | grep resourced_gpus
    """
    with client(bus) as c:
        click.echo(c.metrics(), nl=False)
