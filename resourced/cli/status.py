"""gpuctl status and free: who holds what, and how much is left."""

import click

from resourced.protocol.names import JSON_SCHEMA
from resourced.protocol.time import USEC, local_text, now_usec, wall_clock

from ._options import bus_option, client, echo_table, emit_json, json_option

MAX_HOLDERS = 5
"""Holders a pool row of the status names; the rest are counted (--json lists all)."""
MAX_WAITERS = 20
"""Waiters the status shows; the rest are counted (gpuctl queue lists all)."""


def _age(created_usec: int, now: int) -> str:
    seconds = max(0, (now - created_usec) // USEC)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def _owner(c: dict) -> str:
    if c["mode"] == "booking":
        return "booking"
    return f"{c['owner_pid']} ({'alive' if c['owner_alive'] else 'DEAD'})"


def _mode(c: dict) -> str:
    return c["mode"] + (" isolated" if c.get("isolated") else "")


def render_status(data: dict, now: int) -> str:
    """The status table, from the same data ``--json`` prints (``now`` in microseconds)."""
    claims = {c["id"]: c for c in data["claims"]}
    rows = [("GPU", "NAME", "STATE", "CLAIM", "MODE", "USER", "AGE", "OWNER", "TASK", "LABEL")]
    for g in data["gpus"]:
        c = claims.get(g["claim"])
        if c is None:
            rows.append((g["alias"], g["name"], g["state"], "-", "", "", "", "", "", ""))
            continue
        owner = _owner(c)
        rows.append((g["alias"], g["name"], g["state"], c["id"], _mode(c), c["user"],
                     _age(c["created_usec"], now), owner, c["task_name"], c["label"]))
    for g in data["gpus"]:
        for ref in g["shared_by"]:
            c = claims[ref]
            owner = _owner(c)
            rows.append((g["alias"], f"VRAM {_bytes(c['vram_bytes'])}", "shared", c["id"], _mode(c),
                         c["user"], _age(c["created_usec"], now), owner, c["task_name"],
                         c["label"]))
    lines = table(rows)
    total = len(data["gpus"])
    lines.append(f"{data['free']} of {total} GPU(s) free ({data['backend']} backend)")
    if busy := [g["alias"] for g in data["gpus"] if g["state"] == "busy"]:
        lines.append(f"busy: {', '.join(busy)}: processes nobody claimed run there "
                     "(gpuctl verify names them)")
    if data.get("backend_note"):
        lines.append(f"note: {data['backend_note']}")
    ending = [c for c in data["claims"] if c.get("until_usec") and c["state"] == "granted"]
    for c in sorted(ending, key=lambda c: c["until_usec"]):
        why = f"booking {c['until_booking']} starts" if c["until_booking"] else "it ends"
        lines.append(f"{c['id']} holds until {local_text(c['until_usec'], now)} "
                     f"({why})")
    if data.get("bookings_scheduled"):
        lines.append(f"{data['bookings_scheduled']} booking(s) ahead (gpuctl bookings --all, "
                     "gpuctl timeline)")
    for n in data.get("notices", []):
        lines.append(f"NOTICE: {n['text']}")
    units = {p["name"]: p["unit"] for p in data["pools"]}
    pool_rows = [("POOL", "CAPACITY", "USED", "FREE", "HELD BY")]
    for p in data["pools"]:
        holders = [f"{c['id']} ({c['user']}: {in_units(c['pools'][p['name']], p['unit'])})"
                   for c in data["claims"] if c["state"] == "granted" and p["name"] in c["pools"]]
        shown = ", ".join(holders[:MAX_HOLDERS]) or "-"
        if len(holders) > MAX_HOLDERS:
            shown += f" and {len(holders) - MAX_HOLDERS} more"
        pool_rows.append((p["name"], in_units(p["capacity"], p["unit"]),
                          in_units(p["capacity"] - p["free"], p["unit"]),
                          in_units(p["free"], p["unit"]), shown))
    lines += ["", *table(pool_rows)]
    if data["queue"]:
        lines += ["", *render_queue(data, now, units, most=MAX_WAITERS)]
        if len(data["queue"]) > MAX_WAITERS:
            lines.append(f"... and {len(data['queue']) - MAX_WAITERS} more waiting "
                         "(gpuctl queue lists them all)")
    return "\n".join(lines)


def table(rows) -> list[str]:
    """Rows as aligned columns, by the width a terminal gives each text (a CJK character
    or an emoji takes two cells, a combining mark none)."""
    widths = [max(cells(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(str(v) + " " * (w - cells(str(v))) for v, w in zip(r, widths)).rstrip()
            for r in rows]


def cells(text: str) -> int:
    """How many terminal cells ``text`` takes."""
    if text.isascii():
        return len(text)
    import unicodedata

    return sum(0 if unicodedata.combining(ch) else
               2 if unicodedata.east_asian_width(ch) in "WF" else 1 for ch in text)


def _bytes(n: int) -> str:
    from resourced.protocol.amounts import format_bytes

    return format_bytes(n)


def in_units(amount: int, unit: str) -> str:
    return _bytes(amount) if unit == "bytes" else str(amount)


def wanted(c: dict, units: dict[str, str]) -> str:
    """What a claim asks for, in words: ``2 GPU(s), ram 32G``."""
    parts = [f"{c['gpus_requested']} GPU(s)"] if c["gpus_requested"] else []
    if c["vram_bytes"]:
        parts.append(f"VRAM {_bytes(c['vram_bytes'])}")
    parts += [f"{name} {in_units(amount, units.get(name, 'count'))}" for name, amount in c["pools"].items()]
    return ", ".join(parts)


def render_queue(data: dict, now: int, units: dict[str, str],
                 most: int | None = None) -> list[str]:
    """The queue as a table: every waiter, or the first ``most``."""
    claims = {c["id"]: c for c in data["claims"]}
    rows = [("#", "CLAIM", "PRIORITY", "USER", "WAITING", "WANTS", "TASK", "LABEL")]
    for rank, ref in enumerate(data["queue"][:most], 1):
        c = claims[ref]
        rows.append((rank, ref, c["priority"], c["user"], _age(c["created_usec"], now),
                     wanted(c, units), c["task_name"], c["label"]))
    return table(rows)


@click.command()
@bus_option
@json_option
def status(bus, as_json):
    """Show each GPU and who holds it: claim, mode, user, age, owner pid and whether it lives.

    Example: gpuctl status --json
    """
    with client(bus) as c:
        text = c.status_json()
    if as_json:
        emit_json(text)
    else:
        import json

        echo_table(render_status(json.loads(text), now_usec()))


@click.command()
@bus_option
@json_option
def queue(bus, as_json):
    """List the waiting claims in the order they will be served, with what each wants.

    Higher priority first, first come first served among equals; a later claim starts
    earlier only with what no claim ahead of it can use.

    Example: gpuctl queue --json
    """
    with client(bus) as c:
        data = c.status()
    claims = {c["id"]: c for c in data["claims"]}
    waiting = [claims[ref] for ref in data["queue"]]
    if as_json:
        emit_json(waiting)
    elif not waiting:
        click.echo("nobody is waiting")
    else:
        units = {p["name"]: p["unit"] for p in data["pools"]}
        click.echo("\n".join(render_queue(data, wall_clock(), units)))


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
        emit_json({"schema": JSON_SCHEMA, "free": n})
    else:
        click.echo(n)


def render_verify(reports: list[dict]) -> str:
    lines = []
    for r in reports:
        isolated = ", isolated" if r.get("isolated") else ""
        claim = f" (claim {r['claim']}{isolated})" if r["claim"] else ""
        detail = f": {r['detail']}" if r["detail"] else ""
        lines.append(f"{r['alias'] or r['uuid']}  {r['status']}{claim}{detail}")
        for p in r["processes"]:
            whose = (f"claim {p['claim']}" if p["claim"] else
                     f"cannot be attributed: {p['ambiguous']}" if p["ambiguous"] else "no claim")
            where = f"  (in {p['container']})" if p.get("container") else ""
            lines.append(f"    pid {p['pid']}  {p['user'] or '?'}  {p['command'] or '?'}  "
                         f"[{whose}]{where}")
    return "\n".join(lines)


@click.command()
@bus_option
@json_option
def verify(bus, as_json):
    """Compare the claims with the processes really running on each GPU.

    Statuses: OK, IDLE CLAIM (claimed, nothing running), UNCLAIMED USE (a process on a
    GPU nobody claimed), FOREIGN PROCESS (a process on a claimed GPU that is not the
    claimant's), MISSING (the driver does not report the GPU), UNKNOWN (the driver did not
    answer). Exits 1 when any GPU is UNCLAIMED USE, FOREIGN PROCESS, MISSING or UNKNOWN.

    Example: gpuctl verify --json
    """
    from resourced.core.verify import PROBLEMS

    with client(bus) as c:
        reports = c.verify()
    problems = any(r["status"] in PROBLEMS for r in reports)
    if as_json:
        emit_json({"schema": JSON_SCHEMA, "gpus": reports, "problems": problems})
    else:
        echo_table(render_verify(reports))
    return 1 if problems else 0
