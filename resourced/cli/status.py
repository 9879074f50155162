"""gpuctl status and free: who holds what, and how much is left."""

import time

import click

from ._options import bus_option, client, emit_json, json_option


def _age(created_usec: int, now: float) -> str:
    seconds = max(0, int(now - created_usec / 1e6))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def render_status(data: dict, now: float) -> str:
    """The status table, from the same data ``--json`` prints."""
    claims = {c["id"]: c for c in data["claims"]}
    rows = [("GPU", "NAME", "STATE", "CLAIM", "MODE", "USER", "AGE", "OWNER", "TASK", "LABEL")]
    for g in data["gpus"]:
        c = claims.get(g["claim"])
        if c is None:
            rows.append((g["alias"], g["name"], g["state"], "-", "", "", "", "", "", ""))
            continue
        owner = f"{c['owner_pid']} ({'alive' if c['owner_alive'] else 'DEAD'})"
        rows.append((g["alias"], g["name"], g["state"], c["id"], c["mode"], c["user"],
                     _age(c["created_usec"], now), owner, c["task_name"], c["label"]))
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(str(v).ljust(w) for v, w in zip(r, widths)).rstrip() for r in rows]
    total = len(data["gpus"])
    lines.append(f"{data['free']} of {total} GPU(s) free ({data['backend']} backend)")
    if data.get("backend_note"):
        lines.append(f"note: {data['backend_note']}")
    return "\n".join(lines)


@click.command()
@bus_option
@json_option
def status(bus, as_json):
    """Show each GPU and who holds it: claim, mode, user, age, owner pid and whether it lives.

    Example: gpuctl status --json
    """
    with client(bus) as c:
        data = c.status()
    if as_json:
        emit_json(data)
    else:
        click.echo(render_status(data, time.time()))


@click.command()
@bus_option
@json_option
def free(bus, as_json):
    """Print how many GPUs are free.

    Example: [ "$(gpuctl free)" -ge 2 ] && gpuctl run --gpus 2 -- python train.py
    """
    with client(bus) as c:
        n = c.free()
    if as_json:
        emit_json({"free": n})
    else:
        click.echo(n)
