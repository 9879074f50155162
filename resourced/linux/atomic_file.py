"""Writing a file so that a reader sees it whole, old or new, never half written."""

import contextlib
import os
from pathlib import Path


def write_atomically(path: Path, data: str | bytes, mode: int = 0o600,
                     durable: bool = True) -> None:
    """``path`` holds ``data`` whole or is as it was: a temporary file beside it (of
    ``mode``, whatever the umask), renamed over it.  ``durable`` also syncs the file
    before the rename and the directory after it, so a power cut keeps one of the two;
    without, a crash of this process still leaves one whole (a stamp that only has to
    change needs no more)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, mode)
    try:
        try:
            os.fchmod(fd, mode)
            os.write(fd, data.encode() if isinstance(data, str) else data)
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if durable:
        dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
