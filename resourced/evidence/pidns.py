"""Pids as a caller in another pid namespace (a container) numbers them.

A client inside a container names its own processes (``--owner-pid $$``) by the numbers
of its pid namespace; the daemon, and NVML, use those of its own.  The kernel says both:
``NSpid:`` in ``/proc/PID/status`` lists a process's pid in each namespace from ours down
to its own.  The namespace itself (``/proc/PID/ns/pid``) is not readable for other users'
processes without privileges, so it is found through the process tree instead: every
process below a process of a namespace, with as many ``NSpid`` levels, is in that same
namespace (a child is in its parent's namespace or one nested in it).  The caller's
namespace is searched from the highest ancestor of the caller still in it: the
container's init for a process started inside, the entry point for one that joined
(``docker exec``, ``nsenter``).  Only world-readable files are read.  Blocking.
"""

import os

from .processes import PROC


def ns_pids(pid: int) -> list[int] | None:
    """The process's pid in each pid namespace from ours down to its own; None if gone."""
    try:
        with open(f"{PROC}/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"NSpid:"):
                    return [int(p) for p in line.split()[1:]]
    except (OSError, ValueError):
        return None
    return [pid]  # a kernel without NSpid (before 4.1): no nested namespaces seen


def nested(pid: int) -> bool:
    """Whether the process lives in a pid namespace below ours."""
    found = ns_pids(pid)
    return found is not None and len(found) > 1


def in_callers_namespace(caller: int, number: int) -> int | None:
    """Our pid of the process that ``caller``'s pid namespace numbers ``number`` (for a
    caller in ours, ``number`` itself); None when nothing there has that number, or the
    caller is gone."""
    own = ns_pids(caller)
    if own is None or len(own) == 1:
        return number
    depth = len(own)
    if own[-1] == number:
        return caller
    parents, levels = _table(depth)
    top = caller
    while (up := parents.get(top)) is not None and up in levels:
        if levels[up][-1] == number:
            return up  # an ancestor: the shell of --owner-pid $$, most often
        top = up
    if top not in levels:
        return None  # the caller is gone
    children: dict[int, list[int]] = {}
    for pid, parent in parents.items():
        if pid in levels:
            children.setdefault(parent, []).append(pid)
    stack = [top]
    while stack:
        pid = stack.pop()
        if levels[pid][-1] == number:
            return pid
        stack.extend(children.get(pid, ()))
    return None


def _table(depth: int) -> tuple[dict[int, int], dict[int, list[int]]]:
    """Every process's parent, and the NSpid of those ``depth`` levels deep."""
    parents, levels = {}, {}
    for name in os.listdir(PROC):
        if not name.isdigit():
            continue
        try:
            with open(f"{PROC}/{name}/status", "rb") as f:
                fields = dict(line.split(b":", 1) for line in f if b":" in line)
            pid = int(name)
            parents[pid] = int(fields[b"PPid"])
            found = [int(p) for p in fields.get(b"NSpid", name.encode()).split()]
        except (OSError, ValueError, KeyError):
            continue
        if len(found) == depth:
            levels[pid] = found
    return parents, levels


def container_of(pid: int) -> str:
    """The container a process runs in, as its cgroup names it (``docker container
    3f2a1b2c3d4e``, ``podman container 9c1b...``); "" when the cgroup names none."""
    try:
        with open(f"{PROC}/{pid}/cgroup", encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError:
        return ""
    for line in text.splitlines():
        for part in reversed(line.rpartition(":")[2].split("/")):
            for prefix, engine in (("docker-", "docker"), ("libpod-", "podman"),
                                   ("cri-containerd-", "containerd"), ("crio-", "cri-o")):
                if part.startswith(prefix) and part.endswith(".scope"):
                    return f"{engine} container {part[len(prefix):-len('.scope')][:12]}"
            if len(part) == 64 and all(c in "0123456789abcdef" for c in part):
                return f"container {part[:12]}"  # cgroup v1: /docker/<id>
    return ""


CLAIM_VARIABLE = b"RESOURCED_ALLOCATION="


def claim_named_by(pid: int) -> str:
    """The claim a process's environment names (``RESOURCED_ALLOCATION``, which ``gpuctl
    run`` and ``gpuctl env --docker`` hand on); "" when none, or when this account may not
    read it (another user's process, for a daemon that is not root)."""
    try:
        with open(f"{PROC}/{pid}/environ", "rb") as f:
            data = f.read(1 << 20)
    except OSError:
        return ""
    for item in data.split(b"\0"):
        if item.startswith(CLAIM_VARIABLE):
            return item[len(CLAIM_VARIABLE):].decode(errors="replace")
    return ""
