"""GPU acceptance: every path of resourced that touches a real NVIDIA GPU, in one run.

Run by ``scripts/gpu-acceptance.sh`` (which makes the fresh environment), on a machine
with the NVIDIA driver; a few minutes, no network.  A private bus and a daemon on the
real NVML backend, then, one line per check:

- inventory: the daemon's GPUs against ``nvidia-smi`` (UUID, name, memory, index, MIG
  mode), and the time of an NVML sweep (``NvmlBackend.processes``, median of 20);
- for each GPU in turn: ``gpuctl run --gpu N`` starts a small CUDA program (the driver
  API through ctypes on ``libcuda.so.1``: a context and 64 MiB, no framework) that sees
  exactly one device, the granted one; NVML lists that process on that GPU alone, and
  ``gpuctl verify`` attributes it to the run's claim;
- unclaimed use: the same program started outside resourced on a free GPU is UNCLAIMED
  USE in ``verify``, and a claim of that GPU is refused (exit 4);
- isolation, where the system service runs with ``isolation`` on: the program under
  ``gpuctl run --isolate`` sees the granted GPU alone and cannot open another's node,
  and ``nvidia-smi -L`` inside lists it alone (elsewhere: skipped, saying why);
- ``gpuctl doctor --probe`` (no check failed) and ``gpuctl metrics`` against
  ``nvidia-smi`` (GPU count, and each GPU's memory in ``status``).

Prints one line per check and a summary, writes the report (text, and ``.json`` beside
it) to ``--report``; exit 0 when every check passed or was skipped, 1 when one failed,
77 without an NVIDIA driver (nothing checked, nothing changed).

``--simulated N``: the same checks on the simulated backend (N GPUs), for the tests: the
simulation file stands in for the driver (the program's pid is listed on the GPU it was
granted, as NVML would list it), and what needs a real GPU says so.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

EXIT_PASSED, EXIT_FAILED, EXIT_NO_DRIVER = 0, 1, 77
HOLD_MIB = 64
CALL_TIMEOUT = 60

HOLDER = r'''
"""Hold a CUDA context and some memory on the one device this process may see; print
what it saw as one JSON line, then wait for a line on stdin."""
import ctypes, json, os, sys

simulated, mib = sys.argv[1] == "simulated", int(sys.argv[2])
seen = {"pid": os.getpid(), "allocation": os.environ.get("RESOURCED_ALLOCATION", "")}
if simulated:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    seen.update(devices=len([v for v in visible.split(",") if v]), uuid=visible)
else:
    cuda = ctypes.CDLL("libcuda.so.1")

    def ok(result, what):
        if result != 0:
            print(json.dumps({**seen, "error": f"{what}: CUresult {result}"}), flush=True)
            sys.exit(1)

    ok(cuda.cuInit(0), "cuInit")
    count = ctypes.c_int()
    ok(cuda.cuDeviceGetCount(ctypes.byref(count)), "cuDeviceGetCount")
    device = ctypes.c_int()
    ok(cuda.cuDeviceGet(ctypes.byref(device), 0), "cuDeviceGet")
    raw = (ctypes.c_ubyte * 16)()
    ok(cuda.cuDeviceGetUuid(raw, device), "cuDeviceGetUuid")
    h = bytes(raw).hex()
    context, memory = ctypes.c_void_p(), ctypes.c_uint64()
    ok(cuda.cuCtxCreate_v2(ctypes.byref(context), 0, device), "cuCtxCreate")
    ok(cuda.cuMemAlloc_v2(ctypes.byref(memory), mib << 20), "cuMemAlloc")
    seen.update(devices=count.value,
                uuid=f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}")
print(json.dumps(seen), flush=True)
sys.stdin.readline()
'''


class Report:
    """The checks' results, printed as they come and written at the end."""

    def __init__(self, path: Path):
        self.path = path
        self.rows: list[dict] = []
        self.facts: dict[str, str] = {}

    def add(self, check: str, status: str, detail: str = "") -> None:
        self.rows.append({"check": check, "status": status, "detail": detail})
        print(f"{status:<7} {check}{': ' + detail if detail else ''}", flush=True)

    def passed(self, check: str, detail: str = "") -> None:
        self.add(check, "PASS", detail)

    def failed(self, check: str, detail: str) -> None:
        self.add(check, "FAIL", detail)

    def skipped(self, check: str, why: str) -> None:
        self.add(check, "SKIP", why)

    def expect(self, check: str, ok: bool, detail: str, why_not: str = "") -> bool:
        if ok:
            self.passed(check, detail)
        else:
            self.failed(check, why_not or detail)
        return ok

    def finish(self) -> int:
        counts = {s: sum(r["status"] == s for r in self.rows) for s in ("PASS", "FAIL", "SKIP")}
        line = (f"{counts['PASS']} passed, {counts['FAIL']} failed, {counts['SKIP']} skipped"
                f" ({len(self.rows)} checks)")
        print(line)
        facts = "".join(f"{k}: {v}\n" for k, v in self.facts.items())
        self.path.write_text(facts + "".join(
            f"{r['status']:<7} {r['check']}{': ' + r['detail'] if r['detail'] else ''}\n"
            for r in self.rows) + line + "\n")
        self.path.with_suffix(".json").write_text(json.dumps(
            {"facts": self.facts, "checks": self.rows, "summary": counts}, indent=1) + "\n")
        print(f"report: {self.path}")
        return EXIT_FAILED if counts["FAIL"] else EXIT_PASSED


# -- the driver's own view -------------------------------------------------------------
def no_driver() -> str | None:
    """Why this machine has no usable NVIDIA driver, or None."""
    if shutil.which("nvidia-smi") is None:
        return "nvidia-smi is not installed"
    try:
        import pynvml

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
    except Exception as exc:  # noqa: BLE001 - any failure: no driver to test
        return f"NVML cannot start: {exc}"
    return None


def smi_gpus() -> list[dict]:
    """What nvidia-smi says of each GPU."""
    fields = "index,uuid,name,memory.total,mig.mode.current"
    out = subprocess.run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, check=True, timeout=CALL_TIMEOUT).stdout
    gpus = []
    for line in out.strip().splitlines():
        index, uuid, name, memory, mig = (v.strip() for v in line.split(","))
        gpus.append({"index": int(index), "uuid": uuid, "name": name,
                     "memory_mib": int(memory), "mig": mig})
    return gpus


def nvml_pids() -> dict[str, set[int]]:
    """UUID -> the compute processes NVML lists on that GPU."""
    import pynvml

    pynvml.nvmlInit()
    try:
        found = {}
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            uuid = pynvml.nvmlDeviceGetUUID(handle)
            uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
            found[uuid] = {p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)}
        return found
    finally:
        pynvml.nvmlShutdown()


def minor_of(uuid: str) -> int:
    """The minor number of a GPU's device node (/dev/nvidia<minor>), from NVML."""
    import pynvml

    pynvml.nvmlInit()
    try:
        return pynvml.nvmlDeviceGetMinorNumber(pynvml.nvmlDeviceGetHandleByUUID(uuid))
    finally:
        pynvml.nvmlShutdown()


class Simulation:
    """The file behind RESOURCED_SIMULATED_GPUS, standing in for the driver."""

    def __init__(self, path: Path, count: int):
        from resourced.backends.simulated import simulated_uuid

        self.path = path
        self.gpus = {i: {"index": i, "uuid": simulated_uuid(i), "name": "Simulated GPU",
                         "memory_total_mib": 81920, "processes": []} for i in range(count)}
        self.write()

    def write(self) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps({"gpus": list(self.gpus.values())}))
        os.replace(tmp, self.path)

    def put(self, uuid: str, pid: int | None) -> None:
        """List ``pid`` (None: nothing) on GPU ``uuid``, as the driver would."""
        for gpu in self.gpus.values():
            if gpu["uuid"] == uuid:
                gpu["processes"] = [] if pid is None else [{"pid": pid,
                                                            "used_memory_mib": HOLD_MIB}]
        self.write()

    def smi(self) -> list[dict]:
        return [{"index": g["index"], "uuid": g["uuid"], "name": g["name"],
                 "memory_mib": g["memory_total_mib"], "mig": "N/A"}
                for g in self.gpus.values()]

    def pids(self) -> dict[str, set[int]]:
        return {g["uuid"]: {p["pid"] for p in g["processes"]} for g in self.gpus.values()}


# -- the run ---------------------------------------------------------------------------
class Acceptance:
    def __init__(self, report: Report, workdir: Path, simulated: int):
        self.report = report
        self.workdir = workdir
        self.sim = Simulation(workdir / "gpus.json", simulated) if simulated else None
        self.holder = workdir / "holder.py"
        self.holder.write_text(HOLDER)
        self.env: dict[str, str] = {}
        self.bus = self.daemon = None

    # the daemon, on a private bus
    def start(self) -> None:
        from resourced.linux.privatebus import PrivateBus

        self.bus = PrivateBus().start()
        runtime = self.workdir / "runtime"
        runtime.mkdir()
        self.env = {**os.environ, **self.bus.env(), "DBUS_SYSTEM_BUS_ADDRESS": self.bus.address,
                    "RESOURCED_RUNTIME_DIR": str(runtime),
                    "RESOURCED_STATE_DIR": str(runtime / "state"),
                    "RESOURCED_CONFIG": str(self.workdir / "config.toml"),
                    "XDG_STATE_HOME": str(self.workdir / "user-state")}
        self.env.pop("RESOURCED_SIMULATED_GPUS", None)
        if self.sim:
            self.env["RESOURCED_SIMULATED_GPUS"] = str(self.sim.path)
        (self.workdir / "config.toml").write_text("# gpu acceptance: all defaults\n")
        log = open(self.workdir / "daemon.log", "w")
        self.daemon = subprocess.Popen([sys.executable, "-m", "resourced.daemon", "--session"],
                                       env=self.env, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while self.gpuctl("free").returncode != 0:
            if self.daemon.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the daemon did not start: "
                                   + (self.workdir / "daemon.log").read_text()[-2000:])
            time.sleep(0.1)

    def stop(self) -> None:
        if self.daemon and self.daemon.poll() is None:
            self.daemon.terminate()
            self.daemon.wait(15)
        if self.bus:
            self.bus.stop()

    def gpuctl(self, *args: str, **kw) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "resourced.cli", *args], env=self.env,
                              capture_output=True, text=True, timeout=CALL_TIMEOUT, **kw)

    def status(self) -> dict:
        return json.loads(self.gpuctl("status", "--json").stdout)

    def verify(self) -> dict[str, dict]:
        return {g["uuid"]: g for g in json.loads(self.gpuctl("verify", "--json").stdout)["gpus"]}

    def truth(self) -> list[dict]:
        return self.sim.smi() if self.sim else smi_gpus()

    def listed(self) -> dict[str, set[int]]:
        return self.sim.pids() if self.sim else nvml_pids()

    def hold(self, argv: list[str], env: dict) -> tuple[subprocess.Popen, dict]:
        """Start the CUDA program (through ``argv``: gpuctl run ..., or nothing); what it
        saw, and, on the simulated backend, its pid listed on the GPU it may see."""
        proc = subprocess.Popen([*argv, sys.executable, str(self.holder),
                                 "simulated" if self.sim else "cuda", str(HOLD_MIB)],
                                env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        line = proc.stdout.readline()
        if not line:
            proc.wait(CALL_TIMEOUT)
            raise RuntimeError(f"the CUDA program said nothing: {proc.stderr.read().strip()}")
        seen = json.loads(line)
        if "error" in seen:
            raise RuntimeError(seen["error"])
        if self.sim:
            self.sim.put(seen["uuid"], seen["pid"])
        return proc, seen

    def release(self, proc: subprocess.Popen, seen: dict) -> int:
        if self.sim:
            self.sim.put(seen["uuid"], None)
        proc.stdin.write("\n")
        proc.stdin.flush()
        return proc.wait(CALL_TIMEOUT)

    # the checks
    def inventory(self) -> list[dict]:
        truth, ours = self.truth(), self.status()["gpus"]
        self.report.facts["gpus"] = "; ".join(f"{g['index']}: {g['name']} {g['uuid']} "
                                              f"{g['memory_mib']} MiB MIG {g['mig']}"
                                              for g in truth)
        by_uuid = {g["uuid"]: g for g in ours}
        wrong = [f"{g['uuid']}: ours {by_uuid.get(g['uuid'])}" for g in truth
                 if g["uuid"] not in by_uuid or by_uuid[g["uuid"]]["index"] != g["index"]
                 or by_uuid[g["uuid"]]["name"] != g["name"]
                 or by_uuid[g["uuid"]]["memory_bytes"] >> 20 != g["memory_mib"]]
        self.report.expect("inventory matches nvidia-smi", not wrong and len(ours) == len(truth),
                           f"{len(truth)} GPU(s): UUIDs, names, memory, indices",
                           "; ".join(wrong) or f"{len(ours)} GPUs here, {len(truth)} there")
        if any(g["mig"] == "Enabled" for g in truth):
            self.report.skipped("MIG instances", "MIG mode is on: resourced hands out whole "
                                "GPUs, so their instances are not checked")
        return truth

    def sweep(self) -> None:
        if self.sim:
            self.report.skipped("NVML sweep time", "needs a GPU")
            return
        from resourced.backends.nvml import NvmlBackend

        backend = NvmlBackend()
        backend.open()
        times = []
        for _ in range(20):
            t = time.perf_counter()
            backend.processes()
            times.append(time.perf_counter() - t)
        self.report.passed("NVML sweep time",
                           f"median {statistics.median(times) * 1e3:.2f} ms over 20 sweeps")

    def each_gpu_runs_and_is_attributed(self, truth: list[dict]) -> None:
        for gpu in truth:
            check = f"gpu{gpu['index']}: a run's CUDA process is its claim's"
            try:
                proc, seen = self.hold([sys.executable, "-m", "resourced.cli", "run", "--gpu",
                                        str(gpu["index"]), "--"], self.env)
            except RuntimeError as exc:
                self.report.failed(check, str(exc))
                continue
            try:
                listed = self.listed()
                on = sorted(u for u, pids in listed.items() if seen["pid"] in pids)
                report = self.verify().get(gpu["uuid"], {})
                theirs = [p for p in report.get("processes", []) if p["pid"] == seen["pid"]]
                self.report.expect(
                    check,
                    seen["devices"] == 1 and seen["uuid"] == gpu["uuid"] and on == [gpu["uuid"]]
                    and report.get("status") == "OK" and theirs
                    and theirs[0]["claim"] == seen["allocation"],
                    f"sees 1 device ({seen['uuid']}), NVML lists pid {seen['pid']} there "
                    f"alone, verify: OK, claim {seen['allocation']}",
                    f"saw {seen['devices']} device(s) ({seen['uuid']}), listed on {on}, "
                    f"verify {report.get('status')} {theirs}")
            finally:
                code = self.release(proc, seen)
                if code != 0:
                    self.report.failed(f"gpu{gpu['index']}: gpuctl run's exit", f"exit {code}")

    def unclaimed_use(self, truth: list[dict]) -> None:
        gpu = truth[-1]
        check = f"gpu{gpu['index']}: a process outside resourced is UNCLAIMED USE"
        env = {**self.env, "CUDA_VISIBLE_DEVICES": gpu["uuid"]}
        try:
            proc, seen = self.hold([], env)
        except RuntimeError as exc:
            self.report.failed(check, str(exc))
            return
        try:
            report = self.verify().get(gpu["uuid"], {})
            self.report.expect(check, report.get("status") == "UNCLAIMED USE",
                               f"pid {seen['pid']}", f"verify says {report.get('status')}")
            claim = self.gpuctl("claim", "--gpu", str(gpu["index"]), "--owner-pid",
                                str(os.getpid()))
            self.report.expect(f"gpu{gpu['index']}: a claim of a busy GPU is refused",
                               claim.returncode == 4, "exit 4: " + claim.stderr.strip()[:120],
                               f"exit {claim.returncode}: {claim.stderr.strip()[:200]}")
            if claim.returncode == 0:
                self.gpuctl("release", "--allocation", claim.stdout.strip(), "--force")
        finally:
            self.release(proc, seen)

    def isolation(self, truth: list[dict]) -> None:
        check = "isolation: an --isolate run sees its GPU alone"
        if self.sim:
            self.report.skipped(check, "needs a GPU (tests/systemd proves the device filter "
                                "under a real systemd with placeholder nodes)")
            return
        system = {**os.environ}
        for key in ("DBUS_SESSION_BUS_ADDRESS", "RESOURCED_BUS"):
            system.pop(key, None)
        dry = subprocess.run([sys.executable, "-m", "resourced.cli", "run", "--bus", "system",
                              "--isolate", "--dry-run", "--", "true"], env=system,
                             capture_output=True, text=True, timeout=CALL_TIMEOUT)
        if dry.returncode != 0:
            self.report.skipped(check, "needs the system service with isolation on (gpuctl "
                                "service enable --system, [daemon] isolation = \"opt-in\"), as "
                                f"a user: {dry.stderr.strip()[:160]}")
            return
        gpu = truth[0]
        argv = [sys.executable, "-m", "resourced.cli", "run", "--bus", "system", "--isolate",
                "--gpu", str(gpu["index"]), "--"]
        try:
            proc, seen = self.hold(argv, system)
        except RuntimeError as exc:
            self.report.failed(check, str(exc))
            return
        try:
            self.report.expect(check, seen["devices"] == 1 and seen["uuid"] == gpu["uuid"],
                               f"cuDeviceGetCount 1, {seen['uuid']}",
                               f"saw {seen['devices']} device(s), {seen['uuid']}")
        finally:
            self.release(proc, seen)
        if len(truth) > 1:
            other = f"/dev/nvidia{minor_of(truth[1]['uuid'])}"
            opened = subprocess.run([*argv, sys.executable, "-c",
                                     f"import os; os.close(os.open({other!r}, os.O_RDWR))"],
                                    env=system, capture_output=True, text=True,
                                    timeout=CALL_TIMEOUT)
            refused = opened.returncode != 0 and "Operation not permitted" in opened.stderr
            self.report.expect("isolation: another GPU's node cannot be opened", refused,
                               f"{other}: EPERM",
                               f"exit {opened.returncode}: {opened.stderr[-200:]}")
        listed = subprocess.run([*argv, "nvidia-smi", "-L"], env=system, capture_output=True,
                                text=True, timeout=CALL_TIMEOUT)
        lines = [line for line in listed.stdout.splitlines() if line.startswith("GPU ")]
        self.report.expect("isolation: nvidia-smi -L inside lists its GPU alone",
                           len(lines) == 1 and gpu["uuid"] in lines[0], lines[0] if lines else "",
                           listed.stdout.strip()[:200] or listed.stderr.strip()[:200])

    def doctor_and_metrics(self, truth: list[dict]) -> None:
        doctor = self.gpuctl("doctor", "--probe", "--json")
        checks = json.loads(doctor.stdout)["checks"] if doctor.stdout.strip() else []
        failing = [f"{c['id']}: {c['summary']}" for c in checks if c["status"] == "fail"]
        warned = [c["id"] for c in checks if c["status"] == "warn"]
        self.report.expect("doctor --probe: no check failed", doctor.returncode == 0,
                           f"{len(checks)} checks" + (f", warned: {', '.join(warned)}"
                                                      if warned else ""),
                           "; ".join(failing) or doctor.stderr.strip()[:200])
        metrics = self.gpuctl("metrics").stdout
        counted = sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
                      if line.startswith("resourced_gpus{"))
        memory = {g["uuid"]: g["memory_bytes"] >> 20 for g in self.status()["gpus"]}
        wrong = [g["uuid"] for g in truth if memory.get(g["uuid"]) != g["memory_mib"]]
        self.report.expect("metrics and status agree with nvidia-smi",
                           counted == len(truth) and not wrong,
                           f"resourced_gpus sums to {counted:g}; each GPU's memory",
                           f"resourced_gpus {counted:g} for {len(truth)} GPUs; memory of {wrong}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--report", type=Path, default=Path("gpu-acceptance.txt"),
                   help="where the report goes (and .json beside it)")
    p.add_argument("--simulated", type=int, default=0, metavar="N",
                   help="check the simulated backend's N GPUs instead (for the tests)")
    a = p.parse_args(argv)
    if not a.simulated:
        why = no_driver()
        if why:
            print(f"no NVIDIA driver here ({why}): nothing was checked or changed")
            return EXIT_NO_DRIVER
    report = Report(a.report.resolve())
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="resourced-acceptance-") as work:
        run = Acceptance(report, Path(work), a.simulated)
        try:
            if not a.simulated:
                report.facts["driver"] = subprocess.run(
                    ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                    capture_output=True, text=True, timeout=CALL_TIMEOUT).stdout.split("\n")[0]
            run.start()
            truth = run.inventory()
            run.sweep()
            run.each_gpu_runs_and_is_attributed(truth)
            run.unclaimed_use(truth)
            run.isolation(truth)
            run.doctor_and_metrics(truth)
        except Exception as exc:  # noqa: BLE001 - the report says where it stopped
            report.failed("the run", f"stopped: {type(exc).__name__}: {exc}")
        finally:
            run.stop()
    report.facts["took"] = f"{time.monotonic() - started:.1f} s"
    return report.finish()


if __name__ == "__main__":
    sys.exit(main())
