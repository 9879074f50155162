"""The daemon's identity: a random name kept in its state directory, the same across
restarts and another for every daemon (every state directory).  A booked command's job
file names the daemon it was booked with, and a runner starts only its own daemon's."""

import contextlib
import os
import secrets
from pathlib import Path

NAME = "instance"


def instance_id(state_dir: Path) -> str:
    """This daemon's identity, made the first time (as its calendar's log is)."""
    path = Path(state_dir) / NAME
    with contextlib.suppress(FileNotFoundError):
        kept = path.read_text(encoding="ascii").strip()
        if kept:
            return kept
    made = secrets.token_hex(8)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:  # another start made it meanwhile: theirs stands
        return path.read_text(encoding="ascii").strip()
    with os.fdopen(fd, "w", encoding="ascii") as f:
        f.write(made + "\n")
        f.flush()
        os.fsync(f.fileno())
    return made
