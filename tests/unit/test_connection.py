"""The daemon's bus connection leans on dbus-fast internals to start methods at once: the
installed dbus-fast must have them, or the daemon quietly falls back to dbus-fast's own,
slower handler (a new version that drops one is to be noticed here)."""

import asyncio

from resourced.daemon.bus.connection import DaemonBus, _start, eager_methods


def test_the_installed_dbus_fast_lets_methods_start_at_once():
    async def check():
        return eager_methods(DaemonBus(bus_address="unix:path=/nonexistent"))

    assert asyncio.run(check())


def test_a_method_that_never_waits_is_done_when_started():
    """The eager start: a coroutine that awaits nothing is finished by ``_start`` itself,
    in the calling callback, on every supported Python (3.12.1 and 3.13.0 raised
    AttributeError here when the loop was not passed to the task)."""
    async def answer():
        return 42

    async def check():
        task = _start(answer())
        return task.done(), task.result()

    assert asyncio.run(check()) == (True, 42)


def test_a_method_that_waits_ran_to_its_first_wait_and_finishes_later():
    steps = []

    async def method(answer: asyncio.Future):
        steps.append("before")
        steps.append(await answer)
        return "done"

    async def check():
        answer = asyncio.get_running_loop().create_future()
        task = _start(method(answer))
        seen = list(steps), task.done()
        answer.set_result("after")
        return seen, await asyncio.wait_for(task, 5), steps

    assert asyncio.run(check()) == ((["before"], False), "done", ["before", "after"])


def test_a_method_that_fails_at_once_holds_its_error_for_the_reply():
    async def failing():
        raise ValueError("bad request")

    async def check():
        task = _start(failing())
        assert task.done()
        return task.exception()

    exc = asyncio.run(check())
    assert isinstance(exc, ValueError) and str(exc) == "bad request"
