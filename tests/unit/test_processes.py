"""Processes as (pid, start time), read from /proc: real processes, no mocks."""

import asyncio
import contextlib
import errno
import os
import re
import resource
import subprocess
import threading

import pytest

from resourced.core.claims import ProcessRef
from resourced.evidence import liveness
from resourced.evidence.liveness import IDLE_KEPT, ExitWatcher
from resourced.evidence.processes import (
    boot_id,
    is_alive,
    pid_max,
    pin_process,
    process_ref,
    process_uid,
)

TIMEOUT = 10


def unused_pid() -> int:
    """A pid no process can have: beyond the kernel's limit."""
    with open("/proc/sys/kernel/pid_max") as f:
        return int(f.read()) + 1


def uptime_ticks() -> int:
    with open("/proc/uptime") as f:
        return int(float(f.read().split()[0]) * os.sysconf("SC_CLK_TCK"))


@pytest.fixture
def child():
    """A sleeping child process, killed and reaped afterwards."""
    proc = subprocess.Popen(["sleep", "60"])
    yield proc
    proc.kill()
    proc.wait(TIMEOUT)


def test_process_ref_of_this_process():
    ref = process_ref(os.getpid())
    assert isinstance(ref, ProcessRef)
    assert ref.pid == os.getpid()
    assert 0 <= ref.start_time <= uptime_ticks() + 1
    assert process_ref(os.getpid()) == ref  # stable while the process lives


def test_a_later_process_started_no_earlier(child):
    mine, theirs = process_ref(os.getpid()), process_ref(child.pid)
    assert theirs.pid == child.pid
    assert theirs.start_time >= mine.start_time


@pytest.mark.parametrize("pid", [0, -1, "-own"])
def test_process_ref_of_no_pid_is_none(pid):
    assert process_ref(-os.getpid() if pid == "-own" else pid) is None


def test_process_ref_of_a_nonexistent_pid_is_none():
    assert process_ref(unused_pid()) is None


def test_process_ref_of_an_exited_and_reaped_child_is_none():
    proc = subprocess.Popen(["true"])
    proc.wait(TIMEOUT)
    assert process_ref(proc.pid) is None  # pids are handed out cyclically: not reused yet


def test_process_ref_of_a_zombie_is_none():
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    try:
        # Wait until the child has exited, but leave it unreaped: a zombie.
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
        assert info.si_pid == pid
        with open(f"/proc/{pid}/stat") as f:
            assert f.read().rsplit(")", 1)[1].split()[0] == "Z"
        assert process_ref(pid) is None
    finally:
        os.waitpid(pid, 0)


def test_process_ref_survives_a_command_name_with_spaces_and_parentheses(tmp_path):
    odd = tmp_path / "a) b (c"
    odd.symlink_to("/bin/sleep")
    proc = subprocess.Popen([str(odd), "60"])
    try:
        ref = process_ref(proc.pid)
        assert ref is not None and ref.pid == proc.pid
        assert ref.start_time >= process_ref(os.getpid()).start_time
    finally:
        proc.kill()
        proc.wait(TIMEOUT)


def test_process_ref_of_a_thread_that_is_not_a_process_is_none():
    started, stop = threading.Event(), threading.Event()
    tid = []

    def run():
        tid.append(threading.get_native_id())
        started.set()
        stop.wait(TIMEOUT)

    t = threading.Thread(target=run)
    t.start()
    try:
        assert started.wait(TIMEOUT)
        assert tid[0] != os.getpid()
        assert process_ref(tid[0]) is None
    finally:
        stop.set()
        t.join(TIMEOUT)


def test_is_alive_for_a_running_process(child):
    assert is_alive(process_ref(child.pid))
    assert is_alive(process_ref(os.getpid()))


def test_is_alive_refuses_a_reused_pid():
    ref = process_ref(os.getpid())
    assert not is_alive(ProcessRef(ref.pid, ref.start_time + 1))
    assert not is_alive(ProcessRef(ref.pid, ref.start_time - 1))


def test_is_alive_turns_false_when_the_process_exits(child):
    ref = process_ref(child.pid)
    child.kill()
    child.wait(TIMEOUT)
    assert not is_alive(ref)


def test_is_alive_of_a_nonexistent_pid_is_false():
    assert not is_alive(ProcessRef(unused_pid(), 1))


def test_process_uid_of_this_process():
    assert process_uid(os.getpid()) == os.getuid()


def test_process_uid_of_a_child(child):
    assert process_uid(child.pid) == os.getuid()


def test_process_uid_of_a_nonexistent_pid_is_none():
    assert process_uid(unused_pid()) is None


def test_boot_id_is_a_stable_lowercase_uuid():
    value = boot_id()
    assert re.fullmatch(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", value)
    assert boot_id() == value


# -- a full descriptor table says nothing about the process -----------------------------


@contextlib.contextmanager
def full_fd_table():
    """This process's descriptor table filled up (the soft limit lowered meanwhile)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    fds = []
    resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 16, hard))
    try:
        while True:
            try:
                fds.append(os.open("/dev/null", os.O_RDONLY))
            except OSError:
                break
        yield
    finally:
        for fd in fds:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_pinning_a_live_process_with_no_descriptor_left_raises_not_gone():
    with full_fd_table(), pytest.raises(OSError) as info:
        pin_process(os.getpid())
    assert info.value.errno == errno.EMFILE


def test_watching_a_live_process_with_no_descriptor_left_raises_not_gone():
    loop = asyncio.new_event_loop()
    me = process_ref(os.getpid())
    try:
        watcher = ExitWatcher(loop, lambda key: None)
        with full_fd_table(), pytest.raises(OSError) as info:
            watcher.watch("me", me)
        assert info.value.errno == errno.EMFILE
    finally:
        loop.close()


@pytest.mark.parametrize("pid", [2**31, 2**32 - 1, 2**63])
def test_a_pid_beyond_pid_max_is_no_process(pid):
    assert pid > pid_max()
    assert pin_process(pid) is None


def _child() -> subprocess.Popen:
    return subprocess.Popen(["sleep", "30"])


async def _soon(condition) -> None:
    """Let the loop run until ``condition()`` holds, for at most 2 s (the caller asserts)."""
    for _ in range(200):
        if condition():
            return
        await asyncio.sleep(0.01)


def test_a_process_watched_again_keeps_its_registration_and_its_exit_is_still_heard():
    async def test():
        exited = []
        watcher = ExitWatcher(asyncio.get_running_loop(), exited.append)
        child = _child()
        ref = process_ref(child.pid)
        try:
            assert watcher.watch("c1", ref)
            fd = watcher._fds[ref]
            watcher.forget("c1")  # idle: kept, registered
            assert watcher._fds[ref] == fd and not exited
            assert watcher.watch("c2", ref)
            assert watcher._fds[ref] == fd  # the same pidfd, not a new registration
            child.kill()
            child.wait()
            await _soon(lambda: exited)
            assert exited == ["c2"]
            assert ref not in watcher._fds
        finally:
            watcher.close()
            child.kill()
            child.wait()
    asyncio.run(test())


def test_an_idle_process_that_exits_is_dropped_without_a_callback():
    async def test():
        exited = []
        watcher = ExitWatcher(asyncio.get_running_loop(), exited.append)
        child = _child()
        ref = process_ref(child.pid)
        try:
            watcher.watch("c1", ref)
            watcher.forget("c1")
            child.kill()
            child.wait()
            await _soon(lambda: ref not in watcher._fds)
            assert ref not in watcher._fds and exited == []
        finally:
            watcher.close()
    asyncio.run(test())


def test_only_the_last_idle_processes_keep_their_pidfds():
    async def test():
        watcher = ExitWatcher(asyncio.get_running_loop(), lambda key: None)
        children = [_child() for _ in range(IDLE_KEPT + 2)]
        try:
            refs = [process_ref(c.pid) for c in children]
            for i, ref in enumerate(refs):
                watcher.watch(i, ref)
                watcher.forget(i)
            assert list(watcher._fds) == refs[2:]  # the two forgotten first are closed
        finally:
            watcher.close()
            for c in children:
                c.kill()
                c.wait()
    asyncio.run(test())


def test_a_process_the_watcher_holds_is_pinned_again_without_reading_proc(monkeypatch):
    async def test():
        watcher = ExitWatcher(asyncio.get_running_loop(), lambda key: None)
        child = _child()
        ref = process_ref(child.pid)
        try:
            assert watcher.pin(child.pid) is None  # none held yet
            watcher.watch("c1", ref)
            watcher.forget("c1")  # idle, still held
            monkeypatch.setattr(liveness, "open_pidfd", None)  # neither of these may run
            monkeypatch.setattr(liveness, "is_alive", None)
            pinned_ref, fd = watcher.pin(child.pid)
            assert pinned_ref == ref and fd != watcher._fds[ref]
            os.close(fd)  # a copy: the watcher's own stays open and registered
            assert os.fstat(watcher._fds[ref])
        finally:
            watcher.close()
            child.kill()
            child.wait()
    asyncio.run(test())


def test_an_exited_process_is_not_pinned_from_the_watcher_before_its_callback_ran():
    async def test():
        exited = []
        watcher = ExitWatcher(asyncio.get_running_loop(), exited.append)
        child = _child()
        watcher.watch("c1", process_ref(child.pid))
        child.kill()
        child.wait()  # reaped: the pid may be anyone's now; the loop has not run yet
        try:
            assert watcher.pin(child.pid) is None and exited == []
        finally:
            watcher.close()
    asyncio.run(test())
