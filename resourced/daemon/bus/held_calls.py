"""Claim calls answered at the grant (``ReplyWhenGranted``): kept until then, found again
by their serial, and given up when their caller leaves the bus.

A kept call is the only way its caller learns of its claim, so:

- ``GetClaimByCall`` (the caller lost the answer: interrupted) must find the claim even
  while the Claim call is still being decided (it may wait for a user name or a GPU
  look): it waits for that decision first (``deciding``/``decided``);
- a caller that leaves the bus while its claim waits can be told nothing any more, and
  the claim would be granted to nobody: it leaves the queue.  The manager hears of that
  through ``NameOwnerChanged``, with one match rule per such caller, added with its
  first kept call and removed when it leaves.
"""

import asyncio
import contextlib
from collections.abc import Callable

from dbus_fast import Message, MessageFlag, MessageType

from resourced.protocol.names import BUS_DRIVER


class HeldCalls:
    def __init__(self, bus, withdraw: Callable[[str], None]):
        self._bus = bus
        self._withdraw = withdraw  # takes a claim whose caller left out of the queue
        self._calls: dict[str, tuple[Message, list[str]]] = {}  # claim -> call, warnings
        self._deciding: dict[tuple[str, int], asyncio.Future] = {}  # (sender, serial)
        self._watched: set[str] = set()  # callers whose leaving the bus is heard of
        self._checks: set[asyncio.Task] = set()  # (held while they run)
        bus.add_message_handler(self._on_message)

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
        if call.sender not in self._watched:
            self._watched.add(call.sender)
            self._bus.send(_driver_call("AddMatch", _left_rule(call.sender)))
            check = asyncio.ensure_future(self._check_still_there(call.sender))
            self._checks.add(check)
            check.add_done_callback(self._checks.discard)

    def pop(self, claim_id: str) -> tuple[Message | None, list[str]]:
        """The call kept for ``claim_id`` and its warnings, no longer kept; (None, [])."""
        return self._calls.pop(claim_id, (None, []))

    async def _check_still_there(self, sender: str) -> None:
        """For a caller that left before its match rule was in place."""
        try:
            reply = await self._bus.call(Message(**BUS_DRIVER, member="NameHasOwner",
                                                 signature="s", body=[sender]))
        except Exception:  # noqa: BLE001 - the bus went (a stop): nobody is left to tell
            return
        if reply.message_type is MessageType.METHOD_RETURN and not reply.body[0]:
            self._left(sender)

    def _on_message(self, msg: Message) -> bool:
        if (msg.message_type is MessageType.SIGNAL and msg.member == "NameOwnerChanged"
                and msg.sender == BUS_DRIVER["destination"] and len(msg.body) == 3
                and msg.body[0] in self._watched and not msg.body[2]):
            self._left(msg.body[0])
        return False  # (never handled here)

    def _left(self, sender: str) -> None:
        if sender not in self._watched:
            return
        self._watched.discard(sender)
        self._bus.send(_driver_call("RemoveMatch", _left_rule(sender)))
        for claim_id in [c for c, (call, _) in self._calls.items() if call.sender == sender]:
            self._withdraw(claim_id)


def _left_rule(sender: str) -> str:
    return (f"type='signal',sender='{BUS_DRIVER['destination']}',"
            f"interface='{BUS_DRIVER['interface']}',member='NameOwnerChanged',arg0='{sender}'")


def _driver_call(member: str, rule: str) -> Message:
    return Message(**BUS_DRIVER, member=member, signature="s", body=[rule],
                   flags=MessageFlag.NO_REPLY_EXPECTED)
