"""The MCP server's own protocol layer (agents/mcp_stdio.py), on lines in and out: the
handshake, JSON-RPC's errors, argument checks, and answers that do not wait for each other."""

import io
import json
import threading

import pytest

from resourced.agents.mcp_stdio import REVISIONS, Param, Server, Tool, ToolFailed, checked

WAIT = 10.0


def server() -> Server:
    s = Server("test", "a test", "1.0", "be kind")
    released = threading.Event()

    def slow() -> dict:
        return {"released": released.wait(WAIT)}

    def quick() -> dict:
        released.set()
        return {"quick": True}

    def refuse() -> dict:
        raise ToolFailed("NotEnoughGPUs: none free")

    count = Param("count", {"type": "integer", "minimum": 0, "maximum": 4}, None)
    for fn, params in ((slow, ()), (quick, ()), (refuse, ()), (lambda count: {"n": count},
                                                               (count,))):
        name = "counted" if fn.__name__ == "<lambda>" else fn.__name__
        s.tools[name] = Tool(name, name, {"readOnlyHint": True}, params, fn)
    return s


def exchange(s: Server, *messages) -> list[dict]:
    """What the server writes for ``messages`` (dicts, or raw lines as bytes)."""
    out = io.BytesIO()
    s.serve(io.BytesIO(b"".join(m if isinstance(m, bytes) else json.dumps(m).encode() + b"\n"
                                for m in messages)), out)
    return [json.loads(line) for line in out.getvalue().splitlines()]


def request(n: int, method: str, **params) -> dict:
    return {"jsonrpc": "2.0", "id": n, "method": method, "params": params}


@pytest.mark.parametrize("asked, answered", [
    ("2025-06-18", "2025-06-18"), ("2024-11-05", "2024-11-05"),
    ("2026-07-28", REVISIONS[-1]), ("1999-01-01", REVISIONS[-1])])
def test_the_handshake_answers_the_revision_asked_or_its_newest(asked, answered):
    [reply] = exchange(server(), request(1, "initialize", protocolVersion=asked,
                                         capabilities={}, clientInfo={"name": "t"}))
    result = reply["result"]
    assert (reply["id"], result["protocolVersion"]) == (1, answered)
    assert result["serverInfo"] == {"name": "test", "title": "a test", "version": "1.0"}
    assert set(result["capabilities"]) == {"tools", "resources", "prompts"}
    assert result["instructions"] == "be kind"


def test_json_rpc_errors_and_silence_for_notifications():
    replies = exchange(server(), b"{not json\n", b"\n", [1, 2],
                       {"jsonrpc": "2.0", "method": "notifications/initialized"},
                       request(2, "server/discover"), request(3, "ping"),
                       request(4, "tools/call", name="nosuch"),
                       {"jsonrpc": "2.0", "id": 5, "method": "tools/call"})
    assert [(r.get("id"), r.get("error", {}).get("code")) for r in replies] == [
        (None, -32700), (None, -32600), (2, -32601), (3, None), (4, -32602), (5, -32602)]
    assert replies[3]["result"] == {}


def test_a_slow_call_holds_up_no_other():
    """The first call waits until the second has run: answered in the other order."""
    replies = exchange(server(), request(1, "tools/call", name="slow", arguments={}),
                       request(2, "tools/call", name="quick", arguments={}))
    assert [r["id"] for r in replies] == [2, 1]
    assert replies[1]["result"]["structuredContent"] == {"released": True}


def test_a_result_is_structured_and_text_and_a_refusal_is_a_tool_error():
    ok, refused = exchange(server(), request(1, "tools/call", name="counted",
                                             arguments={"count": 3}),
                           request(2, "tools/call", name="refuse", arguments={}))
    assert ok["result"] == {"content": [{"type": "text", "text": '{"n":3}'}],
                            "structuredContent": {"n": 3}, "isError": False}
    assert refused["result"] == {"content": [{"type": "text", "text": "NotEnoughGPUs: none free"}],
                                 "isError": True}


def refusal(params, arguments) -> str:
    with pytest.raises(ToolFailed) as caught:
        checked(params, arguments)
    return str(caught.value)


def test_arguments_are_checked_one_clause_each():
    def even(value):  # (checked before the schema: it looks at what it knows)
        if type(value) is int and value % 2:
            raise ValueError("must be even")

    params = (Param("op", {"type": "string", "minLength": 1}, None),
              Param("n", {"anyOf": [{"type": "integer", "maximum": 8}, {"type": "null"}],
                          "default": None}, even),
              Param("flag", {"type": "boolean", "default": False}, None),
              Param("size", {"anyOf": [{"type": "integer"}, {"type": "string"}],
                             "default": "1G"}, None))
    assert checked(params, {"op": "x"}) == {"op": "x", "n": None, "flag": False, "size": "1G"}
    # a name no parameter has is refused, not taken for the absence of one
    assert refusal(params, {"op": "x", "extra": 1}) == (
        "InvalidArgs: unknown argument 'extra' (known: op, n, flag, size)")
    assert refusal(params, {"op": "x", "falg": True}) == (
        "InvalidArgs: unknown argument 'falg' (did you mean flag?)")
    assert checked(params, {"op": "x", "n": 4, "size": 7})["n"] == 4
    assert refusal(params, {}) == "InvalidArgs: op is required"
    assert refusal(params, {"op": "", "flag": "yes"}) == (
        "InvalidArgs: op: must not be empty; flag: must be true or false")
    assert refusal(params, {"op": "x", "n": 3}) == "InvalidArgs: n: must be even"
    assert refusal(params, {"op": "x", "n": 10}) == "InvalidArgs: n: must be at most 8"
    assert refusal(params, {"op": "x", "n": True}) == "InvalidArgs: n: must be an integer or null"
    assert refusal(params, {"op": "x", "size": 1.5}) == (
        "InvalidArgs: size: must be an integer or text")
    assert refusal(params, []) == "InvalidArgs: the arguments must be an object"


# -- bounds: what one line or one client can ask of the server -------------------------
def test_deep_nesting_and_a_line_over_the_bound_are_refused_and_the_server_goes_on():
    from resourced.agents.mcp_stdio import MAX_LINE

    replies = exchange(server(), b"[" * 100_000 + b"\n", b'"' + b"x" * (MAX_LINE + 10) + b'"\n',
                       request(3, "ping"))
    assert [(r.get("id"), r.get("error", {}).get("code")) for r in replies] == [
        (None, -32700), (None, -32700), (3, None)]
    assert "nested too deeply" in replies[0]["error"]["message"]
    assert f"more than {MAX_LINE} bytes" in replies[1]["error"]["message"]


def test_calls_beyond_the_bound_in_progress_are_refused_at_once():
    from resourced.agents.mcp_stdio import MAX_PENDING

    s = server()
    go = threading.Event()
    s.tools["held"] = Tool("held", "held", {"readOnlyHint": True}, (),
                           lambda: {"ran": go.wait(WAIT)})

    class Lines(io.BytesIO):
        """The requests, then, at the end of input, the held calls are let go."""

        def readline(self, size=-1):
            line = super().readline(size)
            if not line:
                go.set()
            return line

    calls = [request(n, "tools/call", name="held", arguments={})
             for n in range(MAX_PENDING + 2)]
    out = io.BytesIO()
    s.serve(Lines(b"".join(json.dumps(c).encode() + b"\n" for c in calls)), out)
    replies = {r["id"]: r for r in map(json.loads, out.getvalue().splitlines())}
    busy = [n for n, r in replies.items() if r.get("error", {}).get("code") == -32000]
    assert sorted(busy) == [MAX_PENDING, MAX_PENDING + 1]
    assert "Server busy" in replies[MAX_PENDING]["error"]["message"]
    assert all(replies[n]["result"]["structuredContent"] == {"ran": True}
               for n in range(MAX_PENDING))
