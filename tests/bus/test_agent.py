"""gpuctl agent: the one-call context, placements, instructions and the skill folder."""

import json
import os

import pytest

from ..conftest import gpuctl

CONTEXT_KEYS = {"schema", "now", "me", "daemon", "holding", "free", "next", "queue", "health",
                "notices", "limits", "mcp_jobs", "commands"}


@pytest.fixture
def agent_env(start_daemon, tmp_path):
    clock = tmp_path / "clock"
    clock.write_text("2026-12-01T09:00:00Z")
    env = {"RESOURCED_SIMULATED_CLOCK": str(clock), "TZ": "UTC"}
    daemon = start_daemon(gpus=2, env=env)
    return {**env, "RESOURCED_SIMULATED_GPUS": "2"}, daemon


def run(env, *args) -> str:
    done = gpuctl(*args, env=env)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_context_lists_the_next_live_bookings_and_says_when_there_are_more(
        agent_env, monkeypatch):
    from resourced.agents import context as agent_context
    from resourced.client.sync import Client

    env, _ = agent_env
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(agent_context, "CONTEXT_BOOKINGS", 2)
    refs = [run(env, "book", "--gpus", "1", "--for", "1h", "--at", f"+{h}h").strip()
            for h in (3, 1, 2)]
    with Client() as c:
        data = agent_context.context(c)
        assert [b["id"] for b in data["holding"]["bookings"]] == [refs[1], refs[2]]
        assert data["holding"]["more_bookings"] is True
        run(env, "cancel", refs[0])
        data = agent_context.context(c)  # the cancelled one is not live: all are listed
    assert [b["id"] for b in data["holding"]["bookings"]] == [refs[1], refs[2]]
    assert data["holding"]["more_bookings"] is False


def test_context_says_what_i_hold_what_is_free_and_when_next(agent_env):
    env, daemon = agent_env
    booked = run(env, "book", "--gpus", "2", "--for", "1h", "--at", "+30m").strip()
    claimed = run(env, "claim", "--gpus", "1", "--owner-pid", str(daemon.proc.pid)).strip()
    data = json.loads(run(env, "agent", "context", "--json"))
    assert set(data) == CONTEXT_KEYS and data["schema"] == 4
    assert data["me"]["uid"] == os.getuid()
    assert [c["id"] for c in data["holding"]["claims"]] == [claimed]
    assert data["holding"]["claims"][0]["until_booking"] == booked
    assert [b["id"] for b in data["holding"]["bookings"]] == [booked]
    assert data["free"]["gpus"] == ["gpu1"]
    assert set(data["next"]) == {"one_gpu", "all_gpus"}  # whatever the machine's GPU count
    for name, gpus in (("one_gpu", 1), ("all_gpus", 2)):
        place = data["next"][name]
        assert (place["gpu_count"], place["duration_usec"]) == (gpus, 3600 * 10**6)
        assert (place["start"], place["end"]) == ("2026-12-01T10:30:00Z", "2026-12-01T11:30:00Z")
    assert data["limits"]["max_claims_per_user"] == 1024
    assert "--owner-pid" in data["commands"]["claim"]
    text = run(env, "agent", "context")
    assert "1 claim(s), 1 booking(s)" in text
    assert "next 2 GPU(s) for 1h: 2026-12-01T10:30:00Z" in text


def test_recommend_runs_now_what_fits_now_and_books_what_fits_later(agent_env):
    env, _ = agent_env
    run(env, "book", "--gpus", "2", "--for", "1h", "--at", "+30m")
    now = json.loads(run(env, "agent", "recommend", "--gpus", "1", "--for", "30m", "--json"))
    assert now == {"schema": 2, "fits": True, "now": True, "gpu_indices": [0],
                   "command": "gpuctl run --gpus 1 --for 30m -- COMMAND"}
    later = json.loads(run(env, "agent", "recommend", "--gpus", "2", "--for", "1h", "--json"))
    assert (later["now"], later["start"]) == (False, "2026-12-01T10:30:00Z")
    command = later["command"].replace("ID", "agent-1").split()
    assert run(env, *command[1:]).strip().startswith("b")  # the command books as printed
    assert run(env, "bookings", "--all").count("scheduled") == 2


def test_the_skill_folder_holds_the_instructions_behind_front_matter(tmp_path):
    home = tmp_path / "home"
    done = gpuctl("agent", "skill", "install", "--agent", "claude", env={"HOME": str(home)})
    assert done.returncode == 0, done.stderr
    written = home / ".claude" / "skills" / "resourced-gpus" / "SKILL.md"
    assert done.stdout.strip() == str(written)
    assert [p.relative_to(home) for p in home.rglob("*") if p.is_file()] == [
        written.relative_to(home)]  # that file, nowhere else
    text = written.read_text()
    front, body = text.split("---\n")[1], text.split("---\n", 2)[2]
    fields = dict(line.split(": ", 1) for line in front.strip().splitlines())
    assert fields["name"] == "resourced-gpus" and len(fields["description"]) <= 1024
    assert body == "\n" + gpuctl("agent", "instructions").stdout
    assert "--owner-pid" in body and "--op-id" in body
    codex = gpuctl("agent", "skill", "install", "--agent", "codex", env={"HOME": str(home)})
    assert codex.returncode == 2 and "--dir" in codex.stderr
    shown = gpuctl("agent", "skill", "install", "--agent", "codex", "--print")
    assert shown.stdout == text
