"""Starting a claimed command so that the claim follows the command, not gpuctl.

The child is forked first and waits on a pipe.  The claim names the *child* as its owner,
then the environment travels down the pipe and the child execs the command: exec keeps
the pid and start time, so the daemon, which watches the owner through a pidfd, releases
the GPUs when the command's process is gone, even if gpuctl itself was SIGKILLed.  If the
claim fails, the pipe closes empty and the child exits without running anything.

While the command runs, gpuctl forwards SIGTERM and SIGHUP, and SIGINT/SIGQUIT when a
process sent them (a terminal's Ctrl-C already reaches the whole foreground group).

gpuctl makes itself a *child subreaper*: a background process the command leaves behind
is re-parented to gpuctl instead of init, so it stays in the claim's process tree (gpuctl
is a member of the claim) however quickly the command exits, and the release check sees it.
"""

import ctypes
import json
import os
import signal
import sys

PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> None:
    """Orphaned descendants are re-parented to this process rather than to init."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed")

FORWARDED = {signal.SIGTERM, signal.SIGHUP, signal.SIGINT, signal.SIGQUIT}
TERMINAL_SIGNALS = {signal.SIGINT, signal.SIGQUIT}
SI_KERNEL = 0x80
EXIT_CANNOT_EXECUTE = 126
EXIT_NOT_FOUND = 127


class PendingChild:
    """A forked child that runs ``argv`` once it is given an environment."""

    def __init__(self, argv: list[str]):
        become_subreaper()
        self._old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED | {signal.SIGCHLD})
        read_end, self._write_end = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:
            os.close(self._write_end)
            self._exec_when_told(read_end, argv)
        os.close(read_end)
        # Until the command starts, gpuctl itself answers Ctrl-C and SIGTERM (a waiting
        # claim must leave the queue); the child keeps them blocked until it execs.
        signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED)

    def _exec_when_told(self, read_end: int, argv: list[str]) -> None:
        chunks = []
        while chunk := os.read(read_end, 65536):
            chunks.append(chunk)
        if not chunks:
            os._exit(EXIT_CANNOT_EXECUTE)
        env = json.loads(b"".join(chunks))
        signal.pthread_sigmask(signal.SIG_SETMASK, self._old_mask)
        try:
            os.execvpe(argv[0], argv, env)
        except OSError as exc:
            sys.stderr.write(f"gpuctl: cannot run {argv[0]}: {exc.strerror}\n")
            sys.stderr.flush()
            os._exit(EXIT_NOT_FOUND if isinstance(exc, FileNotFoundError) else EXIT_CANNOT_EXECUTE)

    def _reap(self) -> int | None:
        """Reap every child that exited (orphans come to us too); the command's exit code
        once it is among them."""
        code = None
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return code
            if pid == 0:
                return code
            if pid == self.pid:
                code = os.waitstatus_to_exitcode(status)
                code = 128 - code if code < 0 else code

    def cancel(self) -> None:
        """Let the child exit without running the command."""
        os.close(self._write_end)
        os.waitpid(self.pid, 0)
        signal.pthread_sigmask(signal.SIG_SETMASK, self._old_mask)

    def start(self, env: dict[str, str]) -> int:
        """Run the command with ``env`` and wait; returns its exit code (128+n for signal n)."""
        signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED)
        os.write(self._write_end, json.dumps(env).encode())
        os.close(self._write_end)
        try:
            return self._wait()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, self._old_mask)

    def _wait(self) -> int:
        while True:
            info = signal.sigwaitinfo(FORWARDED | {signal.SIGCHLD})
            if info.si_signo == signal.SIGCHLD:
                code = self._reap()
                if code is not None:
                    return code
            elif info.si_signo not in TERMINAL_SIGNALS or info.si_code != SI_KERNEL:
                try:
                    os.kill(self.pid, info.si_signo)
                except ProcessLookupError:
                    pass
