"""Who is calling: the message being handled, and the credentials the bus vouches for.

dbus-fast does not pass the sender to handlers.  A message handler installed before the
interfaces records each incoming call in a context variable; asyncio copies the context
into the task that runs an ``async`` method, so the variable is right even across awaits.
"""

import contextvars

from dbus_fast import Message, MessageType

from resourced.core.caller import Caller
from resourced.evidence.pidns import nested
from resourced.protocol.names import BUS_DRIVER

current_call: contextvars.ContextVar[Message] = contextvars.ContextVar("current_call")


def remember_call(msg: Message) -> None:
    if msg.message_type is MessageType.METHOD_CALL:
        current_call.set(msg)


class Credentials:
    """Resolves the current call's sender to a ``Caller`` through GetConnectionCredentials."""

    def __init__(self, bus, cache_size: int = 1024):
        self._bus = bus
        self._cache: dict[str, Caller] = {}
        self._cache_size = cache_size

    async def caller(self) -> Caller:
        sender = current_call.get().sender
        cached = self._cache.get(sender)
        if cached is not None:
            return cached
        reply = await self._bus.call(
            Message(**BUS_DRIVER, member="GetConnectionCredentials", signature="s", body=[sender])
        )
        if reply.message_type is not MessageType.METHOD_RETURN:
            raise PermissionError(f"the bus gave no credentials for {sender}")
        creds = reply.body[0]
        pid = creds["ProcessID"].value
        # (once per connection: the claim path asks it of every call)
        caller = Caller(uid=creds["UnixUserID"].value, pid=pid, bus_name=sender,
                        nested=nested(pid))
        if len(self._cache) >= self._cache_size:
            self._cache.pop(next(iter(self._cache)))
        self._cache[sender] = caller
        return caller
