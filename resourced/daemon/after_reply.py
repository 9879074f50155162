"""Work left for after the replies of a loop turn: signals, audit lines, usage history.

A method that answers at once (the bus's eager handler) has its reply written in the
callback that read its call, so the next loop turn comes after it; one that awaits
something is answered from a callback of a later turn, so while such a call is still
unanswered the work waits one turn more.  (With none, the audit lines and the usage
history were written before the reply: about a third of the time a claim and its
release took to answer.)
"""

import asyncio
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
        self._unanswered = _never

    def hold(self, context) -> None:
        """Run each turn's calls inside ``context()`` too."""
        self._holds.append(context)

    def wait_for(self, unanswered) -> None:
        """``unanswered()``: whether a bus call is still to be answered from a later
        callback (then the calls wait one more turn)."""
        self._unanswered = unanswered

    def __call__(self, fn, *args) -> None:
        if not self._calls:  # (no running loop raises here, before anything is queued)
            asyncio.get_running_loop().call_soon(self._next_turn)
        self._calls.append((fn, args))

    def _next_turn(self) -> None:
        if self._unanswered():
            asyncio.get_running_loop().call_soon(self._run)
        else:
            self._run()

    def _run(self) -> None:
        calls, self._calls = self._calls, []
        held = [context() for context in self._holds]
        for context in held:
            context.__enter__()
        try:
            for fn, args in calls:
                try:
                    fn(*args)
                except Exception:  # the others still run
                    log.exception("%s after a reply failed", getattr(fn, "__qualname__", fn))
        finally:
            for context in reversed(held):
                context.__exit__(None, None, None)


def _never() -> bool:
    return False
