"""A durable log's fsync: off the loop, one for every write made before it began, and
awaited before a reply; a failure reaches the waiters, and the next sync tries again."""

import asyncio
import os
import threading

import pytest

from resourced.daemon.store import jsonlog
from resourced.daemon.store.jsonlog import JsonLog


class Disk:
    """``os.fsync`` as the log sees it: counted, held until released (in the log's own
    thread), or failing."""

    def __init__(self, monkeypatch):
        self.calls = 0
        self.on_the_loop = 0
        self.gate = threading.Event()
        self.gate.set()
        self.held = threading.Event()  # an fsync waits at the gate now
        self.error: OSError | None = None
        real = os.fsync

        def fsync(fd):
            self.calls += 1
            if threading.current_thread() is threading.main_thread():
                self.on_the_loop += 1
            else:
                self.held.set()
                assert self.gate.wait(5), "the test never released the disk"
            if self.error is not None:
                raise self.error
            real(fd)

        monkeypatch.setattr(jsonlog.os, "fsync", fsync)

    async def until_held(self) -> None:
        """Return (the loop running meanwhile) once the log's thread waits in fsync."""
        held = await asyncio.get_running_loop().run_in_executor(None, self.held.wait, 5)
        assert held, "no fsync reached the disk"


@pytest.fixture
def disk(monkeypatch):
    return Disk(monkeypatch)


def fresh_log(tmp_path) -> JsonLog:
    log = JsonLog(tmp_path, "test.log", "state directory", durable=True)
    log.rewrite([{"schema": 1}])
    return log


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 5))


def test_without_a_loop_an_append_is_synced_before_it_returns(tmp_path, disk):
    log = fresh_log(tmp_path)
    before = disk.calls
    log.append([{"op": "a"}])
    assert disk.calls == before + 1
    run(log.synced())  # nothing left to wait for
    assert disk.calls == before + 1


def test_the_loop_goes_on_while_the_disk_is_slow(tmp_path, disk):
    log = fresh_log(tmp_path)

    async def scenario():
        disk.gate.clear()
        log.append([{"op": "a"}])  # returns at once: the fsync waits in its thread
        waiter = asyncio.ensure_future(log.synced())
        before = disk.on_the_loop
        await disk.until_held()  # the loop answered that while the fsync was held
        assert not waiter.done(), "synced() returned before the disk had the line"
        assert disk.on_the_loop == before
        disk.gate.set()
        await waiter

    run(scenario())
    assert (tmp_path / "test.log").read_text().splitlines()[-1] == '{"op": "a"}'


def test_one_fsync_serves_every_write_made_before_it_began(tmp_path, disk):
    log = fresh_log(tmp_path)

    async def scenario():
        start = disk.calls
        disk.gate.clear()
        log.append([{"op": "a"}])  # its sync starts, and is held
        await disk.until_held()
        for name in "bcd":  # written while it is held: they need one more sync
            log.append([{"op": name}])
        waiters = [asyncio.ensure_future(log.synced()) for _ in range(4)]
        disk.gate.set()
        await asyncio.gather(*waiters)
        return disk.calls - start

    assert run(scenario()) == 2


def test_a_failed_fsync_reaches_the_waiter_and_the_next_one_tries_again(tmp_path, disk):
    log = fresh_log(tmp_path)

    async def scenario():
        disk.error = OSError(5, "Input/output error")
        log.append([{"op": "a"}])
        with pytest.raises(OSError, match="Input/output error"):
            await log.synced()
        disk.error = None
        calls = disk.calls
        await log.synced()  # not yet on disk: synced again
        return disk.calls - calls

    assert run(scenario()) == 1


def test_close_syncs_what_no_one_waited_for(tmp_path, disk):
    log = fresh_log(tmp_path)

    async def scenario():
        disk.gate.clear()
        log.append([{"op": "a"}])
        await disk.until_held()
        before = disk.on_the_loop
        log.close()
        disk.gate.set()
        return disk.on_the_loop - before

    assert run(scenario()) == 1
