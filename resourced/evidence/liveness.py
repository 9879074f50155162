"""Owner liveness through pidfds: the kernel tells the event loop when a process exits.

No polling: each watched process has a pidfd registered with the loop; it becomes
readable when the process terminates (zombies included), and the callback runs once.
"""

import asyncio
import os
from collections.abc import Callable

from ..core.claims import ProcessRef
from .processes import is_alive, open_pidfd


class ExitWatcher:
    """Calls ``on_exit(key)`` once when the process watched under ``key`` exits."""

    def __init__(self, loop: asyncio.AbstractEventLoop, on_exit: Callable[[str], None]):
        self._loop = loop
        self._on_exit = on_exit
        self._fds: dict[str, int] = {}

    def watch(self, key, ref: ProcessRef) -> bool:
        """Start watching; False (and no callback) if the process is already gone.

        Raises ``OSError`` when no pidfd can be had (``EMFILE``): that says nothing about
        the process."""
        self.forget(key)
        fd = open_pidfd(ref.pid)
        if fd is None:
            return False
        if not is_alive(ref):  # the pid was reused before we pinned it
            os.close(fd)
            return False
        self.watch_pidfd(key, fd)
        return True

    def watch_pidfd(self, key, fd: int) -> None:
        """Watch the process an already open pidfd pins (the watcher closes it)."""
        self.forget(key)
        self._fds[key] = fd
        self._loop.add_reader(fd, self._exited, key)

    def forget(self, key) -> None:
        fd = self._fds.pop(key, None)
        if fd is not None:
            self._loop.remove_reader(fd)
            os.close(fd)

    def keys(self) -> list:
        return list(self._fds)

    def close(self) -> None:
        for key in list(self._fds):
            self.forget(key)

    def _exited(self, key) -> None:
        self.forget(key)
        self._on_exit(key)
