"""Blocking calls off the event loop, in threads that can never hold up an exit.

A ``ThreadPoolExecutor``'s workers are joined when the interpreter exits, so one call
stuck in a hung driver or a dead NFS mount would keep the daemon from ever stopping.
These threads are daemon threads, one per call: nothing queues behind a hung call and
nothing waits for it at exit.  Callers bound how many can be in flight (the GPU probe and
each health check allow one at a time).
"""

import asyncio
import queue
import threading
from concurrent.futures import Executor, Future


class DaemonThreads(Executor):
    """Runs each call in a new daemon thread: nothing queues, nothing is joined at exit."""

    def __init__(self, name: str):
        self.name = name

    def submit(self, fn, /, *args, **kwargs) -> Future:
        future: Future = Future()
        threading.Thread(target=_run, args=(future, fn, args, kwargs), name=self.name,
                         daemon=True).start()
        return future


class OneThread(Executor):
    """Runs calls in one daemon thread of its own, made at the first call and kept: for a
    caller with at most one call in flight (the GPU probe), which must never submit
    while a call hangs, since the next would wait behind it.  Starting a thread cost
    more than the look it made (a claim and its release each look once)."""

    def __init__(self, name: str):
        self.name = name
        self._calls: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def submit(self, fn, /, *args, **kwargs) -> Future:
        future: Future = Future()
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._serve, name=self.name, daemon=True)
            self._thread.start()
        self._calls.put((future, fn, args, kwargs))
        return future

    def _serve(self) -> None:
        while True:
            _run(*self._calls.get())  # (holding nothing while it waits for the next)


def _run(future: Future, fn, args, kwargs) -> None:
    """``fn(*args, **kwargs)`` into ``future``, unless it was cancelled first."""
    if not future.set_running_or_notify_cancel():
        return
    try:
        result = fn(*args, **kwargs)
    except BaseException as exc:  # noqa: BLE001 - handed to the waiting coroutine
        future.set_exception(exc)
    else:
        future.set_result(result)


_BLOCKING = DaemonThreads("resourced-io")


async def off_loop(fn, *args, timeout: float):
    """``fn(*args)`` in a daemon thread; ``asyncio.TimeoutError`` after ``timeout`` s."""
    loop = asyncio.get_running_loop()
    return await asyncio.wait_for(loop.run_in_executor(_BLOCKING, fn, *args), timeout)
