"""The pytest plugin, through pytest's own pytester: marked tests run on claimed GPUs."""

from concurrent.futures import ThreadPoolExecutor

import pytest

from ..conftest import eventually

pytest_plugins = ["pytester"]
TIMEOUT = 60  # seconds: for a run of pytest, and for its claim to queue

TESTS = """
import os, pytest

@pytest.mark.gpu(2)
def test_two(): 
    assert len(os.environ["CUDA_VISIBLE_DEVICES"].split(",")) == 2
    print("ref", os.environ["RESOURCED_ALLOCATION"])

@pytest.mark.gpu
def test_one():
    assert len(os.environ["CUDA_VISIBLE_DEVICES"].split(",")) == 1

def test_plain():
    assert "RESOURCED_ALLOCATION" not in os.environ
"""


def test_marked_tests_run_on_one_session_claim_released_at_the_end(start_daemon, pytester):
    start_daemon(gpus=4)
    from resourced.client.sync import Client

    pytester.makepyfile(TESTS)
    result = pytester.runpytest_subprocess("-s")
    result.assert_outcomes(passed=3)
    assert "ref c" in result.stdout.str()
    with Client() as c:
        assert c.status()["claims"] == []  # released at the end of the session


def test_without_room_marked_tests_are_skipped_with_the_reason(start_daemon, pytester):
    daemon = start_daemon(gpus=1)
    from resourced.client.sync import Client

    with Client() as c:
        ref = c.claim(mode="dev", gpus=1, owner_pid=daemon.proc.pid)["allocation"]["ref"]
        pytester.makepyfile(TESTS)
        result = pytester.runpytest_subprocess("-rs")
        result.assert_outcomes(passed=1, skipped=2)
        result.stdout.fnmatch_lines(["*resourced: NotEnoughGPUs*"])
        c.release(ref)


def test_with_resourced_wait_marked_tests_wait_for_the_gpus_and_run(start_daemon, pytester,
                                                                      owner):
    start_daemon(gpus=2)
    from resourced.client.sync import Client

    pytester.makepyfile(TESTS)
    with Client() as c:
        ref = c.claim(mode="dev", gpus=2, owner_pid=owner.pid)["allocation"]["ref"]
    skipped = pytester.runpytest_subprocess("-rs", timeout=TIMEOUT)
    skipped.assert_outcomes(passed=1, skipped=2)   # without the flag: skipped

    def release_once_queued():
        with Client() as c:
            eventually(lambda: c.status()["queue"], timeout=TIMEOUT, what="pytest's claim queued")
            c.release(ref)

    with ThreadPoolExecutor(1) as pool:
        released = pool.submit(release_once_queued)
        waited = pytester.runpytest_subprocess("--resourced-wait", timeout=TIMEOUT)
        released.result(timeout=TIMEOUT)
    waited.assert_outcomes(passed=3)
    with Client() as c:
        assert c.status()["claims"] == []


@pytest.mark.usefixtures("start_daemon")
def test_with_no_daemon_they_are_skipped(pytester, monkeypatch, tmp_path):
    monkeypatch.setenv("DBUS_SESSION_BUS_ADDRESS", f"unix:path={tmp_path}/nothing")
    monkeypatch.setenv("DBUS_SYSTEM_BUS_ADDRESS", f"unix:path={tmp_path}/nothing")
    pytester.makepyfile(TESTS)
    result = pytester.runpytest_subprocess("-rs")
    result.assert_outcomes(passed=1, skipped=2)
    result.stdout.fnmatch_lines(["*resourced: DaemonUnreachable*"])
    # Named as the issue spells it (loaded already, or with autoloading off), the same.
    for autoload in ("", "1"):
        monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", autoload)
        named = pytester.runpytest_subprocess("-p", "resourced.pytest_plugin", "-rs")
        named.assert_outcomes(passed=1, skipped=2)


INSIDE_A_RUN = """
import os, pytest

@pytest.mark.gpu(2)
def test_two():
    assert os.environ["CUDA_VISIBLE_DEVICES"] == os.environ["RESOURCED_GPU_UUIDS"]
    assert len(os.environ["CUDA_VISIBLE_DEVICES"].split(",")) == 2
"""


def test_inside_a_run_the_marked_tests_use_the_runs_claim(start_daemon, pytester):
    """gpuctl run --gpus 2 -- python -m pytest: the plugin claimed 2 more on top and, with
    none left, skipped the tests it was run for."""
    import sys

    start_daemon(gpus=2)
    pytester.makepyfile(INSIDE_A_RUN)
    result = pytester.run(sys.executable, "-m", "resourced.cli", "run", "--gpus", "2", "--",
                          sys.executable, "-m", "pytest", "-rs", "-p", "no:cacheprovider",
                          timeout=TIMEOUT)
    assert result.ret == 0, result.stdout.str() + result.stderr.str()
    result.stdout.fnmatch_lines(["*1 passed*"])
    assert "skipped" not in result.stdout.str()
    from resourced.client.sync import Client

    with Client() as c:
        assert c.status()["claims"] == []


def test_inside_a_run_too_small_the_marked_tests_are_skipped_saying_why(start_daemon,
                                                                       pytester):
    import sys

    start_daemon(gpus=2)
    pytester.makepyfile(INSIDE_A_RUN)
    result = pytester.run(sys.executable, "-m", "resourced.cli", "run", "--gpus", "1", "--",
                          sys.executable, "-m", "pytest", "-rs", "-p", "no:cacheprovider",
                          timeout=TIMEOUT)
    result.stdout.fnmatch_lines(["*this session runs in has 1 GPU(s); the marked tests "
                                 "need 2*"])
