"""The daemon's bus connection: dbus-fast's, with six changes.

- ObjectManager signals from the manager's path.  ``/org/resourced`` is an
  ``org.freedesktop.DBus.ObjectManager``: ``GetManagedObjects`` lists every object below
  it, and ``InterfacesAdded``/``InterfacesRemoved`` announce each one that appears or
  goes, from ``/org/resourced`` (where object-manager clients such as GLib's
  ``GDBusObjectManagerClient`` listen).  dbus-fast sent them from the *child's* path
  instead, where no such client looks, at every export and unexport.  Here an export or
  unexport below the manager is announced by the bus unless the caller says
  ``announce=False``: claim objects are exported lazily (see ``manager.py``), so the
  manager announces a claim itself when it appears (with ``ClaimNew``) and when it goes,
  exported or not (``interfaces_added``/``interfaces_removed``).  An object is listed and
  announced with ``org.freedesktop.DBus.Peer``, ``.Introspectable`` and ``.Properties``
  (empty dicts: they have no properties) beside its own interface, as sd-bus does, since
  every object answers them; GetManagedObjects lists the same, so a client sees one set
  whichever way it learnt of the object.  Properties are read directly from each
  interface's getters (``property_values``), without dbus-fast's callback machinery,
  whose GetManagedObjects was quadratic (10,000 claims: 3.5 s a call, now 1 s).
- A full socket buffer is not a lost connection.  dbus-fast 5.2 tries to write a new
  message at once when its queue is empty, even while an earlier one is half written;
  the socket then answers EAGAIN, which dbus-fast takes for a fatal error and drops the
  connection, and the daemon exits.  A large reply (Describe with thousands of claims,
  an error quoting a 1 MB argument) racing any other message did that.  The writer's
  socket is wrapped so that EAGAIN reads as "0 bytes written": dbus-fast then waits for
  the socket to become writable, as it does after a partial write.  (Only ``send``: the
  daemon sends no file descriptors, and ``sendmsg`` with them must not be retried
  without them.)
- A signal finds its object's path in O(1).  dbus-fast looks for the path of the
  emitting interface by scanning every exported object, for every signal and every
  PropertiesChanged: with 10,000 claims that was about 0.5 ms per signal and most of the
  daemon's time.  The bus keeps each exported interface's path instead.
- Signals sent together go out in one write (``batch``): the manager sends the handful
  that follow a claim or a release so, and the bus daemon wakes once for them, not once
  each.  A method's reply leaves in one write with what the method sent meanwhile (a
  waiter's ``Granted``, when a release served one).
- An ``async`` method starts at once (``_make_method_handler``).  dbus-fast made a task
  for each call, which ran a loop turn later, and sent the reply from a callback one
  more turn after it returned; a claim and a release (that await nothing when the GPU
  backend answers at once) spent two turns each on that.  The method now runs until it
  first waits, in the callback that read the call, as an eager task does (Python 3.12's
  ``eager_start``, or the same by hand on 3.11), and a method done by then is answered
  at once.
- A method may keep its call and answer later (``REPLY_LATER``), where the eager handler
  is in use (``eager_methods``): the manager answers a claim made with
  ``ReplyWhenGranted`` when it is granted, as it sends anything else.
"""

import asyncio
import inspect
import logging
import socket
import sys
import types

from dbus_fast import Message, MessageType, Variant
from dbus_fast.aio import MessageBus
from dbus_fast.service import ServiceInterface, _Property
from dbus_fast.signature import get_signature_tree

from resourced.linux.nesting import Outermost
from resourced.protocol.names import MANAGER_PATH

try:  # dbus-fast's own names for what its handler does; another version: its handler
    from dbus_fast.aio.message_bus import NO_REPLY_EXPECTED_VALUE, _block_unexpected_reply
except ImportError:
    NO_REPLY_EXPECTED_VALUE = _block_unexpected_reply = None

log = logging.getLogger("resourced")

REPLY_LATER = object()
"""What an ``async`` method returns that keeps its call, to answer it itself later."""

OBJECT_MANAGER = "org.freedesktop.DBus.ObjectManager"
STANDARD_INTERFACES = ("org.freedesktop.DBus.Peer", "org.freedesktop.DBus.Introspectable",
                       "org.freedesktop.DBus.Properties")
"""What every exported object also answers; listed with it, without properties."""

_getters: dict[type, tuple[tuple[str, object, object], ...]] = {}


def _readable(cls: type) -> tuple[tuple[str, object, object], ...]:
    """(name, type, getter) of each readable property of an interface class."""
    rows, seen = [], set()
    for _, member in inspect.getmembers(cls):
        if (type(member) is _Property and not member.disabled and member.access.readable()
                and member.prop_getter not in seen):
            seen.add(member.prop_getter)
            rows.append((member.name, get_signature_tree(member.signature).types[0],
                         member.prop_getter))
    return tuple(rows)


def property_values(interface: ServiceInterface) -> dict[str, Variant]:
    """What ``Properties.GetAll`` answers for ``interface``, read now.

    ``interface`` need not be exported, nor even initialised: the getters are called on
    it directly (ours are all synchronous), so a claim's properties can be announced
    from its record without paying for an exported object.  The values are not checked
    against the signatures here (that was two thirds of the cost): ``Properties.Get`` and
    ``GetAll`` check them, and tests/bus/test_object_manager.py compares a claim's
    announced properties with its GetAll."""
    cls = type(interface)
    rows = _getters.get(cls)
    if rows is None:
        rows = _getters[cls] = _readable(cls)
    return {name: Variant(kind, getter(interface), False) for name, kind, getter in rows}


def changed_values(cls: type, changed: dict) -> dict[str, Variant]:
    """``changed`` (property name: value) as ``emit_properties_changed`` sends it for an
    interface of class ``cls``: in the interface's order, typed by its signatures; no
    instance needed, exported or not."""
    rows = _getters.get(cls)
    if rows is None:
        rows = _getters[cls] = _readable(cls)
    return {name: Variant(kind, changed[name]) for name, kind, _ in rows if name in changed}


class _PatientSocket:
    """The writer's view of the socket: a full send buffer writes nothing, and says so."""

    def __init__(self, sock: socket.socket):
        self._sock = sock

    def send(self, data) -> int:
        try:
            return self._sock.send(data)
        except BlockingIOError:
            return 0

    def __getattr__(self, name):
        return getattr(self._sock, name)


class _Joined:
    """Messages already marshalled, end to end: the writer takes it for one message."""

    unix_fds = ()

    def __init__(self, data: bytes):
        self.data = data

    def _marshall(self, _negotiate_unix_fd) -> bytearray:
        return self.data


class DaemonBus(MessageBus):
    def __init__(self, *args, object_manager: str = MANAGER_PATH, **kwargs):
        super().__init__(*args, **kwargs)
        self._path_of: dict[ServiceInterface, str] = {}  # each exported interface's path
        self.object_manager = object_manager
        self._below = object_manager.rstrip("/") + "/"  # the paths it manages start so
        self._announce = True  # False for the duration of a quiet export or unexport
        self._held: list | None = None  # the bytes of what was sent during a batch
        self._written = None  # the future of the held messages' write (made when needed)
        self._batch = Outermost(self._hold, self._flush)
        self.unanswered = 0  # method calls not answered in the callback that read them

    def send(self, msg: Message):
        """dbus-fast's send; inside a batch the message is written at its end, but made
        into bytes now, so that a value it cannot carry fails here as it would have (a
        reply then becomes an error reply, a call fails in its caller): only a signal is
        dropped, logged, where the others go on.  The messages of a batch share one
        future: their write's."""
        held = self._held
        if held is None or msg.unix_fds:  # (the daemon sends no descriptors)
            if held:  # written now: what was held goes first
                self._flush([])
            return super().send(msg)
        if not msg.serial:
            msg.serial = self.next_serial()
        try:
            held.append(msg._marshall(self._negotiate_unix_fd))
        except Exception:
            if msg.message_type is not MessageType.SIGNAL:
                raise
            log.exception("%s.%s not sent", msg.interface, msg.member)
            future = self._loop.create_future()
            future.cancel()
            return future
        if self._written is None:
            self._written = self._loop.create_future()
        return self._written

    def batch(self) -> Outermost:
        """A context: messages sent inside go out together at its end, in order, in one
        write.

        Each write costs a system call and a wake-up of the bus daemon; for the signals
        of a claim+release (about eight) one write instead of one each saved the bus
        daemon about a tenth of its work (38 of 360 us), as much as InterfacesAdded and
        InterfacesRemoved added to it."""
        return self._batch

    def _hold(self) -> None:
        self._held = []

    def _flush(self, held_next: list | None = None) -> None:
        """Write what is held, with one write; hold ``held_next`` from now on."""
        held, future, self._held, self._written = self._held, self._written, held_next, None
        if held:
            self._writer.schedule_write(
                _Joined(held[0] if len(held) == 1 else b"".join(held)), future)

    def _make_method_handler(self, interface: ServiceInterface, method):
        """dbus-fast's handler, but an ``async`` method starts at once (module docstring),
        where this dbus-fast has what that needs (``eager_methods``)."""
        if not (inspect.iscoroutinefunction(method.fn) and eager_methods(self)):
            return super()._make_method_handler(interface, method)
        to_args = ServiceInterface._msg_body_to_args
        to_body = ServiceInterface._fn_result_to_body

        def reply(msg: Message, send_reply, result) -> None:
            if result is REPLY_LATER:
                return
            body, fds = to_body(result, method.out_signature_tree,
                                replace_fds=self._negotiate_unix_fd)
            send_reply(Message.new_method_return(msg, method.out_signature, body, fds))

        def handler(msg: Message, send_reply) -> None:
            replying = send_reply is not _block_unexpected_reply and not (
                msg.flags.value & NO_REPLY_EXPECTED_VALUE)
            with self.batch():  # the reply and what the call sent at once: one write
                task = _start(method.fn(interface, *(to_args(msg) if msg.unix_fds else msg.body)))
                if task.done():
                    self._answer(task, msg, send_reply, replying, reply)
                    return
            self._pending_futures.add(task)  # held until done, as dbus-fast does
            task.add_done_callback(self._pending_futures.discard)
            self.unanswered += 1
            task.add_done_callback(
                lambda done: self._answer_later(done, msg, send_reply, replying, reply))

        return handler

    def _answer_later(self, task: asyncio.Future, *how) -> None:
        self.unanswered -= 1
        self._answer(task, *how)

    def _answer(self, task: asyncio.Future, msg: Message, send_reply, replying: bool,
                reply) -> None:
        """The reply (or error) for a method's finished task, as dbus-fast sends it."""
        if not replying:
            self._pending_futures.add(task)
            self._future_exception_no_reply(task)  # logs what went wrong, if anything
            return
        with send_reply:
            reply(msg, send_reply, task.result())

    async def connect(self) -> "DaemonBus":
        await super().connect()
        self._writer.sock = _PatientSocket(self._writer.sock)
        return self

    def export(self, path: str, interface: ServiceInterface, announce: bool = True) -> None:
        """dbus-fast's export; ``announce=False``: no InterfacesAdded (the caller sends it)."""
        self._announce = announce
        try:
            super().export(path, interface)
        finally:
            self._announce = True
        self._path_of[interface] = path

    def unexport(self, path: str, interface=None, announce: bool = True) -> None:
        """dbus-fast's unexport; ``announce=False``: no InterfacesRemoved."""
        exported = self._path_exports.get(path, {})
        going = [i for i in exported.values()
                 if interface is None or i is interface or i.name == interface]
        self._announce = announce
        try:
            super().unexport(path, interface)
        finally:
            self._announce = True
        for i in going:
            self._path_of.pop(i, None)

    def unexport_all(self) -> None:
        """Unexport every object, quietly: the bus is gone and its objects move to a new
        connection (an interface exported on two buses would signal on both)."""
        for interface, path in list(self._path_of.items()):
            self.unexport(path, interface, announce=False)

    def emit(self, path: str, interface: str, member: str, signature: str, body: list,
             destination: str = "") -> None:
        """A signal from ``path``, as an interface exported there would send it, whether
        one is or not (a claim's object is made only when something calls it); to
        ``destination`` alone when given (the bus delivers it there without a match rule)."""
        if not self._disconnected:
            self.send(Message(message_type=MessageType.SIGNAL, destination=destination or None,
                              path=path, interface=interface, member=member,
                              signature=signature, body=body))

    # -- the object manager ------------------------------------------------------------
    def interfaces_added(self, path: str, interfaces: dict[str, dict[str, Variant]],
                         new_object: bool = True) -> None:
        """Announce interfaces (name: properties) of the object at ``path`` from the
        object manager's path; ``new_object``: with the standard interfaces too."""
        if self._disconnected:
            return
        if new_object:
            interfaces = {**{name: {} for name in STANDARD_INTERFACES}, **interfaces}
        self.send(Message.new_signal(path=self.object_manager, interface=OBJECT_MANAGER,
                                     member="InterfacesAdded", signature="oa{sa{sv}}",
                                     body=[path, interfaces]))

    def interfaces_removed(self, path: str, names, whole_object: bool = True) -> None:
        """Announce that interfaces ``names`` are gone from ``path`` (``whole_object``: the
        object is, the standard interfaces with it)."""
        if self._disconnected:
            return
        names = [*names, *STANDARD_INTERFACES] if whole_object else list(names)
        self.send(Message.new_signal(path=self.object_manager, interface=OBJECT_MANAGER,
                                     member="InterfacesRemoved", signature="oas",
                                     body=[path, names]))

    def _emit_interface_added(self, path, interface) -> None:
        if self._announce and path.startswith(self._below):
            try:
                values = property_values(interface)
            except Exception:  # a getter's bug must not fail the export
                log.exception("InterfacesAdded for %s not sent", path)
                return
            self.interfaces_added(path, {interface.name: values},
                                  new_object=len(self._path_exports[path]) == 1)

    def _emit_interface_removed(self, path, removed_interfaces) -> None:
        if self._announce and path.startswith(self._below):
            self.interfaces_removed(path, removed_interfaces,
                                    whole_object=path not in self._path_exports)

    def _default_get_managed_objects_handler(self, msg: Message, send_reply) -> None:
        """Every object below the called path, as its interfaces and their properties."""
        below = msg.path.rstrip("/") + "/"
        result = {}
        for path, interfaces in self._path_exports.items():
            if path.startswith(below):
                record = {name: {} for name in STANDARD_INTERFACES}
                for name, interface in interfaces.items():
                    record[name] = property_values(interface)
                result[path] = record
        send_reply(Message.new_method_return(msg, "a{oa{sa{sv}}}", [result]))

    # -- signals -----------------------------------------------------------------------
    def _interface_signal_notify(self, interface, interface_name, member, signature, body,
                                 unix_fds=()) -> None:
        self.send(Message.new_signal(path=self._path_of[interface], interface=interface_name,
                                     member=member, signature=signature, body=body,
                                     unix_fds=list(unix_fds)))


def eager_methods(bus: MessageBus) -> bool:
    """Whether this dbus-fast has the internals the eager handler uses (5.2 has them; a
    test says so, so that a new version that drops one is noticed, not just slower)."""
    return (_block_unexpected_reply is not None and hasattr(bus, "_pending_futures")
            and hasattr(bus, "_future_exception_no_reply")
            and hasattr(ServiceInterface, "_msg_body_to_args")
            and hasattr(ServiceInterface, "_fn_result_to_body"))


def _start(coro) -> asyncio.Future:
    """A task for ``coro`` that has already run until it first waits (done, if it never
    does), in the calling callback.

    3.12 and 3.13 have eager tasks, but their ``Task(eager_start=True)`` asks the loop it
    was given whether it runs, so the loop must be passed: without it (3.12.1, 3.13.0)
    the call raises AttributeError on None.  3.11 has no eager tasks: the coroutine's
    first step is taken here by hand, and a task drives the rest (``_go_on``)."""
    loop = asyncio.get_running_loop()
    if sys.version_info >= (3, 12):
        return asyncio.Task(coro, loop=loop, eager_start=True)
    future = loop.create_future()
    try:
        waiting_on = coro.send(None)
    except StopIteration as done:
        future.set_result(done.value)
        return future
    except Exception as exc:  # noqa: BLE001 - held for the reply, as a task would hold it
        future.set_exception(exc)
        return future
    return asyncio.ensure_future(_go_on(coro, waiting_on))


@types.coroutine
def _go_on(coro, waiting_on):
    """The rest of a coroutine that already ran until it yielded ``waiting_on`` (what it
    awaits), for a task to drive as if it had run it from the start."""
    to_yield = waiting_on
    while True:
        try:
            sent = yield to_yield
        except GeneratorExit:
            coro.close()
            raise
        except BaseException as exc:  # noqa: BLE001 - thrown in by the task: into the coroutine
            try:
                to_yield = coro.throw(exc)
            except StopIteration as done:
                return done.value
            continue
        try:
            to_yield = coro.send(sent)
        except StopIteration as done:
            return done.value
