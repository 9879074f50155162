"""The per-user stamp that tells shells with the gpuctl hook that something changed.

``gpuctl`` rewrites it after each change the user makes (claim, release, book, edit,
extend, cancel, stop); the hook (``gpuctl shell init``) reads it with the shell's own
``read`` builtin at each prompt and asks the daemon again only when its content differs
from what it read at its last refresh.  Its content is a token that is new at each change
(nanoseconds and pid), written whole (a temporary file renamed over it), so a reader never
sees half of one and two changes in the same clock tick still differ.

Where: ``$XDG_RUNTIME_DIR/resourced-shell.stamp`` (per user, on tmpfs, gone at logout), else
``$XDG_CACHE_HOME/resourced/shell.stamp`` (``~/.cache`` by default).  Only the standard
library: gpuctl imports this after every change, and the stamp must cost nothing.
"""

import os
import time
from pathlib import Path

from .atomic_file import write_atomically


def stamp_path(environ=os.environ) -> Path:
    """The stamp file of this user (the shell hook reads the same path)."""
    runtime = environ.get("XDG_RUNTIME_DIR", "")
    if os.path.isabs(runtime) and os.path.isdir(runtime):
        return Path(runtime) / "resourced-shell.stamp"
    cache = environ.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(cache):
        cache = os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "resourced" / "shell.stamp"


def touch_stamp(environ=os.environ) -> bool:
    """Write a new token into the stamp; False (and nothing raised) where it cannot."""
    path = stamp_path(environ)
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        write_atomically(path, f"{time.time_ns()}.{os.getpid()}\n", durable=False)
    except OSError:
        return False
    return True
