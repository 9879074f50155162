"""gpuctl agent: what a coding agent needs, in one call, and the text that teaches it.

``context`` is versioned JSON (``schema``): who I am, what I hold, what is free, the next
places for common shapes, the queue, health, notices, the limits, and the commands to
use.  ``recommend`` is a read-only placement with the command to copy.  ``instructions``
prints the rules an agent follows; ``skill install`` writes them as an Agent Skill
folder (``SKILL.md`` with its front matter) and nowhere else.
"""

from pathlib import Path

import click

from resourced.protocol.names import JSON_SCHEMA

from ._options import Count, Duration, Memory, bus_option, client, emit_json, json_option

SKILL_NAME = "resourced-gpus"
SKILL_DIRS = {"claude": "~/.claude/skills"}
"""Where an agent loads personal skills from, where its makers document it (others: --dir)."""

INSTRUCTIONS = """\
# Using the GPUs of this machine through resourced

This machine's GPUs are shared by people and agents through resourced. Nothing stops a
program that ignores it, so follow these rules; every other user relies on them.

1. Look first: `gpuctl agent context --json` says what you hold, what is free, when the
   next places are, the queue, the health levels, notices and your limits.
2. Never use a GPU you did not claim. Run GPU work through resourced:
   - one command: `gpuctl run --gpus 1 -- python train.py` (add `--for 2h` when you know
     how long; `--vram 20G` for a share of one GPU; `--wait` to queue instead of failing);
   - several commands: `gpuctl claim --gpus 1 --owner-pid PID --task-name WHAT`, where PID
     is your own long-lived process (the agent's, not a short shell's: `gpuctl agent
     context` offers it as me.owner_pid), then `gpuctl run --allocation REF -- ...` or
     `eval "$(gpuctl env REF)"`, and `gpuctl release REF` as soon as you are done.
3. Later: `gpuctl agent recommend --gpus 2 --for 4h --json` gives a command to copy;
   `gpuctl book --gpus 2 --for 4h --at 20:00 --op-id ID` books it.
4. Writes are retry-safe with an operation id: pass `--op-id` (unique per intent) to book,
   edit, extend and cancel, and retry with the same id after a timeout; the answer is the
   first one ("exists"), never a second booking.
5. When a claim is asked back (a booking starts, or a waiter of higher priority needs it),
   `gpuctl run` forwards the request as SIGUSR1: save and stop soon.
   A person may stop your whole session at once (`gpuctl stop --session NAME`): your
   commands get SIGUSR1, then SIGTERM 10 s later, and your claims are gone.
6. Exit codes: 0 ok; 2 bad request (fix it, do not retry); 3 does not fit now (retry later,
   use --wait, or book: the message names the nearest start that fits); 4 the free GPUs
   run someone's unclaimed processes; 5 the daemon is unreachable; 6 unknown reference;
   7 not yours; 8 access denied; 9 your processes still use the GPUs (stop them first);
   11 queue timeout; 12 a per-user or per-session limit reached (release something
   first; the message names the limit).
7. Read `gpuctl status` and `gpuctl verify` rather than nvidia-smi alone: they say who
   holds what and whether anything runs that nobody claimed.
8. Sessions: set `RESOURCED_SESSION=NAME` once (sub-agents inherit it), or pass
   `--session NAME`; your claims and bookings are then one session, limited as one and
   listed by `gpuctl sessions`. Try a write first with `--dry-run` (claim, run, book,
   edit, extend, cancel, release, stop): the daemon decides, nothing changes.
"""


@click.group()
def agent():
    """What a coding agent needs: one-call context, placements, instructions, a skill.

    Example: gpuctl agent context --json
    """


@agent.command()
@bus_option
@json_option
def context(bus, as_json):
    """Everything an agent needs in one call: me, what I hold, what is free, the next
    places, the queue, health, notices, limits and the commands to use.

    Example: gpuctl agent context --json
    """
    data = _context(bus)
    if as_json:
        emit_json(data)
        return
    from resourced.protocol.time import seconds_of_usec
    from resourced.protocol.when import format_span

    held = data["holding"]
    click.echo(f"{data['me']['user']} (uid {data['me']['uid']}) on the {data['daemon']['bus']} bus")
    click.echo(f"holding: {len(held['claims'])} claim(s), {len(held['bookings'])} booking(s)")
    free = data["free"]
    click.echo(f"free now: {len(free['gpus'])} GPU(s) {', '.join(free['gpus']) or ''}".rstrip())
    for place in data["next"].values():
        span = format_span(seconds_of_usec(place["duration_usec"]))
        click.echo(f"next {place['gpu_count']} GPU(s) for {span}: {place['start'] or 'nowhere'}")
    click.echo(f"queue: {len(data['queue'])} waiting; health: {data['health']['level']}")
    for notice in data["notices"]:
        click.echo(f"NOTICE: {notice['text']}")
    for what, command in data["commands"].items():
        click.echo(f"{what}: {command}")


def _context(bus) -> dict:
    from resourced.agents.context import context as gather

    with client(bus) as c:
        return gather(c)


@agent.command()
@click.option("--gpus", "-G", type=click.IntRange(1, 2**32 - 1), help="Whole GPUs.")
@click.option("--vram", type=Memory(), help="A share of one GPU's memory.")
@click.option("--ram", type=Memory(), help="Host RAM.")
@click.option("--cpu", type=Count(), help="CPU cores.")
@click.option("--for", "-t", "duration", type=Duration(), required=True, help="How long.")
@bus_option
@json_option
def recommend(gpus, vram, ram, cpu, duration, bus, as_json):
    """Where and when this would fit (nothing is taken), with the command to copy: run it
    now, or book it for the earliest start.

    Example: gpuctl agent recommend --gpus 2 --for 4h --json
    """
    from resourced.agents.context import recommend as place

    with client(bus) as c:
        result = place(c, duration, gpus=gpus, vram=vram, ram=ram, cpu=cpu)
    if as_json:
        emit_json({"schema": JSON_SCHEMA, **result})
    elif not result["fits"]:
        click.echo(result["reason"])
    else:
        click.echo(result["command"])


def template(name: str) -> str:
    """One of the agent templates shipped in the package (``agent_templates/``)."""
    from importlib.resources import files

    return files(__package__).joinpath("agent_templates", name).read_text(encoding="utf-8")


@agent.command()
@click.option("--host", "which", flag_value="host",
              help="The machine-wide guardrails (output, progress, detached jobs, health "
              "levels) followed by these rules: for the agent's user-level file.")
@click.option("--project", "which", flag_value="project",
              help="A starting template for one project's AGENTS.md or CLAUDE.md.")
def instructions(which):
    """Print the rules an agent follows on this machine (Markdown).

    Without an option: the GPU rules, for an agent's instructions file. Where agents read
    them: Codex ~/.codex/AGENTS.md; Claude Code ~/.claude/CLAUDE.md, or for every user
    /etc/claude-code/CLAUDE.md; a project's own AGENTS.md or CLAUDE.md adds to those.

    Example: gpuctl agent instructions --host >> ~/.codex/AGENTS.md
    """
    if which == "host":
        click.echo(template("HOST_AGENTS.md") + "\n" + INSTRUCTIONS, nl=False)
    elif which == "project":
        click.echo(template("PROJECT_AGENTS.md"), nl=False)
    else:
        click.echo(INSTRUCTIONS, nl=False)


@agent.group()
def skill():
    """The instructions as an Agent Skill folder (SKILL.md with its front matter).

    Example: gpuctl agent skill install --agent claude
    """


def skill_text() -> str:
    """SKILL.md: the front matter an agent reads first, then the instructions."""
    return ("---\n"
            f"name: {SKILL_NAME}\n"
            "description: Use before running anything on this machine's GPUs: how to claim, "
            "run, book and release GPUs through resourced (gpuctl) so other users and agents "
            "are not disturbed.\n"
            "---\n\n" + INSTRUCTIONS)


@skill.command("install")
@click.option("--agent", "agent_name", type=click.Choice(["claude", "codex"]), required=True,
              help="Which agent the skill is for.")
@click.option("--dir", "directory", type=click.Path(file_okay=False, path_type=Path),
              help="The skills folder (default for claude: ~/.claude/skills; codex: needed).")
@click.option("--print", "show", is_flag=True, help="Print SKILL.md instead of writing it.")
def skill_install(agent_name, directory, show):
    """Write the skill folder resourced-gpus/SKILL.md there, and nothing else anywhere.

    Example: gpuctl agent skill install --agent claude
    """
    if show:
        click.echo(skill_text(), nl=False)
        return
    if directory is None:
        if agent_name not in SKILL_DIRS:
            raise click.UsageError(f"give --dir: there is no skills folder for {agent_name} "
                                   "that resourced knows of")
        directory = Path(SKILL_DIRS[agent_name]).expanduser()
    target = directory / SKILL_NAME
    target.mkdir(parents=True, exist_ok=True)
    (target / "SKILL.md").write_text(skill_text())
    click.echo(str(target / "SKILL.md"))
