"""The daemon's side of isolation: it asks the root helper (``helper``) to confine a
claim's processes, stops the claim's scope when the claim ends, and, at start, stops the
scopes of claims that no longer exist (a crash may leave some).

Listing units needs no privilege, so the daemon asks systemd itself; starting and stopping
them goes through the helper.
"""

import asyncio
import logging

from dbus_fast import Message, MessageType

from resourced.errors import Internal
from resourced.protocol.time import USEC

from .helper import BUS_NAME, INTERFACE, PATH, SCOPE_PREFIX, SIGNATURE, SYSTEMD

log = logging.getLogger("resourced")

STOP_TIMEOUT_USEC = 10 * USEC
"""A scope being stopped gets SIGTERM, then SIGKILL this long after (as gpuctl run's end)."""
UNAVAILABLE_ON_USER_BUS = (
    "isolation needs the system service (gpuctl service enable --system): a user's systemd "
    "cannot restrict devices; on this bus, use CUDA_VISIBLE_DEVICES as gpuctl sets it")


class Scopes:
    """Scopes of claims, through ``bus`` (the daemon's system bus connection)."""

    def __init__(self, bus):
        self.bus = bus
        self._stopping: set[asyncio.Task] = set()

    async def confine(self, claim_id: str, uid: int, pids: list[int],
                      devices: list[tuple[str, str]], stop_timeout_usec: int) -> str:
        """Put ``pids``, processes of user ``uid`` (the claim's), in the claim's scope
        (started if need be); its unit name.  The helper checks whose they are again."""
        answer = await self._helper("Confine", SIGNATURE,
                                    [claim_id, uid, pids, [list(d) for d in devices],
                                     stop_timeout_usec])
        if answer.message_type is MessageType.ERROR:
            why = answer.body[0] if answer.body else answer.error_name
            log.error("cannot confine claim %s: %s", claim_id, why)
            raise Internal(f"the isolation helper refused claim {claim_id}: {why}")
        return answer.body[0]

    def stop(self, claim_id: str) -> None:
        """Stop the claim's scope, if it has one (its processes: SIGTERM, then SIGKILL)."""
        task = asyncio.ensure_future(self._stop(claim_id))
        self._stopping.add(task)
        task.add_done_callback(self._stopping.discard)

    async def _stop(self, claim_id: str) -> None:
        answer = await self._helper("Stop", "s", [claim_id])
        if answer.message_type is MessageType.ERROR:
            log.error("cannot stop the scope of claim %s: %s", claim_id,
                      answer.body[0] if answer.body else answer.error_name)

    async def claims_with_scopes(self) -> set[str]:
        """The claim ids whose scopes are loaded now."""
        destination, path, interface = SYSTEMD
        answer = await self.bus.call(Message(
            destination=destination, path=path, interface=interface,
            member="ListUnitsByPatterns", signature="asas",
            body=[[], [f"{SCOPE_PREFIX}*.scope"]]))
        if answer.message_type is MessageType.ERROR:
            log.warning("cannot list the claims' scopes: %s",
                        answer.body[0] if answer.body else answer.error_name)
            return set()
        return {unit[0][len(SCOPE_PREFIX):-len(".scope")] for unit in answer.body[0]}

    async def stop_strays(self, live: set[str]) -> None:
        """Stop each scope whose claim is not ``live`` (left by a crash)."""
        for claim_id in sorted(await self.claims_with_scopes() - live):
            log.info("stopping the scope of claim %s, which no longer exists", claim_id)
            await self._stop(claim_id)

    async def _helper(self, member: str, signature: str, body: list) -> Message:
        return await self.bus.call(Message(destination=BUS_NAME, path=PATH,
                                           interface=INTERFACE, member=member,
                                           signature=signature, body=body))
