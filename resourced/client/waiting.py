"""A claim that waits in the queue, as steps: asked (held until granted, or answered at
once and told by its signal), reported on while it waits, retried across a daemon restart,
and taken out of the queue when the wait ends without a grant.

The client's own limit on the wait (``timeout`` and one call's time more, counted from
the start) is a backstop: the daemon ends the wait at ``timeout`` itself, and says so.
"""

import itertools
import os

from jeepney.low_level import HeaderFields, MessageType

from resourced.errors import DaemonUnreachable, InvalidArgs, NoSuchClaim, QueueTimeout
from resourced.protocol import records as tables
from resourced.protocol.names import CLAIM_IFACE, MANAGER_IFACE, MANAGER_PATH

from . import signals
from .steps import Deadline, Listen, Next, Post, Sleep, Subscribe

SERIALS = itertools.count((1 << 31) + int.from_bytes(os.urandom(4), "big") % (1 << 30))
"""Serials of the Claim calls of waiting claims: chosen here, out of the range jeepney counts up from 1,
so that the client knows a call's serial before its answer (``GetClaimByCall``); from a
random start, so that after a restart of the bus (when unique names start again) a
process is unlikely to take another's serial too."""
NO_REPLY = "org.freedesktop.DBus.Error.NoReply"
RETRY_INTERVAL = 0.2
"""Seconds between calls while the daemon restarts under a waiting claim."""
QUEUE_CHANGES = signals.rule(MANAGER_IFACE, path=MANAGER_PATH)
"""ClaimNew, ClaimRemoved (and the Manager's other signals): when a waiter's place may move."""
_RESTARTED = object()
_NOT_KEPT = object()


class ReplyTo:
    """A filter rule (jeepney's filters ask only ``matches``) for the answer to call
    ``serial``."""

    def __init__(self, serial: int):
        self.serial = serial

    def matches(self, msg) -> bool:
        return msg.header.fields.get(HeaderFields.reply_serial) == self.serial


class Outcomes:
    """A rule for a waiting claim's ``Granted`` or ``Cancelled`` (which the daemon sends to
    the connection that made the claim alone: the bus delivers it there without a match
    rule), of any claim until its ``path`` is known, and with ``progress`` the Manager's
    ClaimNew and ClaimRemoved.  Whose they are is ``signals.FromDaemon``'s to check: anyone
    can send a connection a ``Granted``."""

    def __init__(self, progress: bool):
        self.path = None
        self.progress = progress

    def matches(self, msg) -> bool:
        fields = msg.header.fields
        if msg.header.message_type is not MessageType.signal:
            return False
        if fields.get(HeaderFields.interface) == CLAIM_IFACE:
            return self.path is None or fields.get(HeaderFields.path) == self.path
        return self.progress and _queue_moved(msg)

    def outcome(self, msg) -> bool:
        fields = msg.header.fields
        return fields.get(HeaderFields.path) == self.path and \
            fields.get(HeaderFields.member) in ("Granted", "Cancelled")


def _queue_moved(msg) -> bool:
    fields = msg.header.fields
    return fields.get(HeaderFields.interface) == MANAGER_IFACE and \
        fields.get(HeaderFields.member) in ("ClaimNew", "ClaimRemoved")


def wait(client, msg, timeout: float | None, progress, use_index: bool):
    """Steps that make the Claim ``msg`` (with Wait) and wait for its outcome; claim()'s
    result, or the error of a wait that ended without a grant."""
    deadline = Deadline(None if timeout is None else timeout + client.timeout)
    rule = Outcomes(bool(progress))
    heard = signals.FromDaemon([rule])  # the daemon's own, and its changes of owner
    # Listened for before asking: the outcome may come right behind the answer (or, from
    # a daemon that did not keep a held call, instead of it).
    signals_in = yield Listen(heard, bufsize=1024)
    yield from signals.follow(heard)
    # (progress needs the claim's reference at once: a call answered at once, not held)
    ref, rule.path, grant = yield from _asked(client, msg, deadline, held=not progress)
    if grant[tables.wire(tables.GRANT, "state")][1] != "queued":
        return client._allocation(ref, grant, use_index)
    try:
        if progress:
            yield Subscribe(QUEUE_CHANGES)
            yield from _report_place(client, ref, progress)
        while True:
            try:
                signal = yield Next(signals_in, deadline.left())
            except TimeoutError:
                raise QueueTimeout(f"claim {ref} was not granted in time") from None
            except OSError as exc:
                raise client._unreachable(client.bus, exc) from exc
            if signals.is_owner_change(signal):
                continue
            if rule.outcome(signal):
                return client._outcome(signal, use_index)
            if progress and _queue_moved(signal):
                yield from _report_place(client, ref, progress)
    except BaseException:  # timed out, interrupted, or cancelled by the daemon
        try:
            yield client._release_message(ref, False)  # leave no trace in the queue
        except (NoSuchClaim, DaemonUnreachable):
            pass
        raise


def _asked(client, msg, deadline: Deadline, held: bool):
    """Claim's answer to ``msg``, sent with a serial of our own: with ``held``
    (``ReplyWhenGranted``) the grant once granted, else at once; or a queued claim (from
    a daemon that answered at once, or whose successor has the claim after a restart: its
    signal follows).  A call interrupted or timed out before its answer finds its claim
    by the call and takes it out of the queue (or releases it, granted meanwhile)."""
    serial = next(SERIALS)
    replies = yield Listen(ReplyTo(serial))
    try:
        yield Post(msg, serial)
        reply = yield Next(replies, deadline.left() if held else client.timeout)
    except BaseException as exc:
        try:
            ref = (yield client._claim_of_call(serial))[0]
            yield client._release_message(ref, False)
        except (NoSuchClaim, DaemonUnreachable):
            pass
        if isinstance(exc, TimeoutError) and held:
            raise QueueTimeout("the claim was not granted in time; it left the queue") from exc
        if isinstance(exc, (TimeoutError, OSError)):
            raise client._unreachable(client.bus, exc) from exc
        raise
    answer = _claim_answer(client, reply)
    if answer is _RESTARTED:
        return (yield from _retry_unreachable(client._claim_of_call(serial), deadline))
    if answer is _NOT_KEPT:
        return (yield _waiting_only(msg))
    return answer


def _claim_answer(client, reply):
    """Claim's answer in the ``reply`` to its call, or why there is none: ``_RESTARTED``
    (the bus answered NoReply: the daemon went away holding the call, and its claims log
    kept the claim for the next one), ``_NOT_KEPT`` (a daemon older than
    ReplyWhenGranted)."""
    error = reply.header.fields.get(HeaderFields.error_name)
    if error == NO_REPLY:
        return _RESTARTED
    try:
        return client._body(reply)
    except DaemonUnreachable:
        raise client._not_running(client.bus) from None
    except InvalidArgs as exc:
        if error == InvalidArgs.bus_name() and "'ReplyWhenGranted'" in exc.message:
            return _NOT_KEPT
        raise


def _waiting_only(msg):
    """``msg``, a Claim with ReplyWhenGranted, asking with Wait alone (an older daemon)."""
    gpus, options = msg.body
    held = tables.wire(tables.CLAIM_OPTIONS, "reply_when_granted")
    msg.body = (gpus, {k: v for k, v in options.items() if k != held})
    return msg


def _retry_unreachable(msg, deadline: Deadline):
    """``msg``'s answer once the daemon answers again (a restart), asking every
    ``RETRY_INTERVAL`` until the wait's deadline (none: until it answers)."""
    while True:
        try:
            return (yield msg)
        except DaemonUnreachable:
            if deadline.passed():
                raise
        yield Sleep(RETRY_INTERVAL)


def _report_place(client, ref: str, progress):
    """Where a waiting claim stands, for ``claim(progress=...)``."""
    view = yield from client._status()
    claims = {c["id"]: c for c in view["claims"]}
    if ref not in view["queue"]:
        return  # granted or gone: its own signal says which
    me = claims[ref]
    wants_gpus = bool(me["gpus_requested"] or me["vram_bytes"])
    holders = [c for c in view["claims"] if c["state"] == "granted" and (
        (wants_gpus and c["gpu_uuids"]) or set(c["pools"]) & set(me["pools"]))]
    progress({"position": view["queue"].index(ref) + 1, "waiting": len(view["queue"]),
              "claim": me, "holders": holders,
              "units": {p["name"]: p["unit"] for p in view["pools"]}})

