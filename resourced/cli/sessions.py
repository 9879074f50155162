"""gpuctl sessions, stop: agent sessions, and the switch that stops one at once.

A session groups the claims and bookings of one agent and its sub-agents: the name given
with ``--session`` or ``$RESOURCED_SESSION`` (inherited by sub-processes), else the Unix
session of the owner process (``sid:N``: one terminal, one agent).
"""

import click

from resourced.protocol.names import JSON_SCHEMA

from ._options import bus_option, client, dry_run_option, echo_table, emit_json, json_option
from .status import table


@click.command()
@click.option("--all", "all_users", is_flag=True, help="Everyone's sessions, not only mine.")
@bus_option
@json_option
def sessions(all_users, bus, as_json):
    """List agent sessions and what each holds: claims, GPUs, waiting claims, bookings.

    Example: gpuctl sessions --all --json
    """
    import os

    with client(bus) as c:
        state = c.status()
        booked = c.bookings(all_users=all_users)
    me = os.getuid()
    found = session_list([c for c in state["claims"] if all_users or c["uid"] == me],
                         [b for b in booked if b["state"] != "ended"])
    if as_json:
        emit_json(found)
        return
    if not found:
        click.echo("no sessions hold anything" + ("" if all_users else " of yours (--all: everyone's)"))
        return
    rows = [("SESSION", "USER", "CLAIMS", "WAITING", "GPUS", "BOOKINGS")]
    for s in found:
        rows.append((s["session"] or "-", s["user"], len(s["claims"]), s["waiting"],
                     ",".join(s["gpus"]) or "-", len(s["bookings"])))
    echo_table("\n".join(table(rows)))


def session_list(claims: list[dict], bookings: list[dict]) -> list[dict]:
    """Claims (``status()`` records) and live bookings grouped by (user, session): what
    each session holds, by user then session name."""
    found: dict[tuple, dict] = {}

    def entry(item: dict) -> dict:
        key = (item["uid"], item.get("session", ""))
        return found.setdefault(key, {"session": key[1], "user": item["user"], "uid": key[0],
                                      "claims": [], "waiting": 0, "gpus": [], "bookings": []})

    for c in claims:
        s = entry(c)
        s["gpus"] += c["gpus"]
        if c["mode"] == "booking":
            continue  # an active booking's claim: listed as its booking
        s["claims"].append(c["id"])
        s["waiting"] += c["state"] == "queued"
    for b in bookings:
        entry(b)["bookings"].append(b["id"])
    return sorted(found.values(), key=lambda s: (s["user"], s["session"]))


@click.command()
@click.option("--session", metavar="NAME",
              help="The session to stop (see gpuctl sessions); with --user, that user's.")
@click.option("--user", metavar="USER",
              help="All of a user's sessions (or, with --session, one): another user's needs "
              "the administrators' manage right and --reason.")
@click.option("--reason", default="", help="Why: the owner and the daemon's log see it.")
@dry_run_option
@bus_option
@json_option
def stop(session, user, reason, dry_run, bus, as_json):
    """The stop switch: end every claim and booking of a session at once.

    Commands that `gpuctl run` started on those claims get the reclaim signal (SIGUSR1 by
    default) first, then SIGTERM and SIGKILL 10 s apart; the claims are released at
    once, whatever still runs, and the bookings cancelled. --dry-run lists what it would
    stop.

    Example: gpuctl stop --session refactor-agents --dry-run
    """
    if session is None and user is None:
        raise click.UsageError("name what to stop: --session NAME (see gpuctl sessions), "
                               "or --user USER for all of a user's sessions")
    uid = None if user is None else uid_of(user)
    with client(bus) as c:
        stopped = c.stop(session=session, uid=uid, reason=reason, dry_run=dry_run)
    if session is not None and not stopped["claims"] and not stopped["bookings"]:
        _no_such_session(session, uid, bus)
    if as_json:
        emit_json({"schema": JSON_SCHEMA, "dry_run": dry_run, **stopped})
        return
    what = f"session {session}" if session else f"{user}'s sessions"
    if not stopped["claims"] and not stopped["bookings"]:
        click.echo(f"gpuctl: {what}: nothing to stop", err=True)
        return
    verb = "would stop" if dry_run else "stopped"
    parts = [f"{len(ids)} {kind}(s): {', '.join(ids)}"
             for kind, ids in (("claim", stopped["claims"]), ("booking", stopped["bookings"]))
             if ids]
    click.echo(f"gpuctl: {what}: {verb} {'; '.join(parts)}"
               f"{' (dry run: nothing changed)' if dry_run else ''}", err=True)


def _no_such_session(session: str, uid: int | None, bus: str | None) -> None:
    """A session name that holds nothing is most often a typo: refused (exit 6), naming
    the sessions that hold something; another user's session of that name is not yours
    (exit 7), and the message says whose it is and what stopping it takes."""
    import os

    from resourced.exits import EXIT_NO_SUCH_CLAIM, EXIT_NOT_YOURS, GpuctlError

    mine = uid is None
    uid = os.getuid() if uid is None else uid
    with client(bus) as c:
        state = c.status()
        booked = c.bookings(all_users=True)
    live = session_list(state["claims"], [b for b in booked if b["state"] != "ended"])
    others = [s for s in live if s["session"] == session and s["uid"] != uid]
    if mine and others:
        held = "; ".join(f"{s['user']}'s ({len(s['claims'])} claim(s), "
                         f"{len(s['bookings'])} booking(s))" for s in others)
        raise GpuctlError(
            f"session {session!r} is {held}, not yours: stopping another user's session "
            f"needs the administrators' manage right (gpuctl stop --session {session} "
            f"--user {others[0]['user']} --reason WHY)", EXIT_NOT_YOURS)
    names = [s["session"] for s in live if s["uid"] == uid and s["session"]]
    listed = ", ".join(names) if names else "none holds anything now"
    raise GpuctlError(f"no session {session!r} holds anything (sessions: {listed}; "
                      "gpuctl sessions)", EXIT_NO_SUCH_CLAIM)


def uid_of(user: str) -> int:
    """A user's uid from a name or a number (gpuctl stop and usage take either)."""
    import pwd

    if user.isdigit():
        return int(user)
    try:
        return pwd.getpwnam(user).pw_uid
    except KeyError:
        raise click.BadParameter(f"no user {user!r}", param_hint="--user") from None
