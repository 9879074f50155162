"""The one seam where daemon exceptions become D-Bus error replies."""

import functools
import inspect
import logging
from collections import Counter

from dbus_fast import DBusError, Message

from resourced.errors import Internal, ResourcedError

log = logging.getLogger("resourced")

ANSWERED: Counter = Counter()
"""(method, error name, "" for none) -> the calls this daemon answered so (its metrics)."""


def _translate(exc: Exception) -> DBusError:
    if isinstance(exc, DBusError):
        return exc
    if isinstance(exc, ResourcedError):
        return DBusError(exc.bus_name(), exc.message)
    log.error("internal error", exc_info=exc)
    return DBusError(Internal.bus_name(), "internal error; see the daemon's log")


def error_reply(call: Message, exc: Exception) -> Message:
    """The error reply to ``call`` for ``exc``, as a method raising it sends it (for a call
    answered later, outside its method)."""
    error = _translate(exc)
    return Message.new_error(call, error.type, error.text)


def bus_errors(fn):
    """Wrap a bus method so every exception leaves as a named D-Bus error, never a
    traceback; each answer is counted in ``ANSWERED``.  An ``async`` method's reply waits
    for its interface to be ``settled``."""
    name = fn.__name__
    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def wrapper(*args):
            try:
                result = await fn(*args)
                await args[0].settled()
            except Exception as exc:
                raise _counted(name, _translate(exc)) from exc
            ANSWERED[name, ""] += 1
            return result

    else:

        @functools.wraps(fn)
        def wrapper(*args):
            try:
                result = fn(*args)
            except Exception as exc:
                raise _counted(name, _translate(exc)) from exc
            ANSWERED[name, ""] += 1
            return result

    return wrapper


def _counted(method: str, error: DBusError) -> DBusError:
    ANSWERED[method, error.type] += 1
    return error
