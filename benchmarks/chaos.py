"""Chaos: SIGKILL the daemon at random instants during bursts from several clients.

Each round, ``--clients`` client processes claim (whole GPUs, VRAM shares, pool amounts;
dev and run claims, each client's owned by a long-lived ``sleep``) and release their own
claims as fast as they can.  At a random instant the daemon is SIGKILLed, then restarted
on the same runtime directory, and then:

- every claim a client saw acknowledged, and did not see released, is back with the same
  GPUs, VRAM and pool amounts (``lost`` counts those that are not);
- no GPU is held twice, no VRAM or pool is held beyond its capacity (``doubled``);
- ``Describe`` answers (``unreadable``);
- no claim whose release was acknowledged is back (``revived``).

A claim whose request or release got no reply may be back or not.  Between rounds every
claim is released.  The exit status is 1 if any of those counts is not 0, or a client
failed, or the daemon's log holds a traceback.

    python benchmarks/chaos.py [--rounds 100] [--clients 8] [--gpus 4] [--seed N]

tests/bus/test_chaos.py runs a few rounds of the same in the normal suite.
"""

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from unittest import mock

from resourced.client.calls import SHORT
from resourced.client.sync import Client
from resourced.errors import DaemonUnreachable
from resourced.linux.privatebus import PrivateBus

if __package__:  # imported by the tests, as benchmarks.chaos
    from ._harness import _tmpfs, clean_env, machine_line, wait_ready
else:            # python benchmarks/chaos.py
    from _harness import _tmpfs, clean_env, machine_line, wait_ready

POOL = "slots"
POOL_CAPACITY = 3
REQUESTS = (
    dict(mode="dev", gpus=1), dict(mode="dev", gpus=2), dict(mode="run", gpus=1),
    dict(mode="dev", gpus=0, vram="20G"), dict(mode="dev", gpus=0, pools={POOL: 1}),
    dict(mode="dev", gpus=1, pools={POOL: 2}),
)
CALL_TIMEOUT = 5.0    # one client call
START_TIMEOUT = 30.0  # the clients are connected and ready
BURST_LIMIT = 30.0    # a client stops by itself after this, should the daemon never die
EXIT_TIMEOUT = 15.0   # a process is gone after it was told to go


def holding(claim: dict) -> dict:
    """What a claim holds, from a Claim reply's allocation or a Describe claim record."""
    return {"gpus": sorted(claim["gpu_uuids"]), "vram": claim["vram_bytes"],
            "pools": claim["pools"]}


# -- a client (a process of its own) ------------------------------------------------------


def client(owner: int, seed: int) -> int:
    """Claim and release, until the daemon is gone; print (JSON lines) each claim once it
    is acknowledged, each release before it is sent and once it is acknowledged.  The burst
    starts at SIGUSR1, after the ``ready`` line."""
    rng = random.Random(seed)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})

    def say(**record):
        print(json.dumps(record), flush=True)

    held: list[str] = []
    with Client(bus="session", timeout=CALL_TIMEOUT) as c:
        c.ping()
        say(op="ready")
        if signal.sigtimedwait({signal.SIGUSR1}, START_TIMEOUT) is None:
            return 1
        deadline = time.monotonic() + BURST_LIMIT
        try:
            while time.monotonic() < deadline:
                if held and rng.random() < 0.4:
                    ref = held.pop(rng.randrange(len(held)))
                    say(op="releasing", ref=ref)
                    c.release(ref)
                    say(op="released", ref=ref)
                    continue
                try:
                    allocation = c.claim(owner_pid=owner, **rng.choice(REQUESTS))["allocation"]
                except SHORT:
                    continue
                held.append(allocation["ref"])
                say(op="claimed", ref=allocation["ref"], **holding(allocation))
        except DaemonUnreachable:
            return 0
    return 0


# -- the rig and the checks ---------------------------------------------------------------


@dataclass
class Figures:
    seed: int
    rounds: int = 0
    acknowledged: int = 0
    lost: int = 0
    doubled: int = 0
    unreadable: int = 0
    revived: int = 0
    in_flight: int = 0  # claims back whose request got no reply (allowed)
    problems: list[str] = field(default_factory=list)

    def line(self) -> str:
        return (f"rounds {self.rounds}, acknowledged {self.acknowledged}, lost {self.lost}, "
                f"doubled {self.doubled}, unreadable {self.unreadable}, revived {self.revived}")


def conflicts(status: dict) -> list[str]:
    """What ``status`` (Describe) holds twice or beyond capacity."""
    whole, shares = defaultdict(list), defaultdict(list)
    used = Counter()
    for c in status["claims"]:
        for uuid in c["gpu_uuids"]:
            (shares if c["vram_bytes"] else whole)[uuid].append(c)
        used.update(c["pools"])
    found = []
    for g in status["gpus"]:
        held, shared = whole[g["uuid"]], shares[g["uuid"]]
        if len(held) > 1 or (held and shared) or \
                sum(c["vram_bytes"] for c in shared) > g["memory_bytes"]:
            found.append(f"{g['uuid']} held by {[c['id'] for c in held]}, "
                         f"shared by {[c['id'] for c in shared]}")
    found += [f"pool {p['name']}: {used[p['name']]} held of {p['capacity']}"
              for p in status["pools"] if used[p["name"]] > p["capacity"]]
    return found


def check(status: dict, outputs: list[list[dict]], figures: Figures) -> None:
    """Compare what the clients saw acknowledged with ``status``, after the restart."""
    claimed, released, releasing = {}, set(), set()
    for records in outputs:
        for r in records:
            if r["op"] == "claimed":
                claimed[r["ref"]] = {k: r[k] for k in ("gpus", "vram", "pools")}
            elif r["op"] == "released":
                released.add(r["ref"])
            elif r["op"] == "releasing":
                releasing.add(r["ref"])
    present = {c["id"]: holding(c) for c in status["claims"]}
    figures.acknowledged += len(claimed)
    figures.in_flight += len(present.keys() - claimed.keys())
    for ref, held in claimed.items():
        if ref in released:
            if ref in present:
                figures.revived += 1
                figures.problems.append(f"round {figures.rounds}: {ref} released, yet back")
        elif ref in present and present[ref] != held:
            figures.lost += 1
            figures.problems.append(f"round {figures.rounds}: {ref} held {held}, "
                                    f"came back holding {present[ref]}")
        elif ref not in present and ref not in releasing:
            figures.lost += 1
            figures.problems.append(f"round {figures.rounds}: {ref} ({held}) lost")
    double = conflicts(status)
    figures.doubled += len(double)
    figures.problems += [f"round {figures.rounds}: held twice: {d}" for d in double]


class Rig:
    """A daemon on ``bus`` (killed and restarted at will) and one owner process per client."""

    def __init__(self, bus: PrivateBus, workdir: Path, clients: int, gpus: int):
        self.workdir = workdir
        self.runtime_dir = workdir / "run"
        self.config = workdir / "config.toml"
        self.config.write_text(f'[daemon]\n[[pool]]\nname = "{POOL}"\n'
                               f"capacity = {POOL_CAPACITY}\n")
        self.env = clean_env(bus.address)
        self.daemon_env = {**self.env, "RESOURCED_SIMULATED_GPUS": str(gpus),
                           "RESOURCED_RUNTIME_DIR": str(self.runtime_dir),
                           "RESOURCED_STATE_DIR": str(workdir / "state")}
        self.log_path = workdir / "daemon.log"
        self.log = open(self.log_path, "a+")
        self.daemon: subprocess.Popen | None = None
        self.owners = [subprocess.Popen(["sleep", "infinity"]) for _ in range(clients)]

    def start_daemon(self) -> None:
        self.daemon = subprocess.Popen(
            [sys.executable, "-m", "resourced.daemon", "--session", "--config", str(self.config)],
            env=self.daemon_env, stdout=self.log, stderr=subprocess.STDOUT)
        wait_ready(self.daemon, self.log)

    def kill_daemon(self) -> None:
        self.daemon.kill()
        self.daemon.wait(EXIT_TIMEOUT)

    def fresh_daemon(self) -> None:
        """A daemon with no claims, whatever the last one left."""
        self.kill_daemon()
        shutil.rmtree(self.runtime_dir, ignore_errors=True)
        self.start_daemon()

    def burst(self, rng: random.Random, max_delay: float) -> tuple[list[list[dict]], list[str]]:
        """Start the clients, SIGKILL the daemon after a random delay, and return what each
        client printed, and what went wrong with them."""
        outs = [self.workdir / f"client-{i}.out" for i in range(len(self.owners))]
        procs = []
        try:
            for out, owner in zip(outs, self.owners):
                with open(out, "w") as f:
                    procs.append(subprocess.Popen(
                        [sys.executable, __file__, "_client", str(owner.pid),
                         str(rng.randrange(2**32))],
                        env=self.env, stdout=f, stderr=subprocess.STDOUT))
            deadline = time.monotonic() + START_TIMEOUT
            while not all(out.read_text().startswith('{"op": "ready"}') for out in outs):
                if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                    raise RuntimeError("clients not ready:\n" + _tails(outs))
                time.sleep(0.01)
            for p in procs:
                p.send_signal(signal.SIGUSR1)
            time.sleep(rng.uniform(0, max_delay))
            self.kill_daemon()
            codes = [p.wait(EXIT_TIMEOUT) for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        outputs, failed = [], []
        for out, code in zip(outs, codes):
            lines = out.read_text().splitlines()
            try:
                outputs.append([json.loads(line) for line in lines])
            except ValueError:
                code = code or "unreadable output"
            if code:
                failed.append(f"{out.name} ({code}): " + "\n".join(lines[-15:]))
        return outputs, failed

    def round(self, rng: random.Random, max_delay: float, figures: Figures) -> None:
        figures.rounds += 1
        outputs, failed = self.burst(rng, max_delay)
        figures.problems += [f"round {figures.rounds}: client {f}" for f in failed]
        try:
            self.start_daemon()
            with Client(bus="session", timeout=CALL_TIMEOUT) as c:
                status = c.status()
        except Exception as exc:  # noqa: BLE001 - the daemon's state cannot be read back
            figures.unreadable += 1
            figures.problems.append(f"round {figures.rounds}: state unreadable: {exc!r}")
            self.fresh_daemon()
            return
        check(status, outputs, figures)
        with Client(bus="session", timeout=CALL_TIMEOUT) as c:
            for claim in status["claims"]:
                c.release(claim["id"], force=True)

    def close(self) -> None:
        for p in (self.daemon, *self.owners):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
        self.log.close()


def _tails(paths: list[Path]) -> str:
    return "\n".join(f"{p.name}: {p.read_text()[-2000:]}" for p in paths)


def log_problems(text: str) -> list[str]:
    """Tracebacks, and lines that report damage, in a daemon log."""
    marks = ("Traceback", "dropping restored claim", "is damaged", "cannot persist",
             "sweep failed", "Error")
    return [line for line in text.splitlines() if any(m in line for m in marks)]


def run(rounds: int, clients: int = 8, gpus: int = 4, seed: int | None = None,
        workdir: Path | None = None, max_delay: float = 0.5) -> Figures:
    """``rounds`` rounds on a private bus; daemon log and client outputs go to ``workdir``
    (a temporary folder, removed afterwards, if None)."""
    figures = Figures(seed if seed is not None else random.randrange(2**32))
    rng = random.Random(figures.seed)
    temporary = workdir is None
    workdir = Path(tempfile.mkdtemp(prefix="resourced-chaos-", dir=_tmpfs())) if temporary \
        else workdir
    try:
        with PrivateBus() as bus, \
                mock.patch.dict(os.environ, {"DBUS_SESSION_BUS_ADDRESS": bus.address}):
            rig = Rig(bus, workdir, clients, gpus)
            try:
                rig.start_daemon()
                for _ in range(rounds):
                    rig.round(rng, max_delay, figures)
            finally:
                rig.close()
        figures.problems += [f"daemon log: {line}"
                             for line in log_problems(rig.log_path.read_text())]
    finally:
        if temporary:
            shutil.rmtree(workdir, ignore_errors=True)
    return figures


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=100)
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--gpus", type=int, default=4)
    p.add_argument("--seed", type=int, help="for the requests and the kill instants")
    p.add_argument("--max-delay", type=float, default=0.5,
                   help="the kill comes up to this many seconds into the burst")
    a = p.parse_args()
    print(machine_line())
    start = time.monotonic()
    figures = run(a.rounds, a.clients, a.gpus, a.seed, max_delay=a.max_delay)
    print(f"seed {figures.seed}, {a.clients} clients, {a.gpus} GPUs, "
          f"{time.monotonic() - start:.1f} s; claims back whose reply never came: "
          f"{figures.in_flight}")
    for problem in figures.problems:
        print(problem)
    print(figures.line())
    return 1 if figures.problems else 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["_client"]:
        sys.exit(client(int(sys.argv[2]), int(sys.argv[3])))
    sys.exit(main())
