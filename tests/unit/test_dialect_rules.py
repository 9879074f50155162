"""The rules of one dialect, each held by a walk over every command (click's tree), every
MCP tool and every configuration key, so that a new one cannot break a rule silently."""

from pathlib import Path

import click
import pytest

from resourced import config
from resourced.cli import ALIASES, COMMANDS, cli
from resourced.cli._options import Duration
from resourced.cli.bookings import When
from resourced.client.arguments import span
from resourced.errors import DaemonUnreachable, InvalidArgs
from resourced.protocol.time import USEC, Usec


def commands(group: click.Group = cli, path: tuple = ("gpuctl",)):
    """(path, command) for every command and subcommand that gpuctl lists."""
    ctx = click.Context(group)
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        yield (*path, name), command
        if isinstance(command, click.Group):
            yield from commands(command, (*path, name))


def options():
    """(path, option) for every visible option of every command."""
    for path, command in commands():
        for param in command.params:
            if isinstance(param, click.Option) and not param.hidden:
                yield path, param


def test_the_walk_sees_every_command():
    names = {path[1] for path, _ in commands()}
    assert names == set(COMMANDS)
    assert not set(ALIASES) & names
    assert sum(1 for _ in options()) > 200


# --- rule 3: one grammar of durations and times -------------------------------------------

SPAN_OPTIONS = {"--for", "--timeout", "--by", "--length", "--span", "--grace"}
"""The names a span of time goes by on the command line."""

FORMS = {"30m": 1800.0, "2h": 7200.0, "1d2h": 93600.0, "1w": 604800.0, "2:00:00": 7200.0,
         "1-12:00:00": 129600.0}


def parse(path, command: click.Command, args: list[str]):
    """The command's parameters as click reads ``args`` (nothing runs)."""
    with command.make_context(" ".join(path), args, resilient_parsing=False) as ctx:
        return ctx.params


def with_required(command: click.Command, option: click.Option, value: str) -> list[str]:
    """``option value``, with values for the rest the command cannot parse without (options
    first: after its first argument, ``run`` reads every word as the command)."""
    args, words = [option.opts[0], value], []
    for param in command.params:
        if isinstance(param, click.Argument) and param.required:
            words.append("x")
        elif isinstance(param, click.Option) and param.required and param is not option:
            value = {Duration: "1h", When: "+1h"}.get(type(param.type), "1")
            args += [param.opts[0], value]
    return args + words


def test_every_span_option_takes_the_one_grammar():
    spans = [(path, opt) for path, opt in options() if set(opt.opts) & SPAN_OPTIONS
             and not isinstance(opt.type, click.Choice)]  # (usage --by user|gpu)
    assert len(spans) >= 10
    for path, opt in spans:
        assert isinstance(opt.type, Duration), f"{' '.join(path)} {opt.opts[0]}"


def test_no_visible_option_is_a_bare_float():
    """A float on the command line is a span (or a share) in disguise."""
    floats = [f"{' '.join(path)} {opt.opts[0]}" for path, opt in options()
              if isinstance(opt.type, (click.types.FloatParamType, click.FloatRange))]
    assert floats == []


@pytest.mark.parametrize("text, seconds", FORMS.items())
def test_every_duration_option_reads_every_form(text, seconds):
    for path, opt in options():
        if not isinstance(opt.type, Duration):
            continue
        command = dict(commands())[path]
        params = parse(path, command, with_required(command, opt, text))
        assert params[opt.name] == seconds * USEC, f"{' '.join(path)} {opt.opts[0]} {text}"
        assert isinstance(params[opt.name], Usec)  # microseconds all the way to the bus


def test_every_duration_option_refuses_a_bare_number_naming_the_forms():
    for path, opt in options():
        if not isinstance(opt.type, Duration):
            continue
        command = dict(commands())[path]
        with pytest.raises(click.BadParameter, match=r"90 what\? Give the unit: 90s, 90m or 90h "
                                                     r"\(forms: 30m, 2h, 1d2h, 1w, 2:00:00"):
            opt.type.convert("90", opt, click.Context(command))


def test_every_since_reads_a_duration_as_that_long_ago():
    from resourced.protocol.time import HOUR, now_usec

    sinces = [(path, opt) for path, opt in options() if "--since" in opt.opts]
    assert len(sinces) >= 2
    for path, opt in sinces:
        assert isinstance(opt.type, When) and opt.type.past, " ".join(path)
        before = now_usec()
        got = opt.type.convert("1h", opt, None)
        assert before - HOUR - USEC <= got <= now_usec() - HOUR + USEC


def test_a_plus_with_a_bare_number_asks_for_the_unit():
    with pytest.raises(click.BadParameter, match=r"90 what\? Give the unit"):
        When().convert("+90", None, None)


def test_the_window_of_timeline_and_top_is_a_duration():
    for name in ("timeline", "top"):
        command = dict(commands())[("gpuctl", name)]
        assert parse(("gpuctl", name), command, ["--span", "1d"])["span"] == 86400 * USEC
        assert parse(("gpuctl", name), command, ["--hours", "6"])["hours"] == 6.0  # kept, hidden


SPAN_KEY_WORDS = ("interval", "timeout", "grace", "before", "after", "retention", "horizon",
                  "longest_booking")


def span_keys():
    tables = {"daemon": config._DAEMON, "runner": config._RUNNER}
    for table, keys in tables.items():
        for key, (check, _) in keys.items():
            if any(word in key for word in SPAN_KEY_WORDS):
                yield table, key, check


def test_every_span_key_of_the_configuration_takes_seconds_or_the_grammar():
    keys = list(span_keys())
    assert len(keys) >= 13
    for table, key, check in keys:
        assert check(30) == 30.0, f"{table}.{key}"
        assert check("30m") == 1800.0, f"{table}.{key}"
        with pytest.raises(config._Bad, match=r"must be a number of seconds \(90\) or have a "
                                              r"unit, not '90'"):
            check("90")


def test_a_span_in_a_configuration_file_is_read(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text('[daemon]\nsample_interval = "1m"\ndead_owner_grace = 90\n'
                    '[runner]\ngrace = "1:00:00"\n')
    loaded = config.load_config(path)
    assert loaded.daemon.sample_interval == 60.0
    assert loaded.daemon.dead_owner_grace == 90.0
    assert loaded.runner.grace == 3600.0


def test_python_takes_seconds_or_the_grammar():
    assert span("duration", 90) == 90_000_000
    assert span("duration", "2:00:00") == 7_200_000_000
    with pytest.raises(InvalidArgs, match=r"90 what\? Give the unit"):
        span("duration", "90")


class Unreachable:
    """A link for the MCP server that answers every call that got past validation."""

    own: set = set()

    def call(self, fn):
        raise DaemonUnreachable("validated")

    def once(self, op_id, request, fn, dry_run):
        raise DaemonUnreachable("validated")


def mcp_span_arguments():
    """(server, tool, argument) for every MCP tool argument that is a span."""
    from resourced.agents.mcp import build_server

    server = build_server(link=Unreachable())
    found = []
    for tool in server.list_tools():
        for name, schema in tool["inputSchema"]["properties"].items():
            if "How long" in str(schema) or name in ("duration", "by"):
                found.append((tool, name))
    return server, found


def call(server, tool, arguments) -> str:
    required = {"operation_id": "op-1", "booking": "b1", "command": ["true"], "cwd": "/"}
    arguments = {k: v for k, v in required.items() if k in tool["inputSchema"]["properties"]
                 } | arguments
    return server.call_tool(tool["name"], arguments)["content"][0]["text"]


def test_every_mcp_span_takes_the_grammar_and_refuses_a_bare_number():
    server, spans = mcp_span_arguments()
    assert {(t["name"], n) for t, n in spans} >= {("claim", "duration"), ("book", "duration"),
                                                 ("recommend", "duration"), ("extend", "by")}
    for tool, name in spans:  # (run: the span is taken, then the configuration refuses)
        said = call(server, tool, {name: "1-12:00:00"})
        assert "validated" in said or said.startswith("NotAllowed: "), (tool["name"], name)
        for bare in (3600, "90"):
            said = call(server, tool, {name: bare})
            assert said.startswith(f"InvalidArgs: {name}: "), (tool["name"], name, said)
            assert "30m, 2h, 1d2h, 1w, 2:00:00 or 1-12:00:00" in said


# --- rule 2: one request vocabulary (--bus before the subcommand too) ---------------------


def sub_params(args: list[str], path: tuple, command: click.Command, rest: list[str]) -> dict:
    """The subcommand's parameters when gpuctl is given ``args`` before it."""
    ctx = cli.make_context("gpuctl", [*args, path[1]])
    for name in path[1:-1]:  # the groups between (blackout, notice, ...)
        ctx = ctx.command.get_command(ctx, name).make_context(name, [path[-1]], parent=ctx)
    return command.make_context(path[-1], list(rest), parent=ctx).params  # (click eats it)


def test_every_bus_option_may_come_before_the_subcommand():
    buses = [(path, opt) for path, opt in options() if "--bus" in opt.opts]
    assert len(buses) >= 30
    for path, opt in buses:
        command = dict(commands())[path]
        rest = with_required(command, opt, "session")[2:]
        assert sub_params(["--bus", "system"], path, command, rest)["bus"] == "system", path
        assert sub_params(["--bus", "system"], path, command,
                          ["--bus", "session", *rest])["bus"] == "session", path
        assert sub_params([], path, command, rest)["bus"] is None, path


# --- rule 12: habits from GPUBK and Slurm --------------------------------------------------


def test_slurm_short_options_mean_what_they_mean_in_slurm():
    """-G is --gpus and -t is --for (Slurm's --time) wherever the long option is."""
    for path, opt in options():
        if "--gpus" in opt.opts and path[1] != "demo":  # (demo's: how many simulated)
            assert "-G" in opt.opts, " ".join(path)
        if "--for" in opt.opts:
            assert "-t" in opt.opts, " ".join(path)
    shorts = [o for _, opt in options() for o in opt.opts if o in ("-G", "-t")]
    assert len(shorts) >= 12


# --- rule 1: one way to name a claim or a booking ------------------------------------------

NAMED_BY_REF = {"release", "env", "logs", "cancel", "extend", "edit", "bookings"}
"""The commands about one claim or booking that exists: each takes its REF as an argument."""
SEVERAL = {"release", "cancel", "bookings"}


def ref_argument(command: click.Command) -> click.Argument | None:
    return next((p for p in command.params if isinstance(p, click.Argument)
                 and p.name in ("ref", "refs")), None)


def test_every_command_about_a_claim_or_booking_takes_its_ref_as_the_argument():
    for path, command in commands():
        if any("--allocation" in p.opts for p in command.params if isinstance(p, click.Option)):
            if path[1] != "run":  # (its arguments are the command to run)
                assert ref_argument(command) is not None, " ".join(path)
        if path[1] in NAMED_BY_REF and len(path) == 2:
            argument = ref_argument(command)
            assert argument is not None, path[1]
            assert (argument.nargs == -1) == (path[1] in SEVERAL), path[1]


def test_release_and_env_take_the_ref_or_the_seeds_allocation_alike():
    for name in ("release", "env"):
        command = dict(commands())[("gpuctl", name)]
        by_argument = parse(("gpuctl", name), command, ["c1"])
        by_option = parse(("gpuctl", name), command, ["--allocation", "c1"])
        assert by_argument.get("refs", (by_argument.get("ref"),)) in (("c1",), ["c1"])
        assert by_option["allocation"] == "c1"


# --- rule 6: retries are safe, typos are loud ----------------------------------------------


def test_every_mistyped_option_gets_did_you_mean(capsys):
    from resourced.cli import main

    checked = 0
    for path, opt in options():
        name = next((o for o in opt.opts if o.startswith("--") and len(o) > 5), None)
        if name is None or name == "--help":
            continue
        typo = name[:-1] + ("x" if name[-1] != "x" else "y")  # --gpus -> --gpux
        assert main([*path[1:], typo]) == 2, (path, typo)
        said = capsys.readouterr().err
        # click 8.2 says "Did you mean", 8.1 "Possible options": the right one is named
        assert "No such option" in said and typo in said, (path, typo, said)
        assert "Did you mean" in said or "Possible options" in said, (path, typo, said)
        assert name in said.split(typo, 1)[1], (path, typo, said)
        checked += 1
    assert checked > 150


def test_a_claim_that_ended_is_named_with_when_and_how():
    from resourced.core.departed import Departed

    departed = Departed(kept=2)
    departed.note("c1", "released", 1_764_579_600_000_000)
    departed.note("c2", "forced", 1_764_579_600_000_000)
    assert departed.refusal("c1").message == "claim c1 ended 2025-12-01T09:00:00Z (released)"
    departed.note("c3", "expired", 0)
    assert "unknown or already released" in departed.refusal("c1").message  # the oldest goes
    assert "(forced)" in departed.refusal("c2").message


# --- rule 8: trying it outside the demo ----------------------------------------------------


def test_a_shared_bus_host_without_a_runtime_directory_keeps_its_files_in_dir(tmp_path):
    from resourced.daemon.main import StartupError, runtime_dir

    assert runtime_dir("shared", "", {}, shared=str(tmp_path)) == tmp_path / "runtime"
    assert runtime_dir("shared", "", {"XDG_RUNTIME_DIR": "/run/user/5"},
                       shared=str(tmp_path)) == Path("/run/user/5/resourced")
    with pytest.raises(StartupError, match="XDG_RUNTIME_DIR is not set"):
        runtime_dir("session", "", {})


def test_dev_demo_looks_only_for_what_the_demo_needs():
    import subprocess

    root = Path(__file__).resolve().parents[2]
    script = (root / "scripts" / "system-deps.sh").read_text()
    demo_part = script[script.index('if [ "${1:-}" = demo ]'):script.index('system=""')]
    assert "slurm" not in demo_part and "dunst" not in demo_part
    dev = (root / "dev").read_text()
    assert 'demo) setup demo;' in dev and 'test) setup test;' in dev
    assert subprocess.run(["sh", "-n", str(root / "dev")], check=False).returncode == 0


# --- rule 4: one JSON contract (errors) ----------------------------------------------------


def test_every_json_command_fails_in_json_too(capsys):
    """Under --json a failure is a JSON object on stdout, as the result would have been
    (and the line on stderr, for a person)."""
    import json

    from resourced.cli import main

    jsons = [(path, command) for path, command in commands()
             if any("--json" in p.opts for p in command.params if isinstance(p, click.Option))]
    assert len(jsons) >= 30
    for path, _ in jsons:
        assert main([*path[1:], "--json", "--no-such-option"]) == 2, path
        out, err = capsys.readouterr()
        error = json.loads(out)["error"]
        assert error == {"code": "InvalidArgs", "exit_code": 2, "message": error["message"]}
        assert "No such option" in error["message"] and "--no-such-option" in error["message"]
        assert err.startswith("gpuctl: No such option"), path


def schema_properties(schema, path=""):
    """(path, name, its schema) for every property that a JSON Schema names, nested ones too."""
    if isinstance(schema, dict):
        for name, sub in schema.get("properties", {}).items():
            yield f"{path}/{name}", name, sub
        for key, sub in schema.items():
            yield from schema_properties(sub, f"{path}/{key}" if key != "properties" else path)
    elif isinstance(schema, list):
        for sub in schema:
            yield from schema_properties(sub, path)


def test_gpus_is_a_list_in_every_output_and_a_count_says_so():
    """The same key, the same shape: ``gpus`` is always a list (the GPUs, or a holding's
    aliases), and a count of GPUs is ``gpus_requested`` or ``gpu_count``, in every output's
    schema (each held against the real output by tests/bus/test_json_contract.py)."""
    import json

    found, counts = [], set()
    for file in sorted((Path(__file__).parents[2] / "schemas" / "gpuctl").glob("*.json")):
        for path, name, sub in schema_properties(json.loads(file.read_text())):
            if name == "gpus" and sub.get("type") != "array":
                found.append(f"{file.name}{path}")
            if "gpu" in name and sub.get("type") == "integer" and not name.startswith("max_"):
                counts.add(name)  # (a limit keeps its configuration key's name)
    assert found == []
    assert counts <= {"gpus_requested", "gpu_count"}, counts


# --- rule 2: one request vocabulary ----------------------------------------------------------

REQUEST = {"--gpus", "-G", "--gpu", "--exclude", "--vram", "--ram", "--cpu", "--pool", "--label",
           "--task-name", "--for", "-t"}
"""What is asked for, as run, claim and book all take it."""


def test_run_claim_and_book_take_the_same_request_options():
    tree = dict(commands())
    for name in ("run", "claim", "book"):
        taken = {o for p in tree[("gpuctl", name)].params for o in getattr(p, "opts", ())}
        assert REQUEST <= taken, (name, sorted(REQUEST - taken))


# --- rule 11: the Python client ------------------------------------------------------------


def test_every_error_class_is_named_as_its_code():
    import resourced.errors as errors

    classes = [c for c in vars(errors).values() if isinstance(c, type)
               and issubclass(c, errors.ResourcedError) and c is not errors.ResourcedError]
    assert len(classes) >= 15
    assert [c.__name__ for c in classes if c.__name__ != c.code] == []
    assert errors.InvalidRequest is errors.InvalidArgs  # the earlier names still import
    assert errors.InteractionRequired is errors.InteractiveAuthorizationRequired


def test_json_on_a_command_without_it_says_what_gives_json(capsys):
    """gpuctl run --json suggested --session: a command that answers no record says so,
    and names the command whose --json has what was wanted."""
    from resourced.cli import JSON_INSTEAD, main

    without = {path[-1] for path, command in commands()
               if not any("--json" in p.opts for p in command.params
                          if isinstance(p, click.Option))}
    assert set(JSON_INSTEAD) <= without
    for name, instead in JSON_INSTEAD.items():
        assert main([name, "--json"]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"gpuctl: gpuctl {name} has no --json ({instead})"), err
        assert "Did you mean" not in err
