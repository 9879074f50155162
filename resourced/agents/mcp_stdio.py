"""A Model Context Protocol server on stdio, as small as resourced's tools need.

Newline-delimited JSON-RPC 2.0 on stdin and stdout; the ``initialize`` handshake of the
revisions 2024-11-05 to 2025-11-25 (a client that offers another is answered with the
newest of them, and ``server/discover`` is not a method here: the official SDK's client
then falls back to the handshake); tools, resources and one kind of prompt, each a plain
function.  Requests are answered as they finish, from worker threads (a tool waits on the
bus), so a slow one holds up no other.

Written here rather than built on the official SDK: importing the SDK takes about a
second (its pydantic models of every protocol revision), and resourced-mcp must answer
its first ``initialize`` in well under one.  Arguments are checked against each tool's
JSON Schema, of the few kinds the tools use (``type``, ``anyOf``, lengths and bounds, and
arrays of those).
"""

import json
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, NamedTuple

REVISIONS = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")
"""The protocol revisions this server speaks, oldest first."""
PARSE_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND, INVALID_PARAMS, INTERNAL_ERROR = (
    -32700, -32600, -32601, -32602, -32603)
BUSY = -32000  # (JSON-RPC leaves -32000 to -32099 to the server)
WORKERS = 8
MAX_LINE = 1 << 20
"""Bytes of one message at most: a tool's arguments are a few hundred; a longer line is
refused, read past and forgotten, and the server goes on."""
MAX_PENDING = 64
"""Calls queued or running at once at most; one more is refused at once, saying so."""


class RequestError(Exception):
    """A JSON-RPC error answered for the request (its code and message)."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code, self.message = code, message


class ToolFailed(Exception):
    """A tool's refusal, answered as a result the model reads (``isError``): its text."""


class Param(NamedTuple):
    name: str
    schema: dict            # its JSON Schema, as listed (a default makes it optional)
    check: Callable | None  # checked before the schema, if not None: ValueError says why


class Tool(NamedTuple):
    name: str
    description: str
    annotations: dict
    params: tuple[Param, ...]
    run: Callable[..., dict]  # the checked arguments by name -> the structured answer


class Resource(NamedTuple):
    uri: str
    name: str
    description: str
    mime_type: str
    read: Callable[[], str]


class Prompt(NamedTuple):
    name: str
    title: str
    description: str
    arguments: tuple[tuple[str, str, bool], ...]  # (name, description, required)
    render: Callable[..., str]


class Server:
    """Tools, resources and prompts by name, answered over stdio by ``serve``."""

    def __init__(self, name: str, title: str, version: str, instructions: str):
        self.info = {"name": name, "title": title, "version": version}
        self.instructions = instructions
        self.tools: dict[str, Tool] = {}
        self.resources: dict[str, Resource] = {}
        self.prompts: dict[str, Prompt] = {}

    # --- what a client sees ------------------------------------------------------------

    def list_tools(self) -> list[dict]:
        return [{"name": t.name, "description": t.description, "annotations": t.annotations,
                 "inputSchema": input_schema(t.params),
                 "outputSchema": {"type": "object", "additionalProperties": True}}
                for t in self.tools.values()]

    def call_tool(self, name: str, arguments: dict) -> dict:
        """A ``tools/call`` result: the structured answer and the same as compact JSON
        text, or ``isError`` with the refusal's text."""
        tool = self.tools.get(name)
        if tool is None:
            raise RequestError(INVALID_PARAMS, f"Unknown tool: {name}")
        try:
            data = tool.run(**checked(tool.params, arguments))
        except ToolFailed as exc:
            return {"content": [{"type": "text", "text": str(exc)}], "isError": True}
        text = json.dumps(data, separators=(",", ":"))
        return {"content": [{"type": "text", "text": text}], "structuredContent": data,
                "isError": False}

    def read_resource(self, uri: str) -> dict:
        resource = self.resources.get(uri)
        if resource is None:
            raise RequestError(INVALID_PARAMS, f"Unknown resource: {uri}")
        try:
            text = resource.read()
        except ToolFailed as exc:
            raise RequestError(INTERNAL_ERROR, str(exc)) from None
        return {"contents": [{"uri": uri, "mimeType": resource.mime_type, "text": text}]}

    def get_prompt(self, name: str, arguments: dict) -> dict:
        prompt = self.prompts.get(name)
        if prompt is None:
            raise RequestError(INVALID_PARAMS, f"Unknown prompt: {name}")
        if missing := [a for a, _, required in prompt.arguments if required and a not in arguments]:
            raise RequestError(INVALID_PARAMS, f"Missing required arguments: {', '.join(missing)}")
        known = {a for a, _, _ in prompt.arguments}
        text = prompt.render(**{k: str(v) for k, v in arguments.items() if k in known})
        return {"description": prompt.description,
                "messages": [{"role": "user", "content": {"type": "text", "text": text}}]}

    def initialize(self, params: dict) -> dict:
        asked = params.get("protocolVersion")
        return {"protocolVersion": asked if asked in REVISIONS else REVISIONS[-1],
                "capabilities": {"tools": {"listChanged": False},
                                 "resources": {"subscribe": False, "listChanged": False},
                                 "prompts": {"listChanged": False}},
                "serverInfo": self.info, "instructions": self.instructions}

    # --- the wire ----------------------------------------------------------------------

    def answer(self, method: str, params: dict) -> dict:
        """The result of one request (raises RequestError)."""
        if method == "initialize":
            return self.initialize(params)
        if method == "ping":
            return {}
        if method == "tools/list":
            return {"tools": self.list_tools()}
        if method == "tools/call":
            return self.call_tool(_text(params, "name"), params.get("arguments") or {})
        if method == "resources/list":
            return {"resources": [{"uri": r.uri, "name": r.name, "description": r.description,
                                   "mimeType": r.mime_type} for r in self.resources.values()]}
        if method == "resources/templates/list":
            return {"resourceTemplates": []}
        if method == "resources/read":
            return self.read_resource(_text(params, "uri"))
        if method == "prompts/list":
            return {"prompts": [{"name": p.name, "title": p.title, "description": p.description,
                                 "arguments": [{"name": a, "description": d, "required": r}
                                               for a, d, r in p.arguments]}
                                for p in self.prompts.values()]}
        if method == "prompts/get":
            return self.get_prompt(_text(params, "name"), params.get("arguments") or {})
        raise RequestError(METHOD_NOT_FOUND, "Method not found")

    def serve(self, reader, writer) -> None:
        """Answer each line of ``reader`` (a binary stream) on ``writer`` until the end of
        input, then wait for the requests still running.  Bounded: a line of more than
        MAX_LINE bytes, JSON nested too deeply and a call beyond MAX_PENDING are each
        answered with an error, and the server goes on."""
        lock = threading.Lock()
        pending = threading.BoundedSemaphore(MAX_PENDING)

        def send(message: dict) -> None:
            line = json.dumps(message, separators=(",", ":")).encode() + b"\n"
            with lock:
                writer.write(line)
                writer.flush()

        def respond(request_id, method: str, params: dict) -> None:
            try:
                send({"jsonrpc": "2.0", "id": request_id, "result": self.answer(method, params)})
            except RequestError as exc:
                send(_error(request_id, exc.code, exc.message))
            except Exception as exc:  # noqa: BLE001 - a bug answers, and the server goes on
                send(_error(request_id, INTERNAL_ERROR, f"{type(exc).__name__}: {exc}"))

        def respond_later(request_id, method: str, params: dict) -> None:
            try:
                respond(request_id, method, params)
            finally:
                pending.release()

        with ThreadPoolExecutor(WORKERS, thread_name_prefix="mcp") as pool:
            while line := reader.readline(MAX_LINE + 1):
                if len(line) > MAX_LINE and not line.endswith(b"\n"):
                    while (rest := reader.readline(MAX_LINE)) and not rest.endswith(b"\n"):
                        pass  # the rest of the line, read past
                    send(_error(None, PARSE_ERROR, f"Parse error: a message of more than "
                                                   f"{MAX_LINE} bytes"))
                    continue
                if not line.strip():
                    continue
                try:
                    message = json.loads(line)
                except RecursionError:
                    send(_error(None, PARSE_ERROR, "Parse error: nested too deeply"))
                    continue
                except ValueError:
                    send(_error(None, PARSE_ERROR, "Parse error"))
                    continue
                if not isinstance(message, dict):
                    send(_error(None, INVALID_REQUEST, "Invalid Request"))
                    continue
                if not isinstance(message.get("method"), str):
                    if "method" in message or not ("result" in message or "error" in message):
                        send(_error(message.get("id"), INVALID_REQUEST, "Invalid Request"))
                    continue  # (else an answer to a request of ours: there are none)
                if "id" not in message:
                    continue  # a notification: initialized, cancelled, ... need nothing
                params = message.get("params")
                if not isinstance(params, dict):
                    params = {}
                if message["method"] in ("tools/call", "resources/read", "prompts/get"):
                    if not pending.acquire(blocking=False):
                        send(_error(message["id"], BUSY, f"Server busy: {MAX_PENDING} calls "
                                                         "are in progress; try again later"))
                        continue
                    pool.submit(respond_later, message["id"], message["method"], params)
                else:
                    respond(message["id"], message["method"], params)


def _text(params: dict, key: str) -> str:
    value = params.get(key)
    if not isinstance(value, str):
        raise RequestError(INVALID_PARAMS, f"{key} is required")
    return value


def _error(request_id, code: int, message: str) -> dict:
    return {"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message}}


# --- arguments -----------------------------------------------------------------------------


def input_schema(params: tuple[Param, ...]) -> dict:
    schema = {"type": "object", "properties": {p.name: p.schema for p in params},
              "additionalProperties": False}
    if required := [p.name for p in params if "default" not in p.schema]:
        schema["required"] = required
    return schema


def checked(params: tuple[Param, ...], arguments: Any) -> dict:
    """The arguments by name, defaults filled in; else ToolFailed saying, one clause per
    argument, what is wrong (``InvalidArgs: operation_id is required``).  An argument no
    parameter names is refused, as the bus and Python refuse one: a mistyped name must
    not be taken for its absence (``durration`` made a claim with no end)."""
    if not isinstance(arguments, dict):
        raise ToolFailed("InvalidArgs: the arguments must be an object")
    values, clauses = {}, []
    names = [p.name for p in params]
    for name in arguments:
        if name not in names:
            import difflib

            guess = difflib.get_close_matches(str(name), names, n=1)
            clauses.append(f"unknown argument {name!r}" + (f" (did you mean {guess[0]}?)"
                                                          if guess else
                                                          f" (known: {', '.join(names)})"))
    for p in params:
        if p.name not in arguments:
            if "default" in p.schema:
                values[p.name] = p.schema["default"]
            else:
                clauses.append(f"{p.name} is required")
            continue
        value, why = arguments[p.name], None
        if value is None and "default" in p.schema and p.schema["default"] is None:
            values[p.name] = None  # an optional argument given as null: left out
            continue
        if p.check is not None and value is not None:
            try:
                p.check(value)  # (first: it says more than a type, "90 what? ...")
            except ValueError as exc:
                why = str(exc)
        why = why or mismatch(p.schema, value)
        if why is None:
            values[p.name] = value
        else:
            clauses.append(f"{p.name}: {why}")
    if clauses:
        raise ToolFailed("InvalidArgs: " + "; ".join(clauses))
    return values


KINDS = {"string": "text", "integer": "an integer", "boolean": "true or false", "null": "null",
         "array": "a list"}


def mismatch(schema: dict, value) -> str | None:
    """Why ``value`` does not match ``schema`` (of the kinds the tools use), or None."""
    if "anyOf" in schema:
        same = [s for s in schema["anyOf"] if _is(s["type"], value)]
        if not same:
            return "must be " + " or ".join(KINDS[s["type"]] for s in schema["anyOf"])
        whys = [mismatch(s, value) for s in same]
        return None if None in whys else whys[0]
    if not _is(schema["type"], value):
        return f"must be {KINDS[schema['type']]}"
    if schema["type"] == "integer":
        if value < schema.get("minimum", value):
            return f"must be at least {schema['minimum']}"
        if value > schema.get("maximum", value):
            return f"must be at most {schema['maximum']}"
    elif schema["type"] == "string":
        if len(value) < schema.get("minLength", 0):
            return "must not be empty" if schema["minLength"] == 1 else (
                f"must have at least {schema['minLength']} characters")
        if len(value) > schema.get("maxLength", len(value)):
            return f"must have at most {schema['maxLength']} characters"
    elif schema["type"] == "array":
        if len(value) < schema.get("minItems", 0):
            return f"must have at least {schema['minItems']} item(s)"
        if len(value) > schema.get("maxItems", len(value)):
            return f"must have at most {schema['maxItems']} items"
        for i, item in enumerate(value):
            if (why := mismatch(schema["items"], item)) is not None:
                return f"item {i} {why}"
    return None


def _is(kind: str, value) -> bool:
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, {"string": str, "boolean": bool, "null": type(None),
                              "array": list}[kind])
