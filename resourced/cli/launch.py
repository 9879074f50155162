"""Starting a claimed command so that the claim follows the command, not gpuctl.

The child is forked first and waits on a pipe.  The claim names the *child* as its owner,
then the environment travels down the pipe and the child execs the command: exec keeps
the pid and start time, so the daemon, which watches the owner through a pidfd, releases
the GPUs when the command's process is gone, even if gpuctl itself was SIGKILLed.  If the
claim fails, the pipe closes empty and the child exits without running anything.

While the command runs, gpuctl forwards SIGTERM and SIGHUP, and SIGINT/SIGQUIT when a
process sent them (a terminal's Ctrl-C already reaches the whole foreground group).
"""

import json
import os
import signal
import sys

FORWARDED = {signal.SIGTERM, signal.SIGHUP, signal.SIGINT, signal.SIGQUIT}
TERMINAL_SIGNALS = {signal.SIGINT, signal.SIGQUIT}
SI_KERNEL = 0x80
EXIT_CANNOT_EXECUTE = 126
EXIT_NOT_FOUND = 127


class PendingChild:
    """A forked child that runs ``argv`` once it is given an environment."""

    def __init__(self, argv: list[str]):
        self._old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED | {signal.SIGCHLD})
        read_end, self._write_end = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:
            os.close(self._write_end)
            self._exec_when_told(read_end, argv)
        os.close(read_end)

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

    def cancel(self) -> None:
        """Let the child exit without running the command."""
        os.close(self._write_end)
        os.waitpid(self.pid, 0)
        signal.pthread_sigmask(signal.SIG_SETMASK, self._old_mask)

    def start(self, env: dict[str, str]) -> int:
        """Run the command with ``env`` and wait; returns its exit code (128+n for signal n)."""
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
                pid, status = os.waitpid(self.pid, os.WNOHANG)
                if pid:
                    code = os.waitstatus_to_exitcode(status)
                    return 128 - code if code < 0 else code
            elif info.si_signo not in TERMINAL_SIGNALS or info.si_code != SI_KERNEL:
                try:
                    os.kill(self.pid, info.si_signo)
                except ProcessLookupError:
                    pass
