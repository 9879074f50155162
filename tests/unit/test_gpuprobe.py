"""The GPU probe in front of a backend that blocks: one look in flight, shared, in one kept
thread, given up on at its deadline, and a look a claim begins early used by that claim;
the JSON simulation, unchanged, answered on the loop."""

import asyncio
import json
import threading

from resourced.backends.simulated import SimulatedBackend
from resourced.evidence.gpuprobe import GpuProbe


class Backend:
    """A blocking backend whose looks are counted, and that hangs while ``gate`` is clear."""

    name = "test"
    blocking = True

    def __init__(self):
        self.looks = 0
        self.threads = set()
        self.gate = threading.Event()
        self.gate.set()

    def processes(self):
        self.looks += 1
        self.threads.add(threading.get_ident())
        self.gate.wait(10)
        return {"GPU-0": []}


def run(test):
    asyncio.run(asyncio.wait_for(test(), 10))


def test_each_look_asks_the_backend_again_in_the_same_kept_thread():
    async def test():
        backend = Backend()
        probe = GpuProbe(backend, timeout=5)
        for _ in range(3):
            assert (await probe.processes()).processes == {"GPU-0": []}
        assert backend.looks == 3 and len(backend.threads) == 1
    run(test)


def test_a_look_begun_early_is_the_one_its_caller_gets_even_when_done():
    async def test():
        backend = Backend()
        probe = GpuProbe(backend, timeout=5)
        look = probe.begin()
        while not look.done():
            await asyncio.sleep(0.001)
        assert (await probe.processes(look)).known and backend.looks == 1
        assert (await probe.processes()).known and backend.looks == 2  # others look anew
    run(test)


def test_looks_share_the_one_in_flight_and_give_up_at_the_deadline():
    async def test():
        backend = Backend()
        backend.gate.clear()
        probe = GpuProbe(backend, timeout=0.2)
        first, second = await asyncio.gather(probe.processes(), probe.processes())
        assert not first.known and not second.known and "0.2 s" in first.reason
        assert backend.looks == 1
        assert "has not answered" in (await probe.processes()).reason  # no second call queued
        backend.gate.set()
        for _ in range(100):
            evidence = await probe.processes()
            if evidence.known:
                break
            await asyncio.sleep(0.01)
        assert evidence.known and backend.looks == 2
    run(test)


def test_a_backend_that_answers_at_once_is_asked_on_the_loop():
    async def test():
        backend = Backend()
        backend.blocking = False
        probe = GpuProbe(backend, timeout=5)
        assert probe.begin() is None
        assert (await probe.processes()).known and backend.threads == {threading.get_ident()}
    run(test)


class Simulated(SimulatedBackend):
    """The JSON simulation, its reads of the file counted."""

    def __init__(self, path):
        super().__init__(path=str(path))
        self.reads = 0

    def processes(self):
        self.reads += 1
        return super().processes()


def _write(path, pids, hang=0.0):
    path.write_text(json.dumps({"hang_seconds": hang, "gpus": [
        {"index": 0, "processes": [{"pid": p, "used_memory_mib": 1} for p in pids]}]}))


def test_the_simulation_unchanged_is_answered_on_the_loop_and_a_new_version_is_read(tmp_path):
    async def test():
        path = tmp_path / "gpus.json"
        _write(path, [10])
        backend = Simulated(path)
        probe = GpuProbe(backend, timeout=5)
        first = await probe.processes()
        assert probe.begin() is None  # the file is as read: nothing to begin
        again = await probe.processes()
        assert first.processes == again.processes and backend.reads == 1
        _write(path, [10, 11, 12])  # a new version (another size): read off the loop
        changed = await probe.processes()
        assert [p.pid for p in next(iter(changed.processes.values()))] == [10, 11, 12]
        assert backend.reads == 2
    run(test)


def test_a_simulation_that_hangs_is_always_asked_off_the_loop(tmp_path):
    async def test():
        path = tmp_path / "gpus.json"
        _write(path, [10], hang=0.01)
        backend = Simulated(path)
        probe = GpuProbe(backend, timeout=5)
        for _ in range(2):
            assert (await probe.processes()).known
        assert backend.reads == 2
    run(test)
