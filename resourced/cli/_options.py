"""Option bundles shared by gpuctl's commands."""

import click


def bus_option(fn):
    return click.option(
        "--bus", type=click.Choice(["session", "system", "shared"]), default=None,
        help="Which bus to use (default: $RESOURCED_BUS, else the shared bus of `gpuctl "
        "connect`, else the session bus if a daemon runs or can start there, else the system "
        "bus).",
    )(fn)


def json_option(fn):
    return click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")(fn)


dry_run_option = click.option(
    "--dry-run", is_flag=True,
    help="Say what it would do, decided by the daemon's real admission; change nothing.")

session_option = click.option(
    "--session", metavar="NAME", default=None,
    help="The agent session it belongs to (default: $RESOURCED_SESSION, else this "
    "terminal's Unix session); `gpuctl stop --session NAME` ends a whole session.")


RED, YELLOW = "31", "33"
ALERTS = {"STOP": RED, "NOTICE": YELLOW, "OVERDUE": RED, "WAITING": YELLOW, "DEAD": RED, "UNCLAIMED USE": RED, "FOREIGN PROCESS": RED,
          "MISSING": RED, "ERROR": RED, "WARN": YELLOW, "UNKNOWN": YELLOW,
          "UNAVAILABLE": YELLOW, "FAIL": RED}
"""The words a person must notice in a table, and their colour."""


def colour_wanted() -> bool:
    """``--color=always|never``, else none where ``NO_COLOR`` is set (no-color.org), else
    only on a terminal that is not dumb."""
    import os
    import sys

    ctx = click.get_current_context(silent=True)
    choice = ctx.find_root().params.get("color", "auto") if ctx else "auto"
    if choice != "auto":
        return choice == "always"
    if os.environ.get("NO_COLOR"):
        return False
    return sys.stdout.isatty() and os.environ.get("TERM") != "dumb"


def echo_table(text: str) -> None:
    """Print a rendered table, its alert words in colour when colour is wanted (the
    columns are padded first, so the colour never shifts them)."""
    import re

    wanted = colour_wanted()
    if wanted:
        alert = re.compile(r"\b(" + "|".join(map(re.escape, ALERTS)) + r")\b")
        text = alert.sub(lambda m: f"\x1b[{ALERTS[m[1]]}m{m[1]}\x1b[0m", text)
    click.echo(text, color=wanted)


def emit_json(data) -> None:
    """Sorted keys; indented for a person at a terminal, one line for a program (the
    indenting encoder is pure Python: 10 times slower on a status of 10,000 claims).
    ``data`` may also be JSON text already in that one-line form (``Describe``'s): it is
    then passed on as it is, not read and written again: as bytes (it is ASCII), which
    click writes without scanning them for colour codes (megabytes of a listing)."""
    import sys

    if isinstance(data, str) and not sys.stdout.isatty():
        click.echo(data.encode())
        return
    import json

    if sys.stdout.isatty():
        click.echo(json.dumps(json.loads(data) if isinstance(data, str) else data,
                              indent=2, sort_keys=True))
    else:
        click.echo(json.dumps(data, sort_keys=True))


def client(bus: str | None):
    """A blocking client; imported here so --help never loads the bus library."""
    import sys

    from resourced.client.sync import Client

    return Client(bus=bus, interactive=sys.stdin.isatty())


def _daemon_view(ctx) -> dict | None:
    """The daemon's Describe, for completion: None when it cannot be had at once."""
    from resourced.client.sync import Client

    try:
        with Client(bus=ctx.params.get("bus"), timeout=2) as c:
            return c.status()
    except Exception:  # noqa: BLE001 - completion offers nothing rather than failing
        return None


def complete_claims(ctx, param, incomplete):
    """Shell completion of a claim reference, from the daemon's live claims."""
    from click.shell_completion import CompletionItem

    view = _daemon_view(ctx) or {"claims": []}
    return [CompletionItem(c["id"], help=" ".join(filter(None, (c["user"], c["mode"],
                                                                  c["task_name"]))))
            for c in view["claims"] if c["id"].startswith(incomplete)]


def complete_gpus(ctx, param, incomplete):
    """Shell completion of a GPU: its alias (or index, or UUID), from the daemon."""
    from click.shell_completion import CompletionItem

    view = _daemon_view(ctx) or {"gpus": []}
    names = [(g["alias"], g["state"]) for g in view["gpus"]]
    names += [(str(g["index"]), g["alias"]) for g in view["gpus"]]
    names += [(g["uuid"], g["alias"]) for g in view["gpus"]]
    return [CompletionItem(name, help=why) for name, why in names if name.startswith(incomplete)]


class Amount(click.ParamType):
    """``4G``, ``512M``, ``1.5T`` (binary units) or a plain count."""

    name = "AMOUNT"

    def convert(self, value, param, ctx):
        from resourced.protocol.amounts import parse_amount

        try:
            return parse_amount(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


class _Parsed(click.ParamType):
    """A value one of ``resourced.protocol.amounts``' parsers reads, named in its messages by the
    option's name."""

    parser = ""

    def convert(self, value, param, ctx):
        from resourced.protocol import amounts

        if isinstance(value, int):
            return value
        try:
            return getattr(amounts, self.parser)(value, param.opts[0] if param else self.name)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


class Memory(_Parsed):
    """Memory with its unit: ``4G``, ``512M``, ``1.5T`` (a bare number is refused: 4000
    what?)."""

    name, parser = "SIZE", "parse_memory"


class Count(_Parsed):
    """A whole number greater than 0, without a unit: CPU cores."""

    name, parser = "N", "parse_count"


class PoolAmount(click.ParamType):
    """``NAME=AMOUNT`` for a named pool."""

    name = "NAME=AMOUNT"

    def convert(self, value, param, ctx):
        if isinstance(value, tuple):
            return value
        name, sep, amount = value.partition("=")
        if not sep or not name:
            self.fail(f"expected NAME=AMOUNT, not {value!r}", param, ctx)
        return name, Amount().convert(amount, param, ctx)


class Duration(click.ParamType):
    """Seconds: ``90``, ``30s``, ``5m``, ``1h``, ``2h30m``, ``1d`` (``resourced.protocol.when``)."""

    name = "DURATION"

    def convert(self, value, param, ctx):
        from resourced.protocol.when import parse_duration

        if isinstance(value, float):
            return value
        try:
            return parse_duration(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


class CommandAfterDashes(click.Command):
    """A command whose COMMAND comes after ``--``: it notes how many words came after the
    first ``--``, so that ``refuse_stray_words`` can tell a stray word before it."""

    def parse_args(self, ctx, args):
        ctx.meta["words_after_dashes"] = len(args) - args.index("--") - 1 if "--" in args else None
        return super().parse_args(ctx, args)


def refuse_stray_words(command: tuple, form: str, dashes_needed: bool = False) -> None:
    """A word before ``--`` (``--for 2 hours``, ``--label my job``) is an option's second
    word, never the command to run: refused, before anything is asked of the daemon."""
    after = click.get_current_context().meta.get("words_after_dashes")
    if after is None:
        if command and dashes_needed:
            raise click.UsageError(f"unexpected argument {command[0]!r}: the command goes "
                                   f"after --: {form}")
        return
    stray = command[:len(command) - after]
    if stray:
        raise click.UsageError(f"unexpected argument {stray[0]!r} before --: an option takes "
                               f"one word (quote a label with spaces; --for 2h, not 2 hours), "
                               f"and the command goes after --: {form}")
