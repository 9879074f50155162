"""A call as a generator of steps, and the drivers that run one blocking or awaited.

A call written once (``calls``) yields what it needs done and gets the answer back
through ``.send()``, or the failure through ``.throw()``; it returns its result.  A
jeepney message yielded as it is a method call: its answer's body comes back (an error
reply raised as ``ResourcedError``).  The others are the classes here.  Only the
client's ``perform`` (blocking or asyncio) knows how a step is done; ``run`` and
``run_async`` are the same loop with and without ``await``.
"""

import functools
import time


class Step:
    """What a call asks done (plain classes: a blocking client's import stays cheap)."""

    __slots__ = ()


class Raw(Step):
    """Send a method call and get its reply message as it is (an error reply too);
    OSError or TimeoutError when the bus fails."""

    __slots__ = ("message",)

    def __init__(self, message):
        self.message = message


class Post(Step):
    """Send a message without waiting for an answer (with ``serial``, if given)."""

    __slots__ = ("message", "serial")

    def __init__(self, message, serial: int | None = None):
        self.message, self.serial = message, serial


class Listen(Step):
    """Keep the incoming messages ``rule`` matches (anything with ``matches(msg)``),
    ``bufsize`` at most, until the call ends; answers a handle for ``Next``."""

    __slots__ = ("bufsize", "rule")

    def __init__(self, rule, bufsize: int = 1):
        self.rule, self.bufsize = rule, bufsize


class Subscribe(Step):
    """Ask the bus for the signals ``rule`` matches (AddMatch), until the call ends."""

    __slots__ = ("rule",)

    def __init__(self, rule):
        self.rule = rule


class Next(Step):
    """The next message kept by ``Listen``'s ``handle``; TimeoutError after ``timeout``
    seconds (None: no limit), OSError when the bus fails."""

    __slots__ = ("handle", "timeout")

    def __init__(self, handle, timeout: float | None = None):
        self.handle, self.timeout = handle, timeout


class Sleep(Step):
    __slots__ = ("seconds",)

    def __init__(self, seconds: float):
        self.seconds = seconds


class Open(Step):
    """Connect to the bus at ``address`` (``SESSION``, ``SYSTEM`` or an address): the
    connection the following steps use."""

    __slots__ = ("address",)

    def __init__(self, address: str):
        self.address = address


class Shut(Step):
    """Close the connection ``Open`` made."""

    __slots__ = ()


class Emit(Step):
    """A stream's next item, handed to whoever iterates it."""

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value


class Deadline:
    """``seconds`` from now (None: never), as what is left for each wait on the way."""

    def __init__(self, seconds: float | None):
        self.at = None if seconds is None else time.monotonic() + seconds

    def left(self) -> float | None:
        return None if self.at is None else max(0.0, self.at - time.monotonic())

    def passed(self) -> bool:
        return self.at is not None and time.monotonic() > self.at


def _advance(steps, answer, failure):
    return steps.send(answer) if failure is None else steps.throw(failure)


def run(steps, perform):
    """Drive ``steps`` with ``perform(step) -> answer``; the call's result."""
    answer = failure = None
    while True:
        try:
            step = _advance(steps, answer, failure)
        except StopIteration as done:
            return done.value
        try:
            answer, failure = perform(step), None
        except BaseException as exc:  # noqa: BLE001 - the call decides (an interrupt too)
            answer, failure = None, exc


async def run_async(steps, perform):
    """``run`` with ``await perform(step)``."""
    answer = failure = None
    while True:
        try:
            step = _advance(steps, answer, failure)
        except StopIteration as done:
            return done.value
        try:
            answer, failure = await perform(step), None
        except BaseException as exc:  # noqa: BLE001 - a cancellation too
            answer, failure = None, exc


def iterate(steps, perform):
    """A stream's ``Emit`` values, driven as ``run`` drives a call."""
    answer = failure = None
    try:
        while True:
            try:
                step = _advance(steps, answer, failure)
            except StopIteration:
                return
            if isinstance(step, Emit):
                answer = failure = None
                yield step.value
                continue
            try:
                answer, failure = perform(step), None
            except BaseException as exc:  # noqa: BLE001
                answer, failure = None, exc
    finally:
        steps.close()


async def iterate_async(steps, perform):
    """``iterate`` with ``await perform(step)``."""
    answer = failure = None
    try:
        while True:
            try:
                step = _advance(steps, answer, failure)
            except StopIteration:
                return
            if isinstance(step, Emit):
                answer = failure = None
                yield step.value
                continue
            try:
                answer, failure = await perform(step), None
            except BaseException as exc:  # noqa: BLE001
                answer, failure = None, exc
    finally:
        steps.close()


class call:
    """A public call defined once as a step generator ``steps(client, ...)``: a class
    that says how its steps run (``_blocking``) gets it as a method, blocking or
    ``async``, with the generator's signature and docstring.  ``entered``: the async
    method answers an awaitable that is also an ``async with`` (``acquire``)."""

    def __init__(self, steps=None, *, entered: bool = False):
        self.steps = steps
        self.entered = entered

    def __call__(self, steps):  # as @call(entered=True)
        self.steps = steps
        return self

    def method(self, blocking: bool):
        steps = self.steps
        if blocking:
            def method(client, *args, **kwargs):
                return client._run(steps(client, *args, **kwargs))
        elif self.entered:
            def method(client, *args, **kwargs):
                return client._entered(lambda: client._run(steps(client, *args, **kwargs)))
        else:
            async def method(client, *args, **kwargs):
                return await client._run(steps(client, *args, **kwargs))
        return functools.wraps(steps)(method)


class stream(call):
    """A call whose steps ``Emit`` items: an iterator (blocking) or an async iterator."""

    def method(self, blocking: bool):
        steps = self.steps

        def method(client, *args, **kwargs):
            return client._iterate(steps(client, *args, **kwargs))
        return functools.wraps(steps)(method)


class Defined:
    """A class whose calls are ``call`` and ``stream`` definitions; the subclass that sets
    ``_blocking`` (True or False) turns each into its method."""

    _blocking: bool | None = None

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "_blocking" not in vars(cls):
            return
        seen = set()
        for klass in cls.__mro__:  # the nearest definition of each name (an override wins)
            for name, definition in list(vars(klass).items()):
                if name not in seen and isinstance(definition, call):
                    setattr(cls, name, definition.method(cls._blocking))
                seen.add(name)
