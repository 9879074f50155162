"""resourced-mcp: resourced for coding agents over the Model Context Protocol (stdio).

A thin adapter over the bus: each tool is one or two calls of the blocking
``resourced.client.sync.Client``, made in a worker thread of the server
(``agents.mcp_stdio``), as the user who started it; the daemon decides everything, as it
does for ``gpuctl``.  It needs nothing beyond the client's own dependencies.

Tools: ``context``, ``recommend``, ``list``, ``usage``, ``job`` and ``logs`` read;
``claim``, ``book`` and ``extend`` add; ``release`` and ``cancel`` take away; ``run``
starts a command on GPUs now and ``stop`` ends it (``agents.jobs``: through the user's
runner, and only what their configuration's ``[mcp]`` allows).  Every write takes an
``operation_id``: retried with the same id and the same arguments it answers the first
result and does nothing twice.  Bookings keep their ids in the daemon; claims and releases
(which the daemon has no ids for) keep them in this server, for its lifetime.  Errors
come back as tool errors whose text starts with the error's code
(``NotEnoughGPUs: ...``).  Resources: ``resourced://context`` and ``resourced://usage``;
prompt: ``plan_gpu_work``.  No tool blocks for more than about 30 s (a bus call's
timeout is 25 s; ``run`` and ``stop`` wait a few seconds at most for the runner).

    resourced-mcp [--bus session|system|shared]
"""

import json
import os
import sys

from resourced.client.sync import SharedClient

from .mcp_stdio import Param, Prompt, Resource, Server, Tool, ToolFailed

NAME = "resourced"

INSTRUCTIONS = """\
This machine's GPUs are shared through resourced: claim before you use a GPU, release as
soon as you are done, and book ahead for later. Nothing stops a program that ignores it,
so every other user relies on you following it.

- Start with the `context` tool (or the resourced://context resource): what you hold,
  what is free, when the next places are, the queue, health, notices and your limits.
- Now: `claim` (gpus, vram, ram, cpu, duration such as "2h"). A claim belongs to an owner
  process. By default that is this MCP server, and its claims are released when this
  session ends (one whose processes still use its GPUs is then shown DEAD, and the daemon
  releases it some minutes after they are gone, by its dead-owner rule). To keep a claim
  beyond this session, pass your own long-lived pid as owner_pid: it stays until you
  release it.
- Later: `recommend` says where and when it fits (read-only); `book` reserves it;
  `extend` and `cancel` change a booking.
- Every write takes an operation_id, unique per intent. After a timeout or an unclear
  answer, retry with the same id and the same arguments: you get the first answer, never a
  second claim or booking. dry_run asks the daemon what would happen and changes nothing.
- You run your commands yourself, on what you claimed, e.g.
  `gpuctl run --allocation REF -- python train.py`, or with the environment the claim
  returned (CUDA_VISIBLE_DEVICES). Then `release` the claim.
- Where your own commands cannot reach the GPUs (a sandbox), and only if the user allowed
  it in their configuration ([mcp] run, allow_commands, allow_dirs; the context's
  `mcp_jobs` says what is allowed): `run` a command (its argv as a list, an absolute cwd,
  GPUs, a time limit). It runs outside this session, on GPUs booked from now for the time
  limit, and its booking ends with it. Follow it with `job` (state, exit code) and `logs`
  (its output, from a byte offset), end it with `stop`. It outlives this session: keep
  its job reference. NotAllowed means the user's configuration or setup does not allow
  it (the message names the setting): do not try to get around it, tell the user.
- Errors start with a code: InvalidArgs (fix the request, do not retry), NotEnoughGPUs or
  NotEnoughCapacity (retry later, or book: the message names the nearest start),
  GPUsBusy (the free GPUs run someone's unclaimed processes), LimitExceeded (a limit of
  yours or your session's, named in the message: release something first), StillInUse
  (stop your processes on the GPUs first, or force), NoSuchClaim (no such claim or
  booking: it ended, or the ref is wrong), NotClaimOwner (it is someone else's: leave it),
  InteractiveAuthorizationRequired (only an administrator may do that),
  DaemonUnreachable (the daemon is not running).
"""

PLAN = """\
Plan for running "{what}" on {gpus} GPU(s) for {duration} through resourced:

1. Call the `context` tool. Note what you already hold (reuse it rather than claiming
   more), what is free now, `next` (when the GPUs free up), notices and your limits.
2. Pick one operation id for this intent, e.g. "{op_id}", and keep it: a retry with the
   same id and arguments never takes a second claim or booking.
3. If it fits now: call `claim` with gpus={gpus}, duration="{duration}",
   task_name="{what_short}" and that operation_id (add owner_pid: your own long-lived pid
   if the claim must outlive this MCP session). If it does not fit now: call `recommend`
   for the earliest start, then `book` it with the operation id, and claim when the
   booking starts.
4. Run the work yourself: `gpuctl run --allocation REF -- COMMAND`, or with the `env` the
   claim returned (CUDA_VISIBLE_DEVICES). Use no GPU you did not claim. (Where your
   commands cannot reach the GPUs, the `run` tool runs an allowed command on GPUs of its
   own instead of steps 3 to 5: follow it with `job` and `logs`.)
5. When it is done, or fails, call `release` with the claim's ref and a new operation id;
   `cancel` a booking you no longer need. Check `list` or `usage` that nothing is left.
"""


class Bus(SharedClient):
    """The server's one client (``SharedClient``: used from worker threads), and the
    memory of the operation ids of claims and releases."""

    def __init__(self, bus: str | None = None):
        super().__init__(bus)
        self._done: dict[str, tuple[str, dict]] = {}
        self.own: set[str] = set()
        """Refs of the claims owned by this process, released when the session ends."""

    def once(self, op_id: str, request: dict, fn, dry_run: bool) -> dict:
        """``fn(client)`` once per operation id: the same id with the same ``request``
        answers the first result; with another request it is refused.  A dry run neither
        looks at nor records the id (as the daemon does for bookings)."""
        from resourced.errors import InvalidArgs

        if dry_run:
            return self.call(fn)
        fingerprint = json.dumps(request, sort_keys=True, default=str)

        def remembered(client):
            if op_id in self._done:
                first, result = self._done[op_id]
                if first != fingerprint:
                    raise InvalidArgs(f"operation id {op_id!r} was used for another request"
                                      "; use a new id for a new intent")
                return result
            result = fn(client)
            self._done[op_id] = (fingerprint, result)
            return result

        return self.call(remembered)

    def release_own(self) -> None:
        """At the end of the session: release the claims this server owns (not forced: one
        whose processes still use its GPUs stays, marked DEAD, for the daemon's dead-owner
        rule to release once they are gone)."""
        from resourced.errors import ResourcedError

        for ref in sorted(self.own):
            try:
                self.call(lambda c, ref=ref: c.release(ref))
            except ResourcedError:
                pass
            self.own.discard(ref)


def build_server(link: Bus | None = None) -> Server:
    """The server with resourced's tools, resources and prompt, over ``link`` (default: a
    ``Bus`` found as every client finds it)."""
    from resourced import __version__
    from resourced.errors import ResourcedError
    from resourced.protocol.time import with_times
    from resourced.protocol.when import DURATION_FORMS, parse_duration

    from . import context as agent_context
    from . import jobs as agent_jobs

    link = link or Bus()
    server = Server(NAME, "resourced: shared GPUs", __version__, INSTRUCTIONS)

    def refusing(call, *args):
        """``call(*args)``; a resourced error is the tool's refusal, its code first."""
        try:
            return call(*args)
        except ResourcedError as exc:
            raise ToolFailed(f"{exc.code}: {exc.message}") from None

    def ask(fn):
        """``fn(client)``, refused as ``refusing`` says."""
        return refusing(link.call, fn)

    def once(op_id: str, request: dict, fn, dry_run: bool):
        """The same, once per operation id (``Bus.once``)."""
        return refusing(link.once, op_id, request, fn, dry_run)

    def span_text(value):
        """A duration in the one grammar, as text: a bare number is refused (Slurm reads
        minutes where seconds would be meant)."""
        if not isinstance(value, str):
            raise ValueError(f"give a duration as text ({DURATION_FORMS}), not {value!r}")
        parse_duration(value)

    def changed(booking: dict, dry_run: bool, again: bool = False) -> dict:
        """A change's answer, in book's shape (gpuctl's --json too): status (``unchanged``
        when ``again``: it had been made before) and booking."""
        status = "dry-run" if dry_run else "unchanged" if again else "changed"
        return {"status": status, "booking": with_times(booking)}

    def tool(annotations: dict, *params: Param, name: str | None = None):
        """Register a tool: its docstring as one paragraph for its description."""
        def register(fn):
            server.tools[name or fn.__name__] = Tool(name or fn.__name__, _paragraph(fn.__doc__),
                                                     annotations, params, fn)
            return fn
        return register

    reading = {"readOnlyHint": True, "idempotentHint": True, "openWorldHint": False}
    adding = {"readOnlyHint": False, "destructiveHint": False, "idempotentHint": True,
              "openWorldHint": False}
    removing = {**adding, "destructiveHint": True}

    span_forms = f"How long: {DURATION_FORMS} (a bare number is refused: give the unit)."
    op_id = Param("operation_id", {"type": "string", "minLength": 1, "maxLength": 256,
                                   "description": (
        "Unique per intent (e.g. 'train-7-claim'). Retrying with the same id and the same "
        "arguments answers the first result and does nothing twice; the same id with other "
        "arguments is refused (InvalidArgs).")}, None)
    dry_run = Param("dry_run", {"type": "boolean", "default": False, "description": (
        "Ask the daemon what would happen, decided by its real admission; change nothing.")},
        None)
    gpus = Param("gpus", optional({"type": "integer", "minimum": 0, "maximum": 2**32 - 1},
                                  "Whole GPUs."), None)
    vram = Param("vram", optional(AMOUNT, "A share of one GPU's memory: bytes, or text like "
                                          "'20G'."), None)
    ram = Param("ram", optional(AMOUNT, "Host RAM: bytes, or text like '64G'."), None)
    cpu = Param("cpu", optional(AMOUNT, "CPU cores."), None)
    duration = Param("duration", {"type": "string", "description": span_forms}, span_text)
    booking = Param("booking", {"type": "string", "minLength": 1,
                                "description": "The booking's reference (its id)."}, None)

    def text(name: str, description: str, default=None) -> Param:
        schema = {"type": "string"}
        return Param(name, {**schema, "default": default, "description": description}
                     if default is not None else optional(schema, description), None)

    @tool(reading)
    def context() -> dict:
        """Everything to look at first, in one call (the same JSON as `gpuctl agent context
        --json`, versioned by its schema field): me, what I hold (claims, bookings), what is
        free, the next places for one and for all GPUs, the queue, health, notices, my
        limits, the commands to use."""
        return ask(agent_context.context)

    @tool(reading, duration, gpus, vram, ram, cpu)
    def recommend(duration, gpus, vram, ram, cpu) -> dict:
        """Where and when this would fit, taking nothing (like `gpuctl agent recommend`):
        fits now (claim it), or the earliest start to book, or fits nowhere within the
        booking horizon. Nothing asked for is one whole GPU."""
        return ask(lambda c: agent_context.recommend(c, duration, gpus=gpus, vram=vram,
                                                     ram=ram, cpu=cpu))

    @tool(adding, op_id, gpus, vram, ram, cpu,
          Param("duration", optional({"type": "string", "description": span_forms},
                                     "End the claim this long after now ('2h', '30m'); none: "
                                     "until released."), span_text),
          text("task_name", "What it is for.", ""),
          text("label", "A short label for status.", ""),
          Param("owner_pid", optional({"type": "integer", "minimum": 1, "maximum": 2**32 - 1},
                                      "The process the claim belongs to. Default: this MCP "
                                      "server, whose claims are released when the MCP session "
                                      "ends; pass your own long-lived pid to keep the claim "
                                      "beyond the session (until you release it)."), None),
          dry_run)
    def claim(operation_id, gpus, vram, ram, cpu, duration, task_name, label, owner_pid,
              dry_run) -> dict:
        """Claim GPUs, a VRAM share and/or RAM/CPU now, all or nothing (nothing asked for is
        one whole GPU). Answers the allocation (ref, GPUs), the environment to run with
        (CUDA_VISIBLE_DEVICES) and warnings. Refused with NotEnoughGPUs/NotEnoughCapacity
        when it does not fit now (then book). Release it as soon as you are done."""
        if gpus is None and vram is None and ram is None and cpu is None:
            gpus = 1
        owner = owner_pid or os.getpid()
        request = {"tool": "claim", "gpus": gpus or 0, "vram": vram, "ram": ram, "cpu": cpu,
                   "duration": duration, "task_name": task_name, "label": label,
                   "owner_pid": owner}

        def take(c):
            result = c.claim(mode="dev", gpus=gpus or 0, vram=vram, ram=ram, cpu=cpu,
                             duration=duration, task_name=task_name, label=label,
                             owner_pid=owner, dry_run=dry_run)
            if owner == os.getpid() and not dry_run:
                link.own.add(result["allocation"]["ref"])
            return {**result, "owner_pid": owner}

        return once(operation_id, request, take, dry_run)

    @tool(removing, op_id,
          Param("ref", {"type": "string", "minLength": 1, "description": (
              "The claim's reference (allocation.ref of claim).")}, None),
          Param("force", {"type": "boolean", "default": False, "description": (
              "Release even while the claim's processes still use its GPUs (else "
              "StillInUse).")}, None),
          dry_run)
    def release(operation_id, ref, force, dry_run) -> dict:
        """Release one of my claims (a waiting one leaves the queue). Refused with StillInUse
        while its processes still use its GPUs, unless forced."""
        request = {"tool": "release", "ref": ref, "force": force}

        def give_back(c):
            done = c.release(ref, force=force, dry_run=dry_run)
            if not dry_run:
                link.own.discard(ref)
            return {"ref": ref, "released": not dry_run, "dry_run": dry_run,
                    "warnings": list(done)}

        return once(operation_id, request, give_back, dry_run)

    @tool(adding, op_id, duration, gpus, vram,
          text("start", "Exactly when: '20:00', 'tomorrow 09:00', '+30m', or ISO 8601 (local "
                        "time unless it has a zone). None: the earliest start that fits."),
          text("label", "A short label."), text("task_name", "What it is for."), dry_run)
    def book(operation_id, duration, gpus, vram, start, label, task_name, dry_run) -> dict:
        """Book GPUs (or a VRAM share) for a window, all or nothing over all of it: status
        'created', 'exists' (this operation_id was booked before: its booking) or 'dry-run',
        and the booking (id, start, end, GPUs). Refused, with the nearest start that fits,
        when it does not fit then. Nothing asked for is one whole GPU."""
        if gpus is None and vram is None:
            gpus = 1

        def reserve(c):
            made = c.book(duration, gpus=gpus, start=start, vram=vram, label=label,
                          task_name=task_name, op_id=operation_id, dry_run=dry_run)
            return {**made, "booking": with_times(made["booking"])}

        return ask(reserve)

    @tool(adding, op_id, booking,
          Param("by", optional({"type": "string", "description": span_forms},
                               "Move the end this much later: '1h', '30m'."), span_text),
          text("until", "Or the new end: '22:00', ISO 8601 (earlier shrinks it, not before "
                        "now)."),
          dry_run)
    def extend(operation_id, booking, by, until, dry_run) -> dict:
        """Move one of my bookings' end: by a duration, or until a time (give exactly one).
        Refused when the longer window does not fit. Answers as book does: the status
        (changed, dry-run) and the booking."""
        return ask(lambda c: changed(c.extend(booking, by=by, until=until, op_id=operation_id,
                                              dry_run=dry_run), dry_run))

    @tool(removing, op_id, booking, text("reason", "Why (kept with it).", ""), dry_run)
    def cancel(operation_id, booking, reason, dry_run) -> dict:
        """End one of my bookings now (a scheduled one never starts; an active one ends and
        its claim with it). Answers as book does: the status and the booking."""
        from resourced.client.bookings import cancelled_already
        from resourced.protocol.time import now_usec

        def cancel_it(c) -> dict:
            asked = now_usec()
            answer = c.cancel(booking, reason=reason, op_id=operation_id, dry_run=dry_run)
            return changed(answer, dry_run, cancelled_already(answer, asked))

        return ask(cancel_it)

    running = {"readOnlyHint": False, "destructiveHint": True, "idempotentHint": True,
               "openWorldHint": True}
    job_ref = Param("job", {"type": "string", "minLength": 1, "maxLength": 64, "description": (
        "The job's reference: what run answered as job (its booking's id).")}, None)

    def run_refusing(call, *args):
        """``refusing``, and the configuration's refusal as NotAllowed."""
        try:
            return refusing(call, *args)
        except agent_jobs.Refused as exc:
            raise ToolFailed(f"{exc.code}: {exc.message}") from None

    @tool(running, op_id,
          Param("command", {"type": "array", "minItems": 1, "maxItems": 4096,
                            "items": {"type": "string", "minLength": 1, "maxLength": 65536},
                            "description": (
              "The command and its arguments, one item each (not one shell line): "
              "['python3', 'train.py', '--epochs', '3']. No shell runs it.")}, _argv),
          Param("cwd", {"type": "string", "minLength": 1, "maxLength": 4096, "description": (
              "The folder to run it in: absolute (or ~/...), inside one the user allows.")},
              None),
          Param("duration", {"type": "string", "description": (
              "Its time limit: the GPUs are booked from now for this long, and it is stopped "
              "at the end (SIGTERM, then SIGKILL). " + span_forms)}, span_text),
          gpus, vram, ram, cpu,
          text("session", "The agent session it belongs to (default: $RESOURCED_SESSION of "
                          "this server, else its Unix session): `gpuctl stop --session` ends "
                          "it, and the session's limits count it."),
          dry_run)
    def run(operation_id, command, cwd, duration, gpus, vram, ram, cpu, session,
            dry_run) -> dict:
        """Run a command now on GPUs of its own, detached from this session, where your
        own commands cannot reach the GPUs (a sandbox). It books what it needs from now
        for the time limit and hands the command to the user's runner, which starts it on
        those GPUs (CUDA_VISIBLE_DEVICES) with this server's environment; the booking ends
        when the command does. Answers status 'started' (or 'exists': this operation_id's
        job) with the job's reference; when it does not fit now, 'later' with the earliest
        start, or 'nowhere', and nothing is started. Then `job` and `logs`; `stop` ends
        it. Refused with NotAllowed when the user's configuration does not allow it or no
        runner is running, the setting named. Nothing asked for is one whole GPU."""
        if gpus is None and vram is None and ram is None and cpu is None:
            gpus = 1
        request = {k: v for k, v in (("gpus", gpus), ("vram", vram), ("ram", ram),
                                     ("cpu", cpu)) if v is not None}
        answer = run_refusing(link.call, lambda c: agent_jobs.start(
            c, command, cwd, duration, request, session, operation_id, dry_run))
        if answer.get("state") == "pending":  # the runner starts it within a second or so
            job = agent_jobs.waited(answer["job"],
                                    lambda j: j.state != "pending", agent_jobs.START_WAIT)
            if job is not None:
                answer.update(state=job.state, final=job.final,
                              exit_code=job.exit_code if job.final else None)
        return answer

    server.tools["run"] = server.tools["run"]._replace(description=_paragraph(
        server.tools["run"].description + " " + agent_jobs.described()))

    @tool(reading, job_ref)
    def job(job) -> dict:
        """One of my jobs (run's, or a booked command's): its state (pending, running,
        succeeded, failed, timed-out, cancelled, missed), its exit code once over, its
        command, folder and session, how much output its log holds, and its booking."""
        found = refusing(agent_jobs.mine, job)
        try:  # (the job file says how it stands even while the daemon is away)
            booking = link.call(lambda c: c.booking(found.booking))
        except ResourcedError:
            booking = None
        return agent_jobs.described_job(found, booking)

    @tool(reading, job_ref,
          Param("offset", {"type": "integer", "minimum": 0, "maximum": 2**40, "default": 0,
                           "description": (
              "Where to start, in bytes (next_offset of the last call; 0: the beginning). "
              "The log keeps the last 5 to 10 MiB of output.")}, None),
          Param("max_bytes", {"type": "integer", "minimum": 1,
                              "maximum": agent_jobs.MAX_LOG_CHUNK,
                              "default": agent_jobs.LOG_CHUNK,
                              "description": "At most this many bytes of output."}, None))
    def logs(job, offset, max_bytes) -> dict:
        """A job's output so far (stdout and stderr together) from a byte offset, at most
        max_bytes of it: text, next_offset (pass it as offset to go on), size, more
        (whether more is there now) and the job's state (final: it will not grow)."""
        return agent_jobs.read_log(refusing(agent_jobs.mine, job), offset, max_bytes)

    @tool(removing, op_id, job_ref, dry_run)
    def stop(operation_id, job, dry_run) -> dict:
        """End one of my jobs now: its booking ends (its GPUs with it), and the runner sends
        the command's process group SIGTERM, then SIGKILL after its grace. Answers the job
        as `job` does, once it is over or after a few seconds (then it is still stopping:
        ask `job` again)."""
        found = refusing(agent_jobs.mine, job)
        booking = ask(lambda c: agent_jobs.stop(c, found.booking, operation_id, dry_run))
        if not dry_run and not found.final:
            found = agent_jobs.waited(found.booking,
                                      lambda j: j.final, agent_jobs.STOP_WAIT) or found
        return {"dry_run": dry_run, **agent_jobs.described_job(found, booking)}

    @tool(reading, name="list")
    def list_mine() -> dict:
        """My claims (granted and waiting, each with its ref, GPUs, owner pid, end) and my
        bookings (scheduled, active, and those ended within the last day)."""
        return ask(agent_context.holdings)

    @tool(reading)
    def usage() -> dict:
        """What I hold now (claims, whole GPUs, VRAM shares, pools) and what I have booked
        from now on (bookings, GPU-hours, VRAM GiB-hours, the next start), summed; and my
        history of the last week (GPU-hours held, used and held idle; claims and bookings),
        from the daemon's usage history."""
        return ask(agent_context.usage)

    for uri, name, description, fn in (
            ("resourced://context", "context", "The same JSON as the context tool.",
             agent_context.context),
            ("resourced://usage", "usage", "The same JSON as the usage tool: what I hold now "
             "and have booked ahead, and my history of the last week.", agent_context.usage)):
        server.resources[uri] = Resource(
            uri, name, description, "application/json",
            lambda fn=fn: json.dumps(ask(fn), sort_keys=True))

    def plan_gpu_work(what: str, gpus: str = "1", duration: str = "1h") -> str:
        short = " ".join(what.split())[:60]
        op_id = "-".join(short.lower().split()[:4]) or "work"
        return PLAN.format(what=short, what_short=short.replace('"', "'"), gpus=gpus,
                           duration=duration, op_id=f"{op_id}-1")

    server.prompts["plan_gpu_work"] = Prompt(
        "plan_gpu_work", "Plan GPU work through resourced",
        "A plan for GPU work: look at the context, claim or book with an operation id, run it "
        "yourself, release.",
        (("what", "The work, e.g. 'fine-tune the 7B model'.", True),
         ("gpus", "How many GPUs.", False), ("duration", "How long, e.g. '2h'.", False)),
        plan_gpu_work)
    return server


AMOUNT = {"anyOf": [{"type": "integer"}, {"type": "string"}]}
"""An amount: a number (bytes, or a count), or text with its unit (``20G``)."""


def optional(schema: dict, description: str) -> dict:
    """``schema``, not required (null by default, and null is taken as left out).  Written
    with its plain ``type``, as MCP clients expect an optional argument: one that reads
    the type to convert what a person typed (the MCP Inspector's CLI) sent ``"1"`` for
    ``anyOf: [integer, null]``."""
    return {**schema, "default": None, "description": description}


def _argv(value) -> None:
    """A command's words: no NUL (no program can take one)."""
    if isinstance(value, list) and any(isinstance(w, str) and "\0" in w for w in value):
        raise ValueError("a word of the command holds a NUL character")


def _paragraph(text: str) -> str:
    return " ".join(text.split())


def main(argv: list[str] | None = None) -> None:
    import argparse

    from resourced import __version__

    parser = argparse.ArgumentParser(
        prog="resourced-mcp",
        description="resourced's tools for coding agents: an MCP server on stdio, as you.")
    parser.add_argument("--bus", choices=("session", "system", "shared"), default=None,
                        help="Which bus (default: $RESOURCED_BUS, else the shared bus of "
                             "`gpuctl connect`, else the session bus if a daemon runs or can "
                             "start there, else the system bus).")
    parser.add_argument("--version", action="version", version=f"resourced-mcp {__version__}")
    args = parser.parse_args(argv)
    link = Bus(args.bus)
    try:
        build_server(link).serve(sys.stdin.buffer, sys.stdout.buffer)
    except KeyboardInterrupt:
        pass
    finally:
        link.release_own()
        link.close()


if __name__ == "__main__":
    main()
