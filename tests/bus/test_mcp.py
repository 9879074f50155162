"""resourced-mcp through the MCP SDK's own stdio client, against a real private daemon.

Each test spawns the installed ``resourced-mcp`` (next to this interpreter) with this
process's environment (the private bus, the simulated clock), talks to it with
``mcp.client.stdio.stdio_client`` and ``ClientSession``, and gives up after TIMEOUT seconds.
The tests of ``run`` and its kin use ``test_runner``'s daemon, runner and jobs directory.
"""

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import anyio
import pytest
from mcp import ClientSession
from mcp.client import stdio

from resourced.agents.mcp import INSTRUCTIONS
from resourced.client.sync import Client
from resourced.runner import jobs

from ..conftest import ROOT, eventually
from . import test_runner
from .test_agent import CONTEXT_KEYS
from .test_runner import WAIT, ok, runner

job_env, jobs_daemon = test_runner.job_env, test_runner.jobs_daemon  # (its fixtures)

SERVER = Path(sys.executable).with_name("resourced-mcp")
TIMEOUT = 30
WRITES = {"claim", "book", "release", "extend", "cancel", "run", "stop"}
READS = {"context", "recommend", "list", "usage", "job", "logs"}


def session(scenario, timeout: float = TIMEOUT, env: dict | None = None):
    """Run ``await scenario(session)`` against a fresh resourced-mcp (with ``env``, else
    this process's environment); its result."""
    async def main():
        with anyio.fail_after(timeout):
            params = stdio.StdioServerParameters(command=str(SERVER),
                                                 env=dict(os.environ if env is None else env))
            async with stdio.stdio_client(params) as (read, write), \
                    ClientSession(read, write) as s:
                await s.initialize()
                return await scenario(s)

    return anyio.run(main)


async def call(s, tool: str, **arguments) -> dict:
    """A tool's structured answer; fails the test on a tool error."""
    result = await s.call_tool(tool, arguments)
    assert not result.is_error, result.content[0].text
    return result.structured_content


async def refused(s, tool: str, **arguments) -> str:
    """The text of a tool error (fails the test if the call succeeds)."""
    result = await s.call_tool(tool, arguments)
    assert result.is_error, result.structured_content
    return result.content[0].text


def test_tools_say_what_they_do_and_every_write_needs_an_operation_id():
    async def scenario(s):
        return {t.name: t for t in (await s.list_tools()).tools}, \
            await s.call_tool("claim", {"gpus": 1})

    tools, missing = session(scenario)
    assert missing.is_error and "operation_id" in missing.content[0].text
    assert set(tools) == READS | WRITES
    for name in READS:
        assert tools[name].annotations.read_only_hint is True, name
    for name in WRITES:
        hints = tools[name].annotations
        assert hints.read_only_hint is False, name
        assert hints.destructive_hint is (name in {"release", "cancel", "run", "stop"}), name
        assert hints.idempotent_hint is True, name
        assert "operation_id" in tools[name].input_schema["required"], name
        assert tools[name].input_schema["properties"]["dry_run"]["type"] == "boolean"
    # an optional number has its plain type (a client converts what was typed by it), and
    # is not required
    claim = tools["claim"].input_schema
    for name in ("owner_pid", "gpus"):
        assert claim["properties"][name]["type"] == "integer" and name not in claim["required"]
    assert "history of the last week" in tools["usage"].description
    for code in ("NoSuchClaim", "NotClaimOwner", "InteractiveAuthorizationRequired"):
        assert code in INSTRUCTIONS, code


def test_the_context_tool_is_the_agent_context(clocked_daemon):
    clocked_daemon(gpus=2)

    async def scenario(s):
        return await call(s, "context"), await s.call_tool("context", {})

    data, raw = session(scenario)
    assert set(data) == CONTEXT_KEYS and data["schema"] == 4
    assert data["me"]["uid"] == os.getuid() and data["now"] == "2026-12-01T09:00:00Z"
    assert data["free"]["gpus"] == ["gpu0", "gpu1"]
    assert json.loads(raw.content[0].text)["schema"] == 4   # the same as text, for any client


def test_a_booking_is_replayed_by_its_operation_id_and_a_conflict_names_its_code(clocked_daemon):
    clocked_daemon(gpus=4)

    async def scenario(s):
        first = await call(s, "book", operation_id="train-1", gpus=3, duration="1h",
                           start="2026-12-01T10:00:00Z", task_name="train")
        again = await call(s, "book", operation_id="train-1", gpus=3, duration="1h",
                           start="2026-12-01T10:00:00Z", task_name="train")
        conflict = await refused(s, "book", operation_id="train-2", gpus=2, duration="1h",
                                 start="2026-12-01T10:30:00Z")
        other = await refused(s, "book", operation_id="train-1", gpus=1, duration="2h")
        mine = await call(s, "list")
        return first, again, conflict, other, mine

    first, again, conflict, other, mine = session(scenario)
    assert first["status"] == "created" and again["status"] == "exists"
    assert again["booking"]["id"] == first["booking"]["id"]
    assert first["booking"]["start"] == "2026-12-01T10:00:00Z"
    assert conflict.startswith("NotEnoughCapacity: "), conflict
    assert other.startswith("InvalidArgs: "), other
    assert [b["id"] for b in mine["bookings"]] == [first["booking"]["id"]]


def test_a_dry_run_booking_changes_nothing(clocked_daemon):
    clocked_daemon(gpus=2)

    async def scenario(s):
        await call(s, "book", operation_id="a", gpus=1, duration="1h", start="10:00")
        before = await call(s, "list")
        tried = await call(s, "book", operation_id="b", gpus=2, duration="2h", start="11:00",
                           dry_run=True)
        return before, tried, await call(s, "list")

    before, tried, after = session(scenario)
    assert tried["status"] == "dry-run" and tried["booking"]["start"] == "2026-12-01T11:00:00Z"
    assert after["bookings"] == before["bookings"] and len(after["bookings"]) == 1
    with Client() as c:
        assert len(c.bookings()) == 1


def test_extend_and_cancel_a_booking_with_operation_ids(clocked_daemon, clock):
    clocked_daemon(gpus=2)

    async def scenario(s):
        made = await call(s, "book", operation_id="b1", gpus=1, duration="1h", start="10:00")
        ref = made["booking"]["id"]
        longer = await call(s, "extend", operation_id="e1", booking=ref, by="30m")
        replay = await call(s, "extend", operation_id="e1", booking=ref, by="30m")
        both = await refused(s, "extend", operation_id="e2", booking=ref, by="1h", until="13:00")
        gone = await call(s, "cancel", operation_id="c1", booking=ref, reason="not needed")
        clock.advance(60)
        again = await call(s, "cancel", operation_id="c2", booking=ref, reason="not needed")
        return longer, replay, both, gone, again

    longer, replay, both, gone, again = session(scenario)
    assert longer["booking"]["end"] == replay["booking"]["end"] == "2026-12-01T11:30:00Z"
    assert longer["status"] == "changed"   # as book's answer, and gpuctl extend --json
    assert both.startswith("InvalidArgs: ")
    assert gone["booking"]["state"] == "ended"
    assert (gone["status"], again["status"]) == ("changed", "unchanged")  # as gpuctl cancel


def test_claim_replay_and_release(clocked_daemon):
    clocked_daemon(gpus=2)

    async def scenario(s):
        me = (await call(s, "context"))["me"]
        took = await call(s, "claim", operation_id="c-1", gpus=1, task_name="tune")
        again = await call(s, "claim", operation_id="c-1", gpus=1, task_name="tune")
        other = await refused(s, "claim", operation_id="c-1", gpus=2)
        short = await refused(s, "claim", operation_id="c-2", gpus=5)
        held = await call(s, "list")
        used = await call(s, "usage")
        ref = took["allocation"]["ref"]
        gave = await call(s, "release", operation_id="r-1", ref=ref)
        replay = await call(s, "release", operation_id="r-1", ref=ref)
        unknown = await refused(s, "release", operation_id="r-2", ref=ref)
        return me, took, again, other, short, held, used, gave, replay, unknown, \
            await call(s, "list")

    me, took, again, other, short, held, used, gave, replay, unknown, after = session(scenario)
    ref = took["allocation"]["ref"]
    assert again["allocation"]["ref"] == ref and again == took
    assert took["owner_pid"] == me["pid"]                 # the server: ends with the session
    assert took["env"]["CUDA_VISIBLE_DEVICES"]
    assert other.startswith("InvalidArgs: ") and "operation id" in other
    assert short.startswith(("NotEnoughGPUs: ", "NotEnoughCapacity: ", "InvalidArgs: ")), short
    assert [(k["id"], k["owner_pid"], k["task_name"]) for k in held["claims"]] == [
        (ref, me["pid"], "tune")]
    assert (used["holding"]["claims"], used["holding"]["gpu_count"]) == (1, 1)
    assert gave == replay and gave["released"] is True
    assert unknown.startswith("NoSuchClaim: ")
    assert after["claims"] == []


def test_a_claim_ends_with_the_mcp_session_unless_an_owner_pid_keeps_it(clocked_daemon):
    clocked_daemon(gpus=2)
    keeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        async def scenario(s):
            mine = await call(s, "claim", operation_id="mine", gpus=1)
            kept = await call(s, "claim", operation_id="kept", gpus=1, owner_pid=keeper.pid)
            return mine["allocation"]["ref"], kept["allocation"]["ref"]

        mine, kept = session(scenario)

        def live():
            with Client() as c:
                return {k["id"] for k in c.status()["claims"]}

        eventually(lambda: live() == {kept}, timeout=10)
        assert mine not in live()
    finally:
        keeper.kill()
        keeper.wait()


def test_usage_sums_what_i_hold_and_have_booked_ahead(clocked_daemon):
    clocked_daemon(gpus=4)

    async def scenario(s):
        await call(s, "claim", operation_id="c", gpus=1)
        await call(s, "claim", operation_id="v", gpus=0, vram="10G")
        await call(s, "book", operation_id="b1", gpus=2, duration="90m", start="10:00")
        await call(s, "book", operation_id="b2", gpus=1, duration="1h", start="13:00")
        return await call(s, "usage")

    used = session(scenario)
    assert used["holding"] == {"claims": 2, "waiting": 0, "gpu_count": 1, "vram_bytes": 10 * 2**30,
                               "pools": {}}
    assert used["booked_ahead"]["bookings"] == 2
    assert used["booked_ahead"]["gpu_hours"] == 4.0
    assert used["booked_ahead"]["next_start"] == "2026-12-01T10:00:00Z"


def test_usage_has_my_history_of_the_last_week(clocked_daemon, clock):
    clocked_daemon(gpus=2)

    async def scenario(s):
        ref = (await call(s, "claim", operation_id="c", gpus=1))["allocation"]["ref"]
        clock.set("2026-12-01T11:00:00Z")  # held for 2 h, never used
        live = await call(s, "usage")
        await call(s, "release", operation_id="r", ref=ref)
        return live, await call(s, "usage"), json.loads(
            (await s.read_resource("resourced://usage")).contents[0].text)

    live, ended, read = session(scenario)
    assert live["history"] == {"since": "2026-11-24T11:00:00Z", "until": "2026-12-01T11:00:00Z",
                               "claims": 1, "bookings": 0, "held_gpu_hours": 2.0,
                               "used_gpu_hours": 0.0, "idle_gpu_hours": 2.0,
                               "booked_gpu_hours": 0.0, "booked_idle_gpu_hours": 0.0}
    assert ended["history"] == live["history"]       # released: from the recorded history
    assert ended["holding"]["claims"] == 0
    assert read["history"] == ended["history"]       # the resource says the same


def test_recommend_runs_now_what_fits_now_and_books_what_fits_later(clocked_daemon):
    clocked_daemon(gpus=2)

    async def scenario(s):
        await call(s, "book", operation_id="b", gpus=2, duration="1h", start="09:30")
        return (await call(s, "recommend", gpus=1, duration="30m"),
                await call(s, "recommend", gpus=2, duration="1h"))

    now, later = session(scenario)
    assert now == {"fits": True, "now": True, "gpu_indices": [0],
                   "command": "gpuctl run --gpus 1 --for 30m -- COMMAND"}
    assert (later["now"], later["start"]) == (False, "2026-12-01T10:30:00Z")


def test_a_dry_run_claim_takes_nothing(clocked_daemon):
    clocked_daemon(gpus=2)

    async def scenario(s):
        tried = await call(s, "claim", operation_id="d", gpus=1, dry_run=True)
        return tried, await call(s, "list")

    tried, after = session(scenario)
    assert tried["dry_run"] is True
    assert after["claims"] == []


def test_a_dry_run_release_keeps_the_claim(clocked_daemon):
    clocked_daemon(gpus=2)

    async def scenario(s):
        ref = (await call(s, "claim", operation_id="c", gpus=1))["allocation"]["ref"]
        await call(s, "release", operation_id="r", ref=ref, dry_run=True)
        return ref, await call(s, "list")

    ref, after = session(scenario)
    assert [k["id"] for k in after["claims"]] == [ref]


def test_resources_and_the_prompt(clocked_daemon):
    clocked_daemon(gpus=2)

    async def scenario(s):
        listed = {str(r.uri): r for r in (await s.list_resources()).resources}
        context = await s.read_resource("resourced://context")
        usage = await s.read_resource("resourced://usage")
        prompts = {p.name: p for p in (await s.list_prompts()).prompts}
        plan = await s.get_prompt("plan_gpu_work", {"what": "fine-tune the model", "gpus": "2",
                                                    "duration": "3h"})
        return listed, context, usage, prompts, plan

    listed, context, usage, prompts, plan = session(scenario)
    assert set(listed) == {"resourced://context", "resourced://usage"}
    assert all(r.mime_type == "application/json" for r in listed.values())
    data = json.loads(context.contents[0].text)
    assert set(data) == CONTEXT_KEYS and data["schema"] == 4
    assert json.loads(usage.contents[0].text)["holding"]["claims"] == 0
    assert [(a.name, a.required) for a in prompts["plan_gpu_work"].arguments] == [
        ("what", True), ("gpus", False), ("duration", False)]
    text = plan.messages[0].content.text
    for step in ("`context`", "`claim`", "`book`", "operation", "`release`", "3h", "2 GPU"):
        assert step in text, step


def test_it_needs_no_mcp_sdk(tmp_path):
    """With no MCP SDK (nor pydantic) importable, the server answers the handshake, lists
    its tools and refuses a call without its operation_id, and exits 0 at the end of its
    input."""
    for name in ("mcp", "mcp_types", "pydantic", "anyio"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(f"raise ImportError('no {name} here')\n")
    lines = [{"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                 "protocolVersion": "2025-06-18", "capabilities": {},
                 "clientInfo": {"name": "test", "version": "0"}}},
             {"jsonrpc": "2.0", "method": "notifications/initialized"},
             {"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
             {"jsonrpc": "2.0", "id": 3, "method": "tools/call",
              "params": {"name": "claim", "arguments": {"gpus": 1}}}]
    done = subprocess.run([str(SERVER)], env={**os.environ, "PYTHONPATH": str(tmp_path)},
                          input="".join(json.dumps(m) + "\n" for m in lines),
                          capture_output=True, text=True, timeout=TIMEOUT, check=False)
    assert (done.returncode, done.stderr) == (0, "")
    answers = {m["id"]: m["result"] for m in map(json.loads, done.stdout.splitlines())}
    assert answers[1]["protocolVersion"] == "2025-06-18"
    assert answers[1]["serverInfo"]["name"] == "resourced"
    assert {t["name"] for t in answers[2]["tools"]} == READS | WRITES
    assert answers[3] == {"content": [{"type": "text", "text": "InvalidArgs: operation_id is "
                                                               "required"}], "isError": True}


def test_hostile_input_gets_errors_and_the_server_goes_on(daemon):
    """Deep nesting, a line of 2 MB and a flood of 300 calls: each an error or an answer,
    and the server answers the ping after them and exits 0 at the end of its input."""
    flood = [{"jsonrpc": "2.0", "id": 100 + n, "method": "tools/call",
              "params": {"name": "list", "arguments": {}}} for n in range(300)]
    lines = [b"[" * 100_000, b'"' + b"x" * (2 << 20) + b'"',
             *(json.dumps(m).encode() for m in flood),
             json.dumps({"jsonrpc": "2.0", "id": 1, "method": "ping"}).encode()]
    done = subprocess.run([str(SERVER)], input=b"".join(line + b"\n" for line in lines),
                          capture_output=True, timeout=TIMEOUT, check=False)
    assert (done.returncode, done.stderr) == (0, b"")
    replies = [json.loads(line) for line in done.stdout.splitlines()]
    assert [r["error"]["code"] for r in replies[:2]] == [-32700, -32700]
    by_id = {r["id"]: r for r in replies[2:]}
    assert by_id[1]["result"] == {}
    assert set(by_id) == {1, *(m["id"] for m in flood)}  # every call answered, one way
    assert all("result" in r or r["error"]["code"] == -32000 for r in by_id.values())


def test_a_mistyped_argument_is_refused_on_every_tool_and_nothing_is_done(daemon):
    """``durration`` once made a claim with no end; ``gpu`` a claim of the default one."""
    async def scenario(s):
        listed = {t.name: t for t in (await s.list_tools()).tools}
        texts = {name: await refused(s, name, operation_id="op-1", durration="2h")
                 for name in listed}
        return listed, texts, await refused(s, "claim", gpu=1, operation_id="op-2")

    listed, texts, claim = session(scenario)
    for name, text in texts.items():
        assert "unknown argument 'durration'" in text, (name, text)
        assert listed[name].input_schema["additionalProperties"] is False, name
    assert "unknown argument 'gpu' (did you mean gpus?)" in claim
    with Client() as c:
        assert c.status()["claims"] == []


def test_an_optional_argument_given_as_null_is_left_out(daemon):
    async def scenario(s):
        return await call(s, "claim", operation_id="n-1", gpus=1, owner_pid=None,
                          duration=None)

    took = session(scenario)
    assert took["allocation"]["until_usec"] == 0 and took["env"]["CUDA_VISIBLE_DEVICES"]


INSPECTOR = ROOT / ".venv-tools" / "mcp-inspector" / "node_modules" / ".bin" / "mcp-inspector"


@pytest.mark.skipif(not INSPECTOR.exists(),
                    reason="no MCP Inspector here (./dev test installs it, with npm)")
def test_the_official_inspector_passes_numbers_to_the_tools_as_numbers(daemon, owner):
    """The Inspector's CLI converts a --tool-arg by the schema's type: for
    anyOf [integer, null] it sent "1", and the claim was refused.  (It passes the server
    only the variables it is given: the bus's address with -e.)"""
    def inspector(*args: str) -> dict:
        bus = f"DBUS_SESSION_BUS_ADDRESS={os.environ['DBUS_SESSION_BUS_ADDRESS']}"
        done = subprocess.run([str(INSPECTOR), "--cli", "-e", bus, str(SERVER), *args],
                              capture_output=True, text=True, timeout=TIMEOUT, check=False)
        assert done.returncode == 0, done.stdout + done.stderr
        return json.loads(done.stdout)

    listed = {t["name"] for t in inspector("--method", "tools/list")["tools"]}
    assert listed == READS | WRITES
    took = inspector("--method", "tools/call", "--tool-name", "claim", "--tool-arg", "gpus=2",
                     "--tool-arg", "operation_id=inspector-1", "--tool-arg",
                     f"owner_pid={owner.pid}")
    assert took["isError"] is False, took
    allocation = took["structuredContent"]["allocation"]
    assert len(allocation["gpu_uuids"]) == 2
    with Client() as c:
        c.release(allocation["ref"])


# -- run, job, logs, stop: a command started by the user's runner, if [mcp] allows it ----

PRINT = "python3", "-c", "print('hello from the job', flush=True)"
LONG = "python3", "-c", "import time; print('up', flush=True); time.sleep(60)"


def configured(env: dict, tmp_path, text: str) -> dict:
    """``env`` with a configuration file holding ``text``."""
    path = tmp_path / "config.toml"
    path.write_text(text)
    return {**env, "RESOURCED_CONFIG": str(path)}


def allowing(folder, commands=("python3",)) -> str:
    listed = ", ".join(f"'{c}'" for c in commands)
    return f"[mcp]\nrun = true\nallow_commands = [{listed}]\nallow_dirs = ['{folder}']\n"


async def finished(s, ref: str) -> dict:
    """The job tool's answer once the job is over."""
    with anyio.fail_after(WAIT):
        while not (answer := await call(s, "job", job=ref))["final"]:
            await anyio.sleep(0.05)
    return answer


def test_run_refuses_what_the_user_did_not_allow_and_starts_nothing(job_env, tmp_path):
    work, elsewhere = tmp_path / "work", tmp_path / "elsewhere"
    work.mkdir()
    elsewhere.mkdir()
    (work / "out").symlink_to(elsewhere)
    env = configured(job_env, tmp_path, "")
    config = tmp_path / "config.toml"

    async def scenario(s):
        run = {"operation_id": "r-1", "duration": "10m", "gpus": 1}
        said = {"off": await refused(s, "run", command=list(PRINT), cwd=str(work), **run)}
        config.write_text(allowing(work))  # read again at each call
        said["command"] = await refused(s, "run", command=["sh", "-c", "echo hi"],
                                        cwd=str(work), **run)
        said["folder"] = await refused(s, "run", command=list(PRINT), cwd=str(elsewhere), **run)
        said["link"] = await refused(s, "run", command=list(PRINT), cwd=str(work / "out"), **run)
        said["runner"] = await refused(s, "run", command=list(PRINT), cwd=str(work), **run)
        listed = {t.name: t for t in (await s.list_tools()).tools}
        return said, listed["run"].description, await call(s, "context"), await call(s, "list")

    said, description, context, mine = session(scenario, env=env)
    assert said["off"].startswith("NotAllowed: ") and "mcp.run" in said["off"], said["off"]
    assert str(config) in said["off"]
    assert "sh -c 'echo hi' is not allowed: mcp.allow_commands" in said["command"]
    assert "mcp.allow_dirs" in said["folder"] and str(elsewhere) in said["folder"]
    assert "mcp.allow_dirs" in said["link"] and str(elsewhere) in said["link"]  # resolved
    assert "no runner is running" in said["runner"] and "gpuctl runner" in said["runner"]
    assert "Off here" in description  # as the file said when the server started
    assert context["mcp_jobs"] == {"run": True, "allow_commands": ["python3"],
                                   "allow_dirs": [str(work)], "config": str(config),
                                   "problem": None, "runner": False}
    assert mine["bookings"] == [] and mine["claims"] == []
    assert jobs.job_ids(jobs.jobs_dir(job_env)) == []


def test_a_run_job_runs_through_the_runner_and_outlives_the_mcp_session(job_env, tmp_path):
    env = configured(job_env, tmp_path, allowing(tmp_path))
    with runner(job_env, tmp_path):
        async def first(s):
            ran = await call(s, "run", operation_id="hello", command=list(PRINT),
                             cwd=str(tmp_path), duration="10m", gpus=1, session="mcp-test")
            again = await call(s, "run", operation_id="hello", command=list(PRINT),
                               cwd=str(tmp_path), duration="10m", gpus=1, session="mcp-test")
            over = await finished(s, ran["job"])
            output = await call(s, "logs", job=ran["job"])
            rest = await call(s, "logs", job=ran["job"], offset=output["next_offset"])
            long = await call(s, "run", operation_id="long", command=list(LONG),
                              cwd=str(tmp_path), duration="10m", gpus=1, session="mcp-test")
            return ran, again, over, output, rest, long

        ran, again, over, output, rest, long = session(first, env=env)
        assert ran["status"] == "started" and ran["started"] is True
        assert again["status"] == "exists" and again["job"] == ran["job"]
        assert ran["booking"]["gpu_indices"] and ran["session"] == "mcp-test"
        kept = jobs.load(jobs.jobs_dir(job_env), ran["job"])
        assert (kept.argv, kept.cwd, kept.origin) == (list(PRINT), str(tmp_path), "mcp")
        assert ran["booking"]["task_name"] == shlex.join(PRINT)
        assert ran["booking"]["label"] == f"mcp {tmp_path}"
        assert (over["state"], over["exit_code"]) == ("succeeded", 0)
        assert output["text"] == "hello from the job\n" and output["final"]
        assert (rest["text"], rest["more"]) == ("", False)

        def held() -> set:  # its booking ended with it: its claim is gone
            with Client() as c:
                return {k["id"] for k in c.status()["claims"]}

        eventually(lambda: ran["job"] not in held(), WAIT)
        with Client() as c:
            assert c.booking(ran["job"])["ended"] == "released"

        # the long one runs on without the MCP session that started it
        ref = long["job"]
        assert long["state"] == "running", long
        job = jobs.load(jobs.jobs_dir(job_env), ref)
        assert jobs.alive(job) and job.session == "mcp-test"
        assert "mcp-test" in ok(job_env, "sessions").stdout
        ok(job_env, "stop", "--session", "mcp-test")

        async def second(s):  # a new session finds it again, and sees it stopped; and
            stopped = await finished(s, ref)  # the stop tool ends another
            other = await call(s, "run", operation_id="long-2", command=list(LONG),
                               cwd=str(tmp_path), duration="10m", gpus=1)
            return stopped, await call(s, "logs", job=ref), \
                await call(s, "stop", operation_id="stop-2", job=other["job"])

        over, output, other = session(second, env=env)
        assert over["state"] == "cancelled" and output["text"].startswith("up\n")
        assert (other["state"], other["booking"]["state"]) == ("cancelled", "ended"), other
        eventually(lambda: jobs.process_start(job.pid) is None, WAIT)
