"""What it means when this process may not open a bus socket: most often a coding agent's
sandbox, which takes a Unix socket for network access; the way through it is the MCP
server, outside the sandbox ("Sandboxed coding agents" in docs/how-to/agents.md).

The bus's files are open to everyone who may use resourced there (the session bus to its
user, the system bus to all, a shared bus to its group), so a permission error on the
socket itself is the sandbox's refusal, and the message says which socket to allow;
unless the socket lies in another account's closed folder: then it is their bus.
"""

from resourced.errors import AccessDenied

ADVICE = ("a coding agent's sandbox blocks it: run GPU jobs through resourced-mcp, which "
          "runs outside the sandbox (its run tool), or allow connecting to the socket (Codex: "
          "network_access = true under [sandbox_workspace_write] in ~/.codex/config.toml); "
          "see \"Sandboxed coding agents\" in docs/how-to/agents.md")


def socket_of(bus: str) -> str:
    """The socket behind the session or system bus address, as jeepney would open it."""
    from jeepney.bus import get_bus

    try:
        where = get_bus(bus.upper())
    except (KeyError, ValueError, StopIteration):
        return f"the {bus} bus socket"
    return "@" + where[1:] if where.startswith("\0") else where


def refused(bus: str, exc: PermissionError, socket: str | None = None) -> AccessDenied:
    """The error for a socket of ``bus`` this process may not open (``socket``: its
    path, found from the bus's address when not given): a sandbox's refusal, unless the
    socket is in a folder of another user's that we may not enter (their session bus,
    in their 0700 runtime directory), which is said instead."""
    socket = socket or socket_of(bus)
    why = (exc.strerror or str(exc)).lower()
    theirs = _closed_folder_of_another(socket)
    if theirs is not None:
        folder, owner = theirs
        return AccessDenied(f"cannot connect to the {bus} bus socket {socket} ({why}): it is "
                            f"in {folder}, which belongs to {owner} and is closed to others: "
                            f"that is {owner}'s {bus} bus, not yours (use your own: log in "
                            f"as yourself, or start one: dbus-run-session -- bash)")
    return AccessDenied(f"cannot connect to the {bus} bus socket {socket} ({why}): {ADVICE}")


def _closed_folder_of_another(socket: str) -> tuple[str, str] | None:
    """(folder, its owner's name) for the first folder on the way to ``socket`` that
    another account owns and this process may not enter; None if there is none."""
    import os
    import pwd
    from pathlib import Path

    if not socket.startswith("/"):
        return None  # an abstract socket, or no path known
    for folder in reversed(Path(socket).parents):
        try:
            st = os.stat(folder)
        except OSError:
            return None
        if st.st_uid != os.getuid() and not os.access(folder, os.X_OK):
            try:
                owner = pwd.getpwuid(st.st_uid).pw_name
            except KeyError:
                owner = f"uid {st.st_uid}"
            return str(folder), owner
    return None
