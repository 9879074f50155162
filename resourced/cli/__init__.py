"""gpuctl: the command line for resourced.

Subcommands load lazily (``--help`` and ``--version`` import no bus library), and every
failure leaves through ``main``: ``gpuctl: <one line>`` on stderr and a documented exit code.
"""

import importlib

import click

from resourced import __version__
from resourced.exits import (
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    GpuctlError,
    exit_code_for,
)

from ._options import BUSES, error_record, said

COMMANDS = {
    "run": ("claims", "run", "Run a command on free GPUs (or on a claim), then release them."),
    "claim": ("claims", "claim", "Claim GPUs for development; prints the reference."),
    "release": ("claims", "release", "Release a claim."),
    "env": ("claims", "env", "Print shell export lines for a claim."),
    "shell": ("shell", "shell", "Keep an interactive shell on your active booking or claim."),
    "status": ("status", "status", "Show each GPU and who holds it."),
    "free": ("status", "free", "Print how many GPUs are free."),
    "queue": ("status", "queue", "List the waiting claims in the order they will be served."),
    "verify": ("status", "verify", "Compare the claims with what really runs on each GPU."),
    "book": ("bookings", "book", "Book GPUs and/or pool amounts for a time window."),
    "bookings": ("bookings", "bookings", "List bookings: active, future, and lately ended."),
    "edit": ("bookings", "edit", "Change a booking that has not started."),
    "extend": ("bookings", "extend", "Move a booking's end, later or earlier."),
    "cancel": ("bookings", "cancel", "Cancel a booking."),
    "slots": ("bookings", "slots", "Show the earliest places where a booking would fit."),
    "timeline": ("bookings", "timeline", "Draw GPUs against time: who holds what, when."),
    "top": ("top", "top", "A live, full-screen timeline with keys to book, extend, cancel."),
    "blackout": ("bookings", "blackout", "Block windows for maintenance (administrators)."),
    "notice": ("bookings", "notice", "Messages for everyone (administrators)."),
    "agent": ("agent", "agent", "For coding agents: one-call context, placements, instructions."),
    "sessions": ("sessions", "sessions", "List agent sessions and what each holds."),
    "usage": ("usage", "usage", "GPU-hours held, used and idle, per user or per GPU."),
    "stop": ("sessions", "stop", "End every claim and booking of a session at once."),
    "init": ("init", "init", "Write a config file listing this machine's GPUs."),
    "demo": ("demo", "demo", "Show resourced at work on simulated GPUs (a private bus)."),
    "service": ("service", "service", "Install, enable or remove the systemd service."),
    "connect": ("connect", "connect", "Use a shared bus hosted by an ordinary account."),
    "config": ("config", "config", "Check a configuration file without starting anything."),
    "doctor": ("doctor", "doctor", "Check that resourced works here, layer by layer."),
    "metrics": ("doctor", "metrics", "Print the daemon's metrics for Prometheus."),
    "resources": ("resources", "resources", "Show RAM and disk health: limits and live figures."),
    "notify": ("notify", "notify", "Show desktop notifications when RAM or disk health changes."),
    "runner": ("runner", "runner", "Start your bookings' commands at their start (book -- CMD)."),
    "logs": ("runner", "logs", "Print the output of a booking's command."),
    "slurm": ("slurm", "slurm", "Print this machine's gres.conf and slurm.conf lines for Slurm."),
}

ALIASES = {
    "agent-instructions": ("agent", "instructions"),  # the predecessor's name, in many CLAUDE.md
}
"""Other names of subcommands (module, attribute): they run, and are not listed."""


class LazyGroup(click.Group):
    """Imports a subcommand's module only when that subcommand runs."""

    def list_commands(self, ctx):
        return list(COMMANDS)

    def get_command(self, ctx, name):
        if name in ALIASES:
            module, attr = ALIASES[name]
        elif name in COMMANDS:
            module, attr, _ = COMMANDS[name]
        else:
            return None
        return getattr(importlib.import_module(f"{__name__}.{module}"), attr)

    def resolve_command(self, ctx, args):
        """An unknown subcommand is refused with the nearest names ("did you mean")."""
        name = args[0] if args else ""
        if name and not name.startswith("-") and self.get_command(ctx, name) is None:
            import difflib

            near = difflib.get_close_matches(name, [*COMMANDS, *ALIASES], n=3, cutoff=0.6)
            hint = f" Did you mean {' or '.join(repr(n) for n in near)}?" if near else ""
            ctx.fail(f"No such command {name!r}.{hint}")
        return super().resolve_command(ctx, args)

    def format_commands(self, ctx, formatter):
        """List the commands from the table, so ``gpuctl --help`` imports none of them."""
        rows = [(name, help_text) for name, (_, _, help_text) in COMMANDS.items()]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="gpuctl")
@click.option("--color", type=click.Choice(["auto", "always", "never"]), default="auto",
              show_default=True, help="Colour for what must be noticed (STOP, DEAD, "
              "UNCLAIMED USE...); auto: on a terminal, unless NO_COLOR is set.")
@click.option("--bus", type=click.Choice(BUSES), default=None,
              help="Which bus every subcommand uses (as the subcommand's own --bus).")
def cli(color, bus):
    """Share the GPUs of one machine: claim, run, release, and see who holds what.

    Exit codes: 0 ok, 1 other error, 2 bad usage, 3 not enough GPUs, 4 GPUs busy with
    unknown processes, 5 daemon unreachable, 6 unknown or stale allocation, 7 not yours,
    8 access denied, 9 still in use, 10 systemd not running (gpuctl service), 11 queue
    timeout, 12 a per-user limit reached, 13 a check failed (gpuctl doctor), 130
    interrupted. `gpuctl run` returns the command's own code (128+n for signal n).

    Example: gpuctl run --gpus 1 -- python train.py
    """


CHANGES = frozenset({"claim", "release", "book", "edit", "extend", "cancel", "stop"})
"""The subcommands after which shells with the hook (gpuctl shell init) look again."""


@cli.result_callback()
def _after(rv, color, bus):
    """After a subcommand returned (an error raises past this): a change of the user's
    tells the shell hook through the stamp (imported only then: --help stays light)."""
    if click.get_current_context().invoked_subcommand in CHANGES:
        from resourced.linux.shell_stamp import touch_stamp

        touch_stamp()
    return rv


JSON_INSTEAD = {
    "run": "it prints its command's output; the claim as JSON: gpuctl claim --json, then "
           "gpuctl run --allocation REF",
    "logs": "it prints the command's output; the job's state as JSON: gpuctl bookings REF "
            "--json",
    "shell": "it starts a shell; the claim's variables as JSON: gpuctl env REF --json",
}
"""For a command without --json: what it prints instead, and what gives JSON."""


def _json_instead(command: str) -> str:
    instead = JSON_INSTEAD.get(command)
    return f" ({instead})" if instead else ""


def main(argv: list[str] | None = None) -> int:
    import sys

    args = sys.argv[1:] if argv is None else argv
    as_json = "--json" in (args[:args.index("--")] if "--" in args else args)

    def failed(message: str, exit_code: int, code: str | None = None, json_too=True) -> int:
        """``gpuctl: <message>`` on stderr and, with --json, as the result would have been,
        a JSON object on stdout: {"error": {code, message, exit_code}}."""
        click.echo(f"gpuctl: {message}", err=True)
        if as_json and json_too:
            import json

            click.echo(json.dumps(error_record(message, exit_code, code), sort_keys=True))
        return exit_code

    try:
        rv = cli.main(args=argv, prog_name="gpuctl", standalone_mode=False)
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.Abort:
        return failed("interrupted", EXIT_INTERRUPTED)
    except click.NoSuchOption as exc:
        hint = f" (see: {exc.ctx.command_path} --help)" if exc.ctx else ""
        if exc.option_name == "--json" and exc.ctx:  # a command that answers no record
            return failed(f"{exc.ctx.command_path} has no --json"
                          f"{_json_instead(exc.ctx.command.name)}{hint}", EXIT_USAGE)
        return failed(f"{exc.format_message()}{hint}", EXIT_USAGE)
    except click.UsageError as exc:
        hint = f" (see: {exc.ctx.command_path} --help)" if exc.ctx else ""
        return failed(f"{exc.format_message()}{hint}", EXIT_USAGE)
    except GpuctlError as exc:
        return failed(said(exc), exc.exit_code, json_too=not exc.printed_json)
    except click.ClickException as exc:
        return failed(exc.format_message(), exc.exit_code)
    except Exception as exc:
        code = exit_code_for(exc)
        if code is None:
            raise
        return failed(said(exc), code, exc.code)
    return rv if isinstance(rv, int) else 0
