"""Work left for after the replies of a loop turn: signals, audit lines, usage history.

dbus-fast sends an ``async`` method's reply from a callback that its task schedules on
returning, so the reply comes after anything the method itself scheduled with
``call_soon``; what waits one loop turn more comes after the reply.  (With one turn, the
audit lines and the usage history were written before the reply: about a third of the
time a claim and its release took to answer.)
"""

import asyncio
import contextlib
import logging

log = logging.getLogger("resourced")


class AfterReply:
    """``after_reply(fn, *args)`` calls ``fn(*args)`` once the reply to the bus call being
    handled has gone out.  The calls of one loop turn run together, inside the contexts
    given to ``hold`` (each of which gathers one kind of output into one write: the
    bus's signals, the log's lines)."""

    def __init__(self):
        self._calls: list[tuple] = []
        self._holds: list = []

    def hold(self, context) -> None:
        """Run each turn's calls inside ``context()`` too."""
        self._holds.append(context)

    def __call__(self, fn, *args) -> None:
        if not self._calls:  # (no running loop raises here, before anything is queued)
            loop = asyncio.get_running_loop()
            loop.call_soon(loop.call_soon, self._run)
        self._calls.append((fn, args))

    def _run(self) -> None:
        calls, self._calls = self._calls, []
        with contextlib.ExitStack() as held:
            for context in self._holds:
                held.enter_context(context())
            for fn, args in calls:
                try:
                    fn(*args)
                except Exception:  # the others still run
                    log.exception("%s after a reply failed", getattr(fn, "__qualname__", fn))
