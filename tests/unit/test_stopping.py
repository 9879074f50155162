"""resourced.supervision.stopping: the one stop policy (SIGTERM, the grace, SIGKILL) that
gpuctl run and the runner share."""

import signal
import subprocess
import sys
import time

import pytest

from resourced.supervision.stopping import stop_signal, terminate

TERM, KILL = signal.SIGTERM, signal.SIGKILL


@pytest.mark.parametrize("sent, term_due, grace_over, kill_due, expected", [
    (None, False, False, False, None),   # not yet
    (None, True, False, False, TERM),    # SIGTERM once due
    (TERM, True, False, False, None),    # then the grace
    (TERM, True, True, False, KILL),     # SIGKILL after it
    (None, True, True, True, KILL),      # a hard end: SIGKILL at once
    (TERM, True, False, True, KILL),     # ... even within the grace
    (KILL, True, True, True, None),      # nothing after SIGKILL
])
def test_the_stop_policy(sent, term_due, grace_over, kill_due, expected):
    assert stop_signal(sent, term_due, grace_over, kill_due) == expected


IGNORES_SIGTERM = ("import signal, sys; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                   "print('ready', flush=True); sys.stdin.read()")


def test_terminate_sends_sigkill_the_grace_after_sigterm():
    proc = subprocess.Popen([sys.executable, "-c", IGNORES_SIGTERM], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "ready\n"
        began = time.monotonic()
        terminate(proc.pid, grace=0.3)
        assert proc.wait(5) == -KILL
        assert time.monotonic() - began >= 0.3
    finally:
        proc.kill()
        proc.wait()


def test_terminate_says_when_the_command_is_gone():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    with pytest.raises(ProcessLookupError):
        terminate(proc.pid, grace=0.1)
