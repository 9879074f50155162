"""What a coding agent asks of the daemon, gathered once for ``gpuctl agent`` and for the MCP
server (``resourced-mcp``): the one-call context, a read-only placement, my claims and
bookings, and what I hold and have booked ahead, summed.

Each function takes an open ``resourced.client.sync.Client`` and returns plain JSON-ready data;
none of them changes anything.  Imports are made where they are used, so that loading this
module costs the CLI nothing it does not use.
"""

import os

from resourced.protocol.time import DAY, HOUR, Usec, iso_utc, seconds_of_usec, with_times

SCHEMA = 4
"""The version of ``agent context --json``: keys are added, never changed, within one.
2: ``next`` has the fixed keys ``one_gpu`` and ``all_gpus`` (1 named them by shape).
3: ``health.checks`` is a list of {name, level}, as in ``status --json`` (2: a dict);
``me.owner_pid``; ``commands.release`` names the claim as the argument; a ``next`` place
says ``duration_usec``, as every other span (2: ``duration_s``).
4: as every output of schema 2 (``protocol.names.JSON_SCHEMA``), a booking's ``gpus`` are
its GPUs' aliases and ``gpus_requested`` its count; a ``next`` place says ``gpu_count``.
Added since: ``mcp_jobs`` (what resourced-mcp's ``run`` may start here)."""

CLAIM_KEYS = ("id", "mode", "state", "gpus", "gpu_indices", "vram_bytes", "pools", "until_usec",
              "until_booking", "task_name", "label", "session")
"""What the context says of each of my claims."""

QUEUE_KEYS = ("id", "user", "priority", "gpus_requested", "vram_bytes", "pools")

CONTEXT_BOOKINGS = 100
"""The live bookings the context lists, the next by start; ``holding.more_bookings`` says
when there are more (``gpuctl bookings --json`` and the MCP ``list`` tool give them all):
an agent reads a context, not a calendar of thousands."""

NEXT_FOR = HOUR
"""Microseconds: the context's ``next`` places are for an hour."""

HISTORY = 7 * DAY
"""Microseconds: ``usage`` gives the history of this last week (``gpuctl usage``'s default)."""

HISTORY_KEYS = ("claims", "bookings", "held_gpu_hours", "used_gpu_hours", "idle_gpu_hours",
                "booked_gpu_hours", "booked_idle_gpu_hours")
"""What ``usage`` says of my history (a row of ``gpuctl usage --json``; 0 for none)."""


def context(c) -> dict:
    """``gpuctl agent context --json``: me, what I hold, what is free, the next places for
    one and for all GPUs, the queue, health, notices, limits and the commands to use."""
    from resourced.linux.users import user_name
    from resourced.protocol.time import now_usec

    state = c.status()
    now = now_usec()
    mine = [b for b in c.bookings(since=Usec(now), limit=CONTEXT_BOOKINGS + 1)
            if b["state"] != "ended"]
    gpus = len(state["gpus"])
    upcoming = {n: next(iter(c.slots(Usec(NEXT_FOR), count=1, gpus=n)), None)
                for n in {1, gpus} if 0 < n <= gpus}
    uid = os.getuid()
    owner = lasting_owner()
    claims = [k for k in state["claims"] if k["uid"] == uid]
    free_gpus = [g["alias"] for g in state["gpus"] if g["state"] == "free"]
    return {
        "schema": SCHEMA,
        "now": iso_utc(now),
        "me": {"uid": uid, "user": user_name(uid), "pid": os.getpid(),
               "parent_pid": os.getppid(), "owner_pid": owner, "session": my_session()},
        "daemon": {"version": state["version"], "mode": state["mode"], "bus": c.bus,
                   "backend": state["backend"]},
        "holding": {
            "claims": [{key: k[key] for key in CLAIM_KEYS} for k in claims],
            "bookings": [with_times(b) for b in mine[:CONTEXT_BOOKINGS]],
            "more_bookings": len(mine) > CONTEXT_BOOKINGS,
        },
        "free": {
            "gpus": free_gpus,
            "vram_bytes": {g["alias"]: g["memory_bytes"] - g["vram_used_bytes"]
                           for g in state["gpus"] if g["state"] != "claimed"},
            "pools": {p["name"]: p["free"] for p in state["pools"]},
        },
        "next": {name: next_place(n, upcoming.get(n))
                 for name, n in (("one_gpu", 1), ("all_gpus", gpus))},
        "queue": [{key: k[key] for key in QUEUE_KEYS}
                  for ref in state["queue"] for k in state["claims"] if k["id"] == ref],
        "health": {"level": state["health"]["level"],
                   "checks": [{"name": k["name"], "level": k["level"]}
                              for k in state["health"]["checks"]]},
        "notices": state.get("notices", []),
        "limits": state.get("limits", {}),
        "mcp_jobs": mcp_jobs(c.bus),
        "commands": {
            "run": "gpuctl run --gpus 1 [--for 2h] [--wait] -- COMMAND",
            "claim": f"gpuctl claim --gpus 1 --owner-pid {owner or 'PID'} --task-name WHAT",
            "use_claim": "gpuctl run --allocation REF -- COMMAND",
            "release": "gpuctl release REF",
            "book": "gpuctl book --gpus 1 --for 1h --at WHEN --op-id ID",
            "stop_my_session": f"gpuctl stop --session {my_session()}",
            "instructions": "gpuctl agent instructions",
        },
    }


def mcp_jobs(bus: str) -> dict:
    """What resourced-mcp's ``run`` tool may start here (``[mcp]`` of the configuration
    file): ``run`` (on or off), ``allow_commands``, ``allow_dirs``, ``config`` (the file),
    ``problem`` (why the file cannot be read, or None), and ``runner``: whether a runner
    is running for this bus to start them."""
    from resourced.runner.jobs import jobs_dir, runner_is_running

    from .jobs import allowed

    return {**allowed(), "runner": runner_is_running(jobs_dir(), bus)}


SHORT_LIVED = frozenset({"sh", "bash", "dash", "zsh", "fish", "ksh", "mksh", "busybox", "env",
                         "timeout", "nohup", "script", "xargs", "npx", "uv", "uvx"})
"""Commands an agent's tool runs ``gpuctl`` through, which end with it."""


def lasting_owner() -> int | None:
    """The pid to offer as a claim's owner: the nearest ancestor of ours that is not a
    shell (or other wrapper) that ends with this command, as an agent's own process is;
    for a person, their interactive shell (the last of ours before another user's
    process). None when there is none but init."""
    from resourced.evidence.processes import parent_and_name, process_uid

    uid, pid, last_ours = os.getuid(), os.getppid(), None
    for _ in range(64):
        found = parent_and_name(pid) if pid > 1 else None
        if found is None or process_uid(pid) != uid:
            return last_ours
        parent, name = found
        if name not in SHORT_LIVED:
            return pid
        last_ours, pid = pid, parent
    return last_ours


def next_place(gpus: int, slot: dict | None) -> dict:
    """One of the context's ``next`` places: ``gpus`` GPUs for ``duration_usec``, at the
    earliest ``start`` (it and the rest None where it fits nowhere within the booking
    horizon)."""
    where = with_times(slot) if slot else dict.fromkeys(
        ("start", "end", "start_usec", "end_usec", "gpu_indices"))
    return {"gpu_count": gpus, "duration_usec": NEXT_FOR, **where}


def my_session() -> str:
    """The session a claim or booking made from here belongs to: ``$RESOURCED_SESSION``,
    else this process's Unix session (the daemon's default, ``sid:N``)."""
    return os.environ.get("RESOURCED_SESSION") or f"sid:{os.getsid(0)}"


def recommend(c, duration, gpus: int | None = None, vram=None, ram=None, cpu=None) -> dict:
    """Where and when this would fit, nothing taken: ``{"fits": False, "reason"}``, or
    ``{"fits": True, "now": True, "gpu_indices", "command"}`` (a ``gpuctl run`` to copy),
    or ``{"fits": True, "now": False, "start", "gpu_indices", "command"}`` (a ``gpuctl
    book``).  ``duration`` is seconds or text (``4h``); memory is bytes or text (``20G``);
    nothing asked for is one whole GPU."""
    import shlex

    from resourced.client.arguments import memory_and_counts, span
    from resourced.protocol.amounts import format_bytes
    from resourced.protocol.time import now_usec, whole_second
    from resourced.protocol.when import format_span

    length = span("duration", duration)
    vram, pools = memory_and_counts(vram, ram, cpu)
    ask = {k: v for k, v in (("gpus", gpus), ("vram", vram), ("ram", pools.get("ram")),
                             ("cpu", pools.get("cpu"))) if v is not None} or {"gpus": 1}
    found = c.slots(Usec(length), count=1, **ask)
    free = c.free()
    amounts = [f"--{k} {format_bytes(v) if k in ('vram', 'ram') else v}" for k, v in ask.items()]
    amounts.append(f"--for {format_span(seconds_of_usec(length))}")
    if not found:
        return {"fits": False, "reason": "it fits nowhere within the booking horizon"}
    if found[0]["start_usec"] <= whole_second(now_usec()) and (
            not ask.get("gpus") or free >= ask["gpus"]):
        return {"fits": True, "now": True, "gpu_indices": found[0]["gpu_indices"],
                "command": f"gpuctl run {' '.join(amounts)} -- COMMAND"}
    start = iso_utc(found[0]["start_usec"])
    return {"fits": True, "now": False, "start": start, "gpu_indices": found[0]["gpu_indices"],
            "command": f"gpuctl book {' '.join(amounts)} --at {shlex.quote(start)} --op-id ID"}


def holdings(c) -> dict:
    """My claims (every state, as ``status`` records them) and my bookings (scheduled,
    active, and ended within the last day), with their times as ISO 8601."""
    uid = os.getuid()
    return {"claims": [k for k in c.status()["claims"] if k["uid"] == uid],
            "bookings": [with_times(b) for b in c.bookings()]}


def usage(c) -> dict:
    """What I hold now and what I have booked ahead, summed (an active booking counts in
    both: its claim is held now, and the rest of it is booked), and my ``history`` of the
    last week from the daemon's usage history (as ``gpuctl usage --user ME``)."""
    from resourced.protocol.time import now_usec

    now = now_usec()
    mine = holdings(c)
    since = now - HISTORY
    past = next(iter(c.usage(since=Usec(since), until=Usec(now), uid=os.getuid())), {})
    granted = [k for k in mine["claims"] if k["state"] == "granted"]
    whole = [k for k in granted if not k["vram_bytes"]]
    pools: dict[str, int] = {}
    for k in granted:
        for name, amount in k["pools"].items():
            pools[name] = pools.get(name, 0) + amount
    ahead = [b for b in mine["bookings"] if b["state"] in ("scheduled", "active")
             and b["end_usec"] > now]
    gpu_hours = sum(b["gpus_requested"] * (b["end_usec"] - max(b["start_usec"], now))
                    for b in ahead)
    vram_hours = sum(b["vram_bytes"] * (b["end_usec"] - max(b["start_usec"], now))
                     for b in ahead)
    return {
        "now": iso_utc(now),
        "holding": {
            "claims": len(granted),
            "waiting": sum(1 for k in mine["claims"] if k["state"] == "queued"),
            "gpu_count": sum(len(k["gpus"]) for k in whole),
            "vram_bytes": sum(k["vram_bytes"] for k in granted),
            "pools": pools,
        },
        "booked_ahead": {
            "bookings": len(ahead),
            "active": sum(1 for b in ahead if b["state"] == "active"),
            "gpu_hours": round(gpu_hours / HOUR, 3),
            "vram_gib_hours": round(vram_hours / HOUR / 2**30, 3),
            "next_start": min((b["start"] for b in ahead if b["start_usec"] > now),
                              default=None),
        },
        "history": {"since": iso_utc(since), "until": iso_utc(now),
                    **{key: past.get(key, 0) for key in HISTORY_KEYS}},
    }
