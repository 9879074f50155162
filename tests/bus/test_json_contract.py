"""One JSON contract: every command's --json output (and a failure's) is checked against
its JSON Schema in schemas/gpuctl/, on a daemon that holds something of each kind."""

import json
import subprocess
import sys
from pathlib import Path

import jsonschema

from ..conftest import eventually, gpuctl
from ..unit.test_dialect_rules import commands

SCHEMAS = Path(__file__).resolve().parents[2] / "schemas" / "gpuctl"


def with_json(args) -> list[str]:
    """``args`` with --json, before the command after -- if there is one."""
    args = list(args)
    at = args.index("--") if "--" in args else len(args)
    return [*args[:at], "--json", *args[at:]]


def ok_json(*args: str, env=None):
    r = gpuctl(*with_json(args), env=env)
    assert r.returncode == 0 and r.stdout, (args, r.returncode, r.stderr)
    return json.loads(r.stdout)


def populated(clock, owner, tmp_path) -> dict:
    """Something of each kind: claims whole, shared and of a pool, one waiting, bookings
    scheduled, active (with a command) and cancelled, a blackout and a notice. Their
    references."""
    env = {"XDG_STATE_HOME": str(tmp_path / "state"), "XDG_CONFIG_HOME": str(tmp_path)}
    pid = str(owner.pid)
    refs = {"whole": ok_json("claim", "--gpus", "1", "--owner-pid", pid, "--session", "s1",
                             "--label", "whole")["allocation"]["ref"],
            "share": ok_json("claim", "--vram", "10G", "--ram", "1G", "--owner-pid", pid,
                             "--session", "s1")["allocation"]["ref"]}
    refs["booked"] = ok_json("book", "1", "1h", "--at", "+2h", "--op-id", "b-1", "--", "true",
                             env=env)["booking"]["id"]
    refs["active"] = ok_json("book", "1", "30m", "--session", "s1")["booking"]["id"]
    refs["gone"] = ok_json("book", "1", "1h", "--at", "+3h")["booking"]["id"]
    ok_json("cancel", refs["gone"])
    ok_json("blackout", "add", "--from", "+5h", "--until", "+6h", "--reason", "driver")
    ok_json("notice", "add", "maintenance tonight", "--until", "+12h")
    waiting = subprocess.Popen([sys.executable, "-m", "resourced.cli", "run", "--gpus", "4",
                                "--wait", "--", "true"], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    eventually(lambda: ok_json("queue"), timeout=10)
    clock.advance(3600)  # an hour of use, for the usage history
    eventually(lambda: ok_json("usage", "--since", "2h"), timeout=10)
    return {"refs": refs, "env": env, "waiting": waiting}


def invocations(refs: dict, tmp_path: Path, pid: int) -> dict[str, list[list[str]]]:
    """For each schema, the commands whose --json output it describes (``tmp_path``: for
    the files some of them read or write)."""
    config, shared = tmp_path / "config.toml", tmp_path / "shared"
    return {
        "status": [["status"]], "free": [["free"]], "queue": [["queue"]],
        "verify": [["verify"]], "sessions": [["sessions"], ["sessions", "--all"]],
        "usage": [["usage", "--since", "2h"], ["usage", "--since", "2h", "--by", "gpu"]],
        "bookings": [["bookings", "--all"]],
        "booking": [["bookings", refs["booked"]]],
        "book": [["book", "1", "1h", "--at", "+8h", "--dry-run"],
                 ["edit", refs["booked"], "--for", "2h"], ["extend", refs["booked"], "--by", "30m"],
                 ["cancel", refs["gone"]]],
        "slots": [["slots", "--gpus", "1", "--for", "1h"]],
        "timeline": [["timeline", "--span", "6h"]],
        "blackouts": [["blackout", "list"]], "notices": [["notice", "list"]],
        "claim": [["claim", "--gpus", "1", "--owner-pid", str(pid), "--dry-run"]],
        "blackout": [["blackout", "add", "--from", "+7h", "--until", "+8h", "--reason", "r"]],
        "notice": [["notice", "add", "hello"]],
        "shell-env": [["shell", "env"]],
        "init": [["init", "--output", str(tmp_path / "init.toml")]],
        "connect": [["connect", str(shared), "--no-check"]],
        "env": [["env", refs["whole"]]],
        "env-container": [["env", refs["whole"], "--docker"], ["env", refs["whole"], "--podman"]],
        "agent-context": [["agent", "context"]],
        "agent-recommend": [["agent", "recommend", "--gpus", "1", "--for", "1h"]],
        "resources": [["resources"]],
        "config-check": [["config", "check", str(config)]],
        "doctor": [["doctor"]],
        "slurm-config": [["slurm", "config"]],
        "release": [["release", refs["share"]]],
        "stop": [["stop", "--session", "s1", "--dry-run"]],
        "error": [["release", "cnosuch"], ["bookings", "bnosuch"]],
    }


def test_every_json_output_matches_its_schema(clocked_daemon, clock, owner, tmp_path, request):
    clocked_daemon(gpus=4)
    made = populated(clock, owner, tmp_path)
    (tmp_path / "config.toml").write_text("[daemon]\nsample_interval = 30\n")
    (tmp_path / "shared").mkdir()
    wrong = []
    request.addfinalizer(made["waiting"].kill)
    for name, invoked in invocations(made["refs"], tmp_path, owner.pid).items():
        schema = json.loads((SCHEMAS / f"{name}.json").read_text())
        for args in invoked:
            r = gpuctl(*with_json(args), env=made["env"])
            try:
                jsonschema.validate(json.loads(r.stdout), schema)
            except (ValueError, jsonschema.ValidationError) as exc:
                wrong.append(f"gpuctl {' '.join(args)} --json (exit {r.returncode}): "
                             f"{str(exc).splitlines()[0]}\n{r.stdout[:500]}{r.stderr[:300]}")
    assert not wrong, "\n\n".join(wrong)


def test_every_schema_is_valid_and_every_json_command_has_one():
    names = {p.stem for p in SCHEMAS.glob("*.json")}
    for name in sorted(names):
        schema = json.loads((SCHEMAS / f"{name}.json").read_text())
        jsonschema.Draft202012Validator.check_schema(schema)
        assert schema["title"].startswith("gpuctl") or name == "error", name
    used = invocations(dict.fromkeys(("whole", "share", "booked", "gone"), "x"), Path("x"), 1)
    assert names == set(used)
    tree = {path[1:]: command for path, command in commands()}
    covered = set()
    for commands_of in used.values():
        for args in commands_of:
            covered |= {tuple(args[:n]) for n in (1, 2) if tuple(args[:n]) in tree}
    with_json = {path for path, command in tree.items()
                 if any("--json" in getattr(p, "opts", ()) for p in command.params)}
    assert with_json <= covered, sorted(with_json - covered)
