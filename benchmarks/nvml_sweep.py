"""What the GPU evidence costs: a real NVML sweep, and the sweep a claim pays for.

Without options (a machine with an NVIDIA GPU): opens resourced's ``NvmlBackend`` and
prints what ``inventory()`` and ``processes()`` see (index, UUID, name, memory, PCI bus
id; each compute process with its pid and used memory), each GPU's utilisation and used
memory through pynvml, how long ``NvmlBackend.open()`` (nvmlInit + caching the handles)
took, and a full ``processes()`` sweep timed over --runs runs (median, p99), with each
GPU's ``nvmlDeviceGetComputeRunningProcesses`` on its own.  Baseline in the same run:
``nvmlDeviceGetCount`` (a bare NVML call), and ``nvidia-smi --query-compute-apps`` when
it is installed (what a daemon that shells out would pay).  Where NVML is not usable it
says why and exits 0.

With ``--simulated N --processes P`` (any machine): spawns P ``sleep`` processes, then for
each way of simulating N GPUs starts a private bus and a daemon and times claim+release
(one ``dev`` claim of 1 GPU and its release, through one client connection):

* ``count``: RESOURCED_SIMULATED_GPUS=N, no file (the baseline: no file to read);
* ``json idle``: a JSON file of N idle GPUs, re-read on every look;
* ``json busy``: the same with the P sleeps listed on the last GPU (never granted).

Both the claim (is a free GPU busy?) and the release (do the claim's processes still run
on its GPUs?) ask the backend; the release reads /proc for what is listed on the claim's
GPUs.  It also times the pieces in this process (the backend's ``processes()``, and
``read_table()``, which the tracking sweep runs every second while claims exist), and
the daemon's CPU time (utime+stime from /proc/PID/stat) over --idle-seconds of idleness
with no claim and with 1 claim held.

    python benchmarks/nvml_sweep.py [--runs 100]
    python benchmarks/nvml_sweep.py --simulated 8 --processes 200 [--runs 200] [--idle-seconds 10]
"""

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

from _harness import daemon_on_private_bus, machine_line, summary


MIB = 1024 * 1024


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:8.3f} ms"


def timed(fn, runs: int) -> dict[str, float]:
    samples = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return summary(samples)


def line(label: str, s: dict[str, float]) -> str:
    return f"  {label:<44} p50 {ms(s['p50'])}   p99 {ms(s['p99'])}   mean {ms(s['mean'])}"


# -- a real GPU ---------------------------------------------------------------------------


def nvml_report(runs: int) -> int:
    from resourced.backends import BackendError
    from resourced.backends.nvml import NvmlBackend, nvml_errors

    t0 = time.perf_counter()
    try:
        backend = NvmlBackend.open()
    except BackendError as exc:
        print(f"no NVIDIA GPU to measure here: {exc}")
        print("(run with --simulated N --processes P to measure the simulated evidence sweep)")
        return 0
    opened = time.perf_counter() - t0
    try:
        gpus = backend.inventory()
        procs = backend.processes()
    except BackendError as exc:
        print(f"NVML opened but cannot answer: {exc}")
        return 0
    if not gpus:
        print("NVML works, but it reports no GPU")
        return 0

    print(f"NvmlBackend.open() (nvmlInit + {len(gpus)} cached handle(s)): {ms(opened)}")
    print("\ninventory():")
    for g in gpus:
        print(f"  {g.index}  {g.uuid}  {g.name}  {g.memory_bytes // MIB} MiB  PCI {g.pci_bus_id}")
    print("\nprocesses():")
    for g in gpus:
        listed = procs.get(g.uuid)
        if listed is None:
            print(f"  {g.index}  not reported")
        elif not listed:
            print(f"  {g.index}  no compute process")
        for p in listed or ():
            print(f"  {g.index}  pid {p.pid:<8} {p.used_memory_bytes // MIB} MiB")

    with nvml_errors() as nv:
        handles = [nv.nvmlDeviceGetHandleByIndex(g.index) for g in gpus]
    print("\nutilisation and memory (pynvml):")
    for g, h in zip(gpus, handles):
        try:
            with nvml_errors() as nv:
                util = nv.nvmlDeviceGetUtilizationRates(h)
                mem = nv.nvmlDeviceGetMemoryInfo(h)
            print(f"  {g.index}  gpu {util.gpu:3d} %   memory controller {util.memory:3d} %   "
                  f"used {mem.used // MIB} of {mem.total // MIB} MiB")
        except BackendError as exc:
            print(f"  {g.index}  {exc}")

    print(f"\ntimings over {runs} runs:")
    with nvml_errors() as nv:
        print(line("baseline: nvmlDeviceGetCount", timed(nv.nvmlDeviceGetCount, runs)))
        print(line(f"processes(): full sweep of {len(gpus)} GPU(s)",
                   timed(backend.processes, runs)))
        for g, h in zip(gpus, handles):
            print(line(f"  GPU {g.index}: nvmlDeviceGetComputeRunningProcesses",
                       timed(lambda h=h: nv.nvmlDeviceGetComputeRunningProcesses(h), runs)))
    smi = shutil.which("nvidia-smi")
    if smi:
        query = [smi, "--query-compute-apps=gpu_uuid,pid,used_memory", "--format=csv,noheader"]
        n = min(runs, 10)
        print(line(f"baseline: nvidia-smi --query-compute-apps (x{n})",
                   timed(lambda: subprocess.run(query, capture_output=True, timeout=60), n)))
    return 0


# -- the simulation -----------------------------------------------------------------------


def daemon(setting: str, workdir: str):
    """A private bus with a daemon on it (simulation ``setting``, an empty config so no
    user config applies)."""
    config = os.path.join(workdir, "config.toml")
    with open(config, "w") as f:
        f.write("[daemon]\n")
    return daemon_on_private_bus(setting, args=("--config", config), runtime_parent=workdir)




def claim_release_interleaved(clients: dict, runs: int, warmup: int, block: int = 20):
    """claim+release through each daemon's client, in alternating blocks of ``block``, so
    every configuration sees the same machine state; the first ``warmup`` of each are not
    counted."""
    pid = os.getpid()
    samples = {name: {"claim+release": [], "  claim": [], "  release": []} for name in clients}
    done = dict.fromkeys(clients, 0)
    total = warmup + runs
    while min(done.values()) < total:
        for name, c in clients.items():
            for _ in range(min(block, total - done[name])):
                t0 = time.perf_counter()
                ref = c.claim(mode="dev", gpus=1, owner_pid=pid)["allocation"]["ref"]
                t1 = time.perf_counter()
                c.release(ref)
                t2 = time.perf_counter()
                if done[name] >= warmup:
                    samples[name]["claim+release"].append(t2 - t0)
                    samples[name]["  claim"].append(t1 - t0)
                    samples[name]["  release"].append(t2 - t1)
                done[name] += 1
    return {name: {op: summary(v) for op, v in ops.items()} for name, ops in samples.items()}


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat", "rb") as f:
        data = f.read()
    fields = data[data.rindex(b")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def idle_cpu(pid: int, seconds: float) -> float:
    before = cpu_seconds(pid)
    time.sleep(seconds)
    return cpu_seconds(pid) - before


def write_simulation(path: str, n: int, listed: list[int]) -> None:
    gpus = [{"index": i, "processes": []} for i in range(n)]
    gpus[-1]["processes"] = [{"pid": p, "used_memory_mib": 100} for p in listed]
    with open(path, "w") as f:
        json.dump({"gpus": gpus}, f)


def simulated_report(n: int, p: int, runs: int, idle_seconds: float) -> int:
    from resourced.backends.simulated import SimulatedBackend
    from resourced.evidence.proctable import read_table

    if n < 2:
        raise SystemExit("--simulated needs at least 2 GPUs (the last one is listed busy)")
    sleeps = [subprocess.Popen(["sleep", "3600"]) for _ in range(p)]
    workdir = tempfile.mkdtemp(prefix="resourced-nvml-sweep-")
    try:
        idle_path = os.path.join(workdir, "idle.json")
        busy_path = os.path.join(workdir, "busy.json")
        write_simulation(idle_path, n, [])
        write_simulation(busy_path, n, [s.pid for s in sleeps])
        table_size = len(read_table())
        print(f"{n} simulated GPU(s); {p} sleep process(es) spawned; {table_size} processes "
              "in this machine's table")

        print(f"\nthe pieces, in this process ({runs} runs):")
        print(line("read_table() (the tracking sweep's read)", timed(read_table, runs)))
        for label, backend in (("count (baseline)", SimulatedBackend(count=n)),
                               ("json idle", SimulatedBackend(path=idle_path))):
            print(line(f"processes(), {label}", timed(backend.processes, runs)))
        print(line(f"processes(), json busy ({p} pids listed)",
                   timed(SimulatedBackend(path=busy_path).processes, runs)))

        print(f"\nclaim+release through the daemon ({runs} runs each after {runs // 10} "
              "warm-up, in alternating blocks):")
        from resourced import Client

        configs = {"count (baseline)": str(n), "json idle": idle_path,
                   f"json busy ({p} pids listed)": busy_path}
        with contextlib.ExitStack() as stack:
            clients = {}
            for name, setting in configs.items():
                stack.enter_context(daemon(setting, workdir))
                # The client connects now, to the bus the environment names now.
                clients[name] = stack.enter_context(Client(bus="session"))
                clients[name].ping()
            results = claim_release_interleaved(clients, runs, runs // 10)
        for name, r in results.items():
            for op, stats in r.items():
                print(line(f"{name}: {op}", stats))
        base = results["count (baseline)"]["claim+release"]["p50"]
        for name, r in list(results.items())[1:]:
            extra = r["claim+release"]["p50"] - base
            print(f"  {name}: the evidence sweep adds {extra * 1e3:+.3f} ms to the p50 "
                  f"claim+release ({r['claim+release']['p50'] / base:.2f}x the baseline)")

        print(f"\ndaemon CPU time while idle for {idle_seconds:g} s (json busy):")
        with daemon(busy_path, workdir) as rig:
            none = idle_cpu(rig.daemon.pid, idle_seconds)
            with Client(bus="session") as c:
                ref = c.claim(mode="dev", gpus=1, owner_pid=os.getpid())["allocation"]["ref"]
                one = idle_cpu(rig.daemon.pid, idle_seconds)
                c.release(ref)
        for label, cpu in (("no claims", none), ("1 claim held (tracking sweep on)", one)):
            print(f"  {label:<36} {cpu * 1e3:8.0f} ms CPU  "
                  f"({cpu / idle_seconds * 100:.2f} % of one CPU)")
    finally:
        for s in sleeps:
            s.kill()
        for s in sleeps:
            s.wait()
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=None,
                    help="timed runs (default 100 for NVML, 200 simulated)")
    ap.add_argument("--simulated", type=int, metavar="N",
                    help="measure the simulated sweep with N GPUs instead of NVML")
    ap.add_argument("--processes", type=int, default=0, metavar="P",
                    help="with --simulated: sleep processes to spawn first")
    ap.add_argument("--idle-seconds", type=float, default=10.0,
                    help="with --simulated: how long to measure the idle daemon's CPU time")
    args = ap.parse_args()
    print(machine_line())
    if args.simulated is not None:
        return simulated_report(args.simulated, args.processes, args.runs or 200,
                                args.idle_seconds)
    return nvml_report(args.runs or 100)


if __name__ == "__main__":
    sys.exit(main())
