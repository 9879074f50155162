"""Option bundles shared by gpuctl's commands."""

import click

BUSES = ("session", "system", "shared")
BUS_HELP = ("Which bus to use (default: $RESOURCED_BUS, else the shared bus of `gpuctl connect`, "
            "else the session bus if a daemon runs or can start there, else the system bus).")


def _bus_given_first(ctx, param, value):
    """``gpuctl --bus system status`` as ``gpuctl status --bus system``: a subcommand's
    own --bus wins over the one before it."""
    return value if value is not None else ctx.find_root().params.get("bus")


def bus_option(fn):
    return click.option("--bus", type=click.Choice(BUSES), default=None, help=BUS_HELP,
                        callback=_bus_given_first)(fn)


def json_option(fn):
    return click.option("--json", "as_json", is_flag=True,
                        help="Print JSON instead of text (a failure too: code, message, "
                        "exit_code).")(fn)


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


def refs_given(refs: tuple, allocation: str | None, several: bool = True) -> tuple:
    """The references named, as arguments or by the seed's ``--allocation REF``; at least
    one, and only one where ``several`` is False."""
    named = (*refs, allocation) if allocation else tuple(refs)
    if not named:
        raise click.UsageError("name the claim: REF (or --allocation REF)")
    if len(named) > 1 and not several:
        raise click.UsageError(f"one REF at a time, not {len(named)}")
    return named


def for_each_ref(refs: tuple, act, as_json: bool = False) -> None:
    """``act(ref)`` for each reference in turn. With several, one that fails is said
    (``gpuctl: REF: why``, its times in local time as with one) and, with ``as_json``, is
    a line of its own on stdout among the others' (``{"ref", "error": {code, message,
    exit_code}}``); the rest still run; the first failure's exit code is the command's,
    and the last line names the references that failed."""
    from resourced.errors import ResourcedError
    from resourced.exits import GpuctlError, exit_code_for

    if len(refs) == 1:
        act(refs[0])
        return
    failed = []
    for ref in refs:
        try:
            act(ref)
        except (ResourcedError, GpuctlError) as exc:
            code = exc.exit_code if isinstance(exc, GpuctlError) else exit_code_for(exc)
            message = said(exc)
            click.echo(f"gpuctl: {ref}: {message}", err=True)
            if as_json:
                emit_json({"ref": ref, **error_record(message, code, getattr(exc, "code", None))})
            failed.append((ref, code))
    if failed:
        names = ", ".join(ref for ref, _ in failed)
        raise GpuctlError(f"{len(failed)} of {len(refs)} failed: {names}", failed[0][1])


def error_record(message: str, exit_code: int, code: str | None = None) -> dict:
    """What --json says of a failure: ``{"error": {code, message, exit_code}}``, the code
    named after the exit code where the error has none."""
    from resourced.exits import EXIT_NAMES

    return {"error": {"code": code or EXIT_NAMES.get(exit_code, "Failed"), "message": message,
                      "exit_code": exit_code}}


def said(message) -> str:
    """A message for a person: the daemon's ISO 8601 instants in local time, as the
    tables write them ("today 21:04"); ISO stays in JSON."""
    from resourced.protocol.time import in_local_time

    return in_local_time(str(message))


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


class GpuList(click.ParamType):
    """GPUs by alias, index or UUID, comma-separated: ``1,3`` or ``gpu1,big``."""

    name = "GPU[,GPU]"

    def convert(self, value, param, ctx):
        if isinstance(value, tuple):
            return value
        names = tuple(n.strip() for n in value.split(",") if n.strip())
        if not names:
            self.fail("name at least one GPU", param, ctx)
        return names


def named_gpu_count(gpus: int | None, named: tuple, vram) -> int | None:
    """--gpus beside --gpu LIST, as run, claim and book read them: the list says how many
    (a count that says the same is GPUBK's "bk 1 2h --gpu 1"; with --vram, the list is the
    one GPU of the share). The count to send: None where the list says it."""
    if not named:
        return gpus
    if gpus is not None and gpus != len(named):
        raise click.UsageError(f"{gpus} GPU(s) asked and {len(named)} named: use --gpus N or "
                               "--gpu LIST")
    if vram is not None and len(named) != 1:
        raise click.UsageError("a share (--vram) goes on one GPU: --gpu NAME --vram 24G")
    return None


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
    """A span in the one grammar (``resourced.protocol.when``): ``30m``, ``2h``, ``1d2h``,
    ``1w``, Slurm's ``2:00:00`` and ``1-12:00:00``; a bare number is refused.  Microseconds,
    as ``Usec`` (the client takes them as they are)."""

    name = "DURATION"

    def convert(self, value, param, ctx):
        from resourced.protocol.time import Usec, usec_of_seconds
        from resourced.protocol.when import parse_duration

        if isinstance(value, Usec):
            return value
        try:
            return Usec(usec_of_seconds(parse_duration(value)))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


MONTH = 30 * 86400


def window_options(low: float, text: str):
    """``--span DURATION`` (12h by default) for a drawn window of time, and ``--hours N``,
    its earlier spelling, kept hidden so that old scripts still run."""
    def wrap(fn):
        fn = click.option("--hours", type=click.FloatRange(low / 3600, MONTH / 3600),
                          default=None, hidden=True)(fn)
        return click.option("--span", type=Duration(), default=None,
                            help=f"{text} (default 12h; {low / 3600:g}h to 30d).")(fn)
    return wrap


def window_hours(span: int | None, hours: float | None, low: float) -> float:
    """The window's span in hours, from ``--span`` (microseconds) or else ``--hours``;
    ``low`` is seconds."""
    from resourced.protocol.time import HOUR, usec_of_seconds

    if span is None:
        return 12.0 if hours is None else hours
    if not usec_of_seconds(low) <= span <= usec_of_seconds(MONTH):
        raise click.BadParameter(f"must be from {low / 3600:g}h to 30d", param_hint="--span")
    return span / HOUR


class CommandAfterDashes(click.Command):
    """A command whose COMMAND comes after ``--``: it notes how many words came after the
    first ``--``, so that ``refuse_stray_words`` can tell a stray word before it."""

    def parse_args(self, ctx, args):
        ctx.meta["words_after_dashes"] = len(args) - args.index("--") - 1 if "--" in args else None
        return super().parse_args(ctx, args)


def split_at_dashes(command: tuple) -> tuple[tuple, tuple]:
    """(the words before ``--``, the command after it) of a ``CommandAfterDashes``."""
    after = click.get_current_context().meta.get("words_after_dashes")
    if after is None:
        return command, ()
    return command[:len(command) - after], command[len(command) - after:]


def refuse_stray_words(command: tuple, form: str, dashes_needed: bool = False) -> None:
    """A word before ``--`` (``--for 2 hours``, ``--label my job``) is an option's second
    word, never the command to run: refused, before anything is asked of the daemon."""
    words, _ = split_at_dashes(command)
    if click.get_current_context().meta.get("words_after_dashes") is None and not dashes_needed:
        return
    if words:
        raise stray_word(words[0], form)


def stray_word(word: str, form: str) -> click.UsageError:
    """The refusal of a word that no option took, before ``--`` or without one."""
    if click.get_current_context().meta.get("words_after_dashes") is None:
        return click.UsageError(f"unexpected argument {word!r}: the command goes after --: "
                                f"{form}")
    return click.UsageError(f"unexpected argument {word!r} before --: an option takes one word "
                            f"(quote a label with spaces; --for 2h, not 2 hours), and the "
                            f"command goes after --: {form}")
