"""A file's changes pushed to the event loop, through inotify(7) (by ctypes: the standard
library has no binding).

The folder is watched, not the file: a file replaced whole (written beside it, then
renamed over it, as the simulated clock is) is a new inode that a watch on the old one
would never see.
"""

import asyncio
import ctypes
import os
import struct
from collections.abc import Callable
from pathlib import Path

IN_CLOSE_WRITE = 0x00000008
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
_EVENT = struct.Struct("iIII")  # struct inotify_event: wd, mask, cookie, len; then the name


class FileWatch:
    """Calls ``changed()`` on the running loop each time ``path`` is written, created or
    renamed into place; ``close()`` ends it."""

    def __init__(self, path: Path, changed: Callable[[], None]):
        self._name = os.fsencode(path.name)
        self._changed = changed
        libc = ctypes.CDLL(None, use_errno=True)
        self._fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if self._fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1: " + os.strerror(ctypes.get_errno()))
        folder = os.fsencode(path.parent.resolve())
        if libc.inotify_add_watch(self._fd, folder, IN_CLOSE_WRITE | IN_MOVED_TO | IN_CREATE) < 0:
            errno = ctypes.get_errno()
            os.close(self._fd)
            raise OSError(errno, f"inotify_add_watch {path.parent}: {os.strerror(errno)}")
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(self._fd, self._read)

    def _read(self) -> None:
        try:
            data = os.read(self._fd, 65536)
        except BlockingIOError:
            return
        names, offset = set(), 0
        while offset + _EVENT.size <= len(data):
            _wd, _mask, _cookie, length = _EVENT.unpack_from(data, offset)
            offset += _EVENT.size
            names.add(data[offset:offset + length].rstrip(b"\0"))
            offset += length
        if self._name in names:
            self._changed()

    def close(self) -> None:
        if self._fd >= 0:
            self._loop.remove_reader(self._fd)
            os.close(self._fd)
            self._fd = -1
