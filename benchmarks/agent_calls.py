"""What an agent's calls cost: ``gpuctl agent context --json`` against ``gpuctl free``, and
resourced-mcp's tool round trips through the MCP SDK's own stdio client.

Starts its own private session bus and a daemon on it (8 simulated GPUs, a config file
lifting ``max_bookings_per_user``, ``booking_horizon`` and ``longest_booking``), and fills
it, through one ``resourced.Client``, with --claims claims of this user (1G VRAM shares,
owned by this process; default 100) and --bookings bookings of this user (1 GPU, 1 hour,
8 an hour from the second whole hour from now, so none starts during the run; default
1,000), the bookings first (a claim without an end holds until the first booking of its
GPU).  Then:

(a) whole processes, interleaved round-robin (the order rotates every round), after
    --warmup untimed rounds: ``gpuctl agent context --json`` (status, bookings and two
    FindSlots, every booking and claim of mine in its JSON) and ``gpuctl free`` (one
    property read), the console scripts next to this interpreter (else ``python -m
    resourced.cli``); median and p90 of --runs runs, and the ratio of the medians.
    Aim: context within 1.5x of free.  Bytecode is cached under a private
    PYTHONPYCACHEPREFIX, filled by the warm-up, as an installed package would load.
(b) resourced-mcp (the console script next to this interpreter, spawned by
    ``mcp.client.stdio.stdio_client``, one ``ClientSession``): the time from spawn to an
    initialized session, cold (the first spawn, with a bytecode cache of its own, empty:
    every module it imports compiled afresh, the standard library's too; aim under 1 s)
    and warm (the second: bytecode cached by the first), then p50 and
    p90 of --calls ``context`` and --calls ``list`` tool calls (after 10 untimed of
    each), each from the request to the parsed result; beside them the same data through
    one ``resourced.Client`` in this process (``resourced.agents.context``), which is what
    the MCP layer adds to.

    python benchmarks/agent_calls.py [--runs 15] [--warmup 2] [--calls 200]
                                     [--claims 100] [--bookings 1000]
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _harness import clean_env, daemon_on_private_bus, machine_line, summary

from resourced.agents import context as agent_context
from resourced.client.sync import Client

GPUS = 8
HOUR = 3600
AIM_RATIO = 1.5
COLD_START_AIM = 1.0  # seconds, spawn to an initialized MCP session
CONFIG = "[daemon]\nmax_bookings_per_user = 0\nbooking_horizon = 0\nlongest_booking = 0\n"
CALL_TIMEOUT = 60.0
MCP_WARM_UP = 10


def console(name: str) -> list[str] | None:
    """The console script next to this interpreter, or None."""
    script = Path(sys.executable).with_name(name)
    return [str(script)] if script.is_file() and os.access(script, os.X_OK) else None


def fill(claims: int, bookings: int) -> None:
    with Client(bus="session", timeout=CALL_TIMEOUT) as c:
        first = (int(time.time()) // HOUR + 2) * HOUR  # an hour away at least: none starts
        for i in range(bookings):
            c.book(HOUR, gpus=1, start=first + (i // GPUS) * HOUR)
        for i in range(claims):  # after the bookings: each may hold until the first starts
            c.claim(mode="dev", gpus=0, vram="1G", owner_pid=os.getpid(),
                    task_name=f"bench-{i}")
        mine = agent_context.holdings(c)
    if (len(mine["claims"]), len(mine["bookings"])) != (claims, bookings):
        raise RuntimeError(f"filled {len(mine['claims'])} claims and {len(mine['bookings'])} "
                           f"bookings, not {claims} and {bookings}")


def whole_processes(cmds: dict[str, list[str]], env, runs: int, warmup: int):
    names = list(cmds)
    samples: dict[str, list[float]] = {n: [] for n in names}
    for r in range(warmup + runs):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            t0 = time.perf_counter()
            done = subprocess.run(cmds[name], env=env, capture_output=True,
                                  timeout=CALL_TIMEOUT, check=False)
            took = time.perf_counter() - t0
            if done.returncode:
                raise RuntimeError(f"{name} exited {done.returncode}: "
                                   f"{done.stderr.decode(errors='replace')[-1000:]}")
            if r >= warmup:
                samples[name].append(took)
    return samples


def report_processes(samples: dict[str, list[float]], context: str, free: str) -> None:
    width = max(map(len, samples)) + 2
    print(f"\n(a) whole processes\n{'command':<{width}}{'runs':>5}{'median ms':>11}{'p90 ms':>9}")
    for name, values in samples.items():
        s = summary(values)
        print(f"{name:<{width}}{s['n']:>5}{s['p50'] * 1e3:>11.1f}{s['p90'] * 1e3:>9.1f}")
    ratio = summary(samples[context])["p50"] / summary(samples[free])["p50"]
    verdict = "met" if ratio <= AIM_RATIO else "MISSED"
    print(f"aim: `{context}` median within {AIM_RATIO:g}x of `{free}`: {ratio:.2f}x ({verdict})")


async def mcp_round_trips(env: dict[str, str], calls: int) -> dict[str, object]:
    import anyio
    from mcp import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client

    server = console("resourced-mcp")
    if server is None:
        raise RuntimeError(f"no resourced-mcp next to {sys.executable}: pip install -e .")
    out: dict[str, object] = {}
    params = StdioServerParameters(command=server[0], env=env)
    with anyio.fail_after(CALL_TIMEOUT + calls):
        for key in ("cold", "start"):  # the first compiles every module into the empty cache
            t0 = time.perf_counter()
            async with stdio_client(params) as (read, write), ClientSession(read, write) as s:
                await s.initialize()
                out[key] = time.perf_counter() - t0
        async with stdio_client(params) as (read, write), ClientSession(read, write) as s:
            await s.initialize()
            for tool in ("context", "list"):
                times = []
                for i in range(MCP_WARM_UP + calls):
                    t = time.perf_counter()
                    result = await s.call_tool(tool, {})
                    took = time.perf_counter() - t
                    if result.is_error:
                        raise RuntimeError(f"{tool}: {result.content[0].text}")
                    if i >= MCP_WARM_UP:
                        times.append(took)
                out[tool] = times
    return out


def direct_calls(calls: int) -> dict[str, list[float]]:
    """The same data through one Client in this process: what the MCP layer adds to."""
    out = {}
    with Client(bus="session", timeout=CALL_TIMEOUT) as c:
        for name, fn in (("context", agent_context.context), ("list", agent_context.holdings)):
            times = []
            for i in range(MCP_WARM_UP + calls):
                t = time.perf_counter()
                fn(c)
                if i >= MCP_WARM_UP:
                    times.append(time.perf_counter() - t)
            out[name] = times
    return out


def report_mcp(mcp: dict, direct: dict[str, list[float]], calls: int) -> None:
    print(f"\n(b) resourced-mcp over stdio (the SDK's client), {calls} calls of each tool")
    verdict = "met" if mcp["cold"] < COLD_START_AIM else "MISSED"
    print(f"spawn to initialized session, cold (bytecode compiled afresh): "
          f"{mcp['cold'] * 1e3:.0f} ms (aim under {COLD_START_AIM:g} s: {verdict})")
    print(f"spawn to initialized session (bytecode cached): {mcp['start'] * 1e3:.0f} ms")
    print(f"{'tool':<10}{'MCP p50 ms':>12}{'MCP p90 ms':>12}{'Client p50 ms':>15}"
          f"{'Client p90 ms':>15}")
    for tool in ("context", "list"):
        m, d = summary(mcp[tool]), summary(direct[tool])
        print(f"{tool:<10}{m['p50'] * 1e3:>12.2f}{m['p90'] * 1e3:>12.2f}"
              f"{d['p50'] * 1e3:>15.2f}{d['p90'] * 1e3:>15.2f}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=15, help="timed runs of each command (15)")
    p.add_argument("--warmup", type=int, default=2, help="untimed rounds first (2)")
    p.add_argument("--calls", type=int, default=200, help="timed calls of each MCP tool (200)")
    p.add_argument("--claims", type=int, default=100, help="claims to fill in (100)")
    p.add_argument("--bookings", type=int, default=1000, help="bookings to fill in (1000)")
    args = p.parse_args()
    import anyio

    workdir = Path(tempfile.mkdtemp(prefix="agent-calls-"))
    try:
        config = workdir / "resourced.toml"
        config.write_text(CONFIG)
        print(f"agent_calls: {GPUS} simulated GPUs on a private session bus; {args.claims} "
              f"claims and {args.bookings:,} bookings of this user")
        print(machine_line())
        with daemon_on_private_bus(GPUS, args=("--config", str(config))) as rig:
            t0 = time.perf_counter()
            fill(args.claims, args.bookings)
            print(f"filled in {time.perf_counter() - t0:.1f} s")
            env = clean_env(rig.address)
            env.pop("PYTHONDONTWRITEBYTECODE", None)
            env["PYTHONPYCACHEPREFIX"] = str(workdir / "pycache")
            gpuctl = console("gpuctl") or [sys.executable, "-m", "resourced.cli"]
            label = "gpuctl" if console("gpuctl") else "python -m resourced.cli"
            context, free = f"{label} agent context --json", f"{label} free"
            cmds = {context: gpuctl + ["agent", "context", "--json"], free: gpuctl + ["free"]}
            size = len(subprocess.run(cmds[context], env=env, capture_output=True,
                                      check=True, timeout=CALL_TIMEOUT).stdout)
            print(f"`{context}` prints {size / 1024:.0f} KiB")
            report_processes(whole_processes(cmds, env, args.runs, args.warmup), context, free)
            cold_cache = {**env, "PYTHONPYCACHEPREFIX": str(workdir / "pycache-mcp")}
            mcp = anyio.run(mcp_round_trips, cold_cache, args.calls)
            report_mcp(mcp, direct_calls(args.calls), args.calls)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
