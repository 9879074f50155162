"""What it means when this process may not open a bus socket: most often a coding agent's
sandbox, which takes a Unix socket for network access (README: "Sandboxed coding agents").

The bus's files are open to everyone who may use resourced there (the session bus to its
user, the system bus to all, a shared bus to its group), so a permission error on the
socket itself is the sandbox's refusal, and the message says which socket to allow.
"""

from resourced.errors import AccessDenied

ADVICE = ("a coding agent's sandbox must allow connecting to it (Codex: network_access = "
          "true under [sandbox_workspace_write] in ~/.codex/config.toml; see the README's "
          "\"Sandboxed coding agents\")")


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
    path, found from the bus's address when not given)."""
    why = (exc.strerror or str(exc)).lower()
    return AccessDenied(f"cannot connect to the {bus} bus socket {socket or socket_of(bus)} "
                        f"({why}): {ADVICE}")
