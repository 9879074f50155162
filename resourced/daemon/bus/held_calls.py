"""Claim calls answered at the grant (``ReplyWhenGranted``): kept until then, found again
by their serial, and given up when their caller leaves the bus.

A kept call is the only way its caller learns of its claim, so:

- ``GetClaimByCall`` (the caller lost the answer: interrupted) must find the claim even
  while the Claim call is still being decided (it may wait for a user name or a GPU
  look): it waits for that decision first (``deciding``/``decided``);
- a caller that leaves the bus while its claim waits can be told nothing any more, and
  the claim would be granted to nobody: it leaves the queue.  The manager hears of that
  through ``departures``.
"""

import asyncio
import contextlib
from collections.abc import Callable

from dbus_fast import Message

from .departures import Departures


class HeldCalls:
    def __init__(self, departures: Departures, withdraw: Callable[[str], None]):
        self._departures = departures
        self._withdraw = withdraw  # takes a claim whose caller left out of the queue
        self._calls: dict[str, tuple[Message, list[str]]] = {}  # claim -> call, warnings
        self._deciding: dict[tuple[str, int], asyncio.Future] = {}  # (sender, serial)

    @contextlib.contextmanager
    def deciding(self, call: Message):
        """Around the decision of a Claim call that may be kept."""
        key = (call.sender, call.serial)
        done = self._deciding[key] = asyncio.get_running_loop().create_future()
        try:
            yield
        finally:
            del self._deciding[key]
            done.set_result(None)

    async def decided(self, sender: str, serial: int) -> None:
        """Once ``sender``'s Claim call ``serial`` is decided, if it is being decided."""
        pending = self._deciding.get((sender, serial))
        if pending is not None:
            await asyncio.shield(pending)

    def hold(self, claim_id: str, call: Message, warnings: list[str]) -> None:
        """Keep ``call`` (and the ``warnings`` of its claiming) until ``claim_id``'s outcome."""
        self._calls[claim_id] = call, warnings
        self._departures.watch(call.sender, self._left)

    def pop(self, claim_id: str) -> tuple[Message | None, list[str]]:
        """The call kept for ``claim_id`` and its warnings, no longer kept; (None, [])."""
        return self._calls.pop(claim_id, (None, []))

    def _left(self, sender: str) -> None:
        for claim_id in [c for c, (call, _) in self._calls.items() if call.sender == sender]:
            self._withdraw(claim_id)
