"""Owner liveness through pidfds: the kernel tells the event loop when a process exits.

No polling: each watched process has one pidfd registered with the loop, however many
keys (claims) watch it; it becomes readable when the process terminates (zombies
included), and the callback runs once for each key that still watched it.

A process nobody watches any more keeps its pidfd, registered, among the ``IDLE_KEPT``
it last stopped watching: a process that claims and releases in a loop (a lease per
work item) is then watched again without a new registration with the loop (two
``epoll_ctl`` and a ``close`` per claim and release saved).  An idle process that exits
is dropped then, with no callback: nobody watched it.  A pidfd held here also pins its
process for a new claim without a /proc read (``pin``).
"""

import asyncio
import os
import select
from collections.abc import Callable, Hashable

from resourced.core.claims import ProcessRef

from .processes import is_alive, open_pidfd

IDLE_KEPT = 32
"""Processes no key watches whose pidfds stay registered, for when they are watched again."""


class ExitWatcher:
    """Calls ``on_exit(key)`` once when the process watched under ``key`` exits."""

    def __init__(self, loop: asyncio.AbstractEventLoop, on_exit: Callable[[Hashable], None]):
        self._loop = loop
        self._on_exit = on_exit
        self._fds: dict[ProcessRef, int] = {}
        self._keys: dict[ProcessRef, set[Hashable]] = {}  # who watches each process
        self._ref_of: dict[Hashable, ProcessRef] = {}
        self._idle: dict[ProcessRef, None] = {}  # watched by no key, oldest first
        self._by_pid: dict[int, ProcessRef] = {}  # the last process held for each pid

    def watch(self, key: Hashable, ref: ProcessRef) -> bool:
        """Start watching; False (and no callback) if the process is already gone.

        Raises ``OSError`` when no pidfd can be had (``EMFILE``): that says nothing about
        the process."""
        self.forget(key)
        if ref not in self._fds:
            fd = open_pidfd(ref.pid)
            if fd is None:
                return False
            if not is_alive(ref):  # the pid was reused before we pinned it
                os.close(fd)
                return False
            self._add(ref, fd)
        self._join(key, ref)
        return True

    def watch_pidfd(self, key: Hashable, ref: ProcessRef, fd: int) -> None:
        """Watch the process an already open pidfd pins (the watcher closes it)."""
        self.forget(key)
        if ref in self._fds:
            os.close(fd)
        else:
            self._add(ref, fd)
        self._join(key, ref)

    def pin(self, pid: int) -> tuple[ProcessRef, int] | None:
        """The live process ``pid`` and a new pidfd for it, from one held here, or None
        (none held, or its process has exited: a pid is not reused while its process
        lives, so one that has not names the very process the held pidfd pins)."""
        ref = self._by_pid.get(pid)
        if ref is None:
            return None
        fd = self._fds[ref]
        poll = select.poll()
        poll.register(fd, select.POLLIN)
        if poll.poll(0):  # exited (its callback is on its way)
            return None
        return ref, os.dup(fd)

    def forget(self, key: Hashable) -> None:
        ref = self._ref_of.pop(key, None)
        if ref is None:
            return
        keys = self._keys[ref]
        keys.discard(key)
        if not keys:
            self._idle[ref] = None
            if len(self._idle) > IDLE_KEPT:
                self._drop(next(iter(self._idle)))

    def close(self) -> None:
        for ref in list(self._fds):
            self._drop(ref)
        self._ref_of.clear()

    def _add(self, ref: ProcessRef, fd: int) -> None:
        self._fds[ref] = fd
        self._by_pid[ref.pid] = ref
        self._keys[ref] = set()
        self._loop.add_reader(fd, self._exited, ref)

    def _join(self, key: Hashable, ref: ProcessRef) -> None:
        self._idle.pop(ref, None)
        self._keys[ref].add(key)
        self._ref_of[key] = ref

    def _drop(self, ref: ProcessRef) -> None:
        fd = self._fds.pop(ref)
        if self._by_pid.get(ref.pid) == ref:
            del self._by_pid[ref.pid]
        del self._keys[ref]
        self._idle.pop(ref, None)
        self._loop.remove_reader(fd)
        os.close(fd)

    def _exited(self, ref: ProcessRef) -> None:
        keys = self._keys[ref]
        self._drop(ref)
        for key in keys:  # all forgotten first: a callback may forget the others
            del self._ref_of[key]
        for key in keys:
            self._on_exit(key)
