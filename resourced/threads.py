"""Blocking calls off the event loop, in threads that can never hold up an exit.

A ``ThreadPoolExecutor``'s workers are joined when the interpreter exits, so one call
stuck in a hung driver or a dead NFS mount would keep the daemon from ever stopping.
These threads are daemon threads, one per call: nothing queues behind a hung call and
nothing waits for it at exit.  Callers bound how many can be in flight (the GPU probe and
each health check allow one at a time).
"""

import asyncio
import threading
from concurrent.futures import Executor, Future


class DaemonThreads(Executor):
    """Runs each call in a new daemon thread: nothing queues, nothing is joined at exit."""

    def __init__(self, name: str):
        self.name = name

    def submit(self, fn, /, *args, **kwargs) -> Future:
        future: Future = Future()

        def work():
            if not future.set_running_or_notify_cancel():
                return
            try:
                result = fn(*args, **kwargs)
            except BaseException as exc:  # noqa: BLE001 - handed to the waiting coroutine
                future.set_exception(exc)
            else:
                future.set_result(result)

        threading.Thread(target=work, name=self.name, daemon=True).start()
        return future


_BLOCKING = DaemonThreads("resourced-io")


async def off_loop(fn, *args, timeout: float):
    """``fn(*args)`` in a daemon thread; ``asyncio.TimeoutError`` after ``timeout`` s."""
    loop = asyncio.get_running_loop()
    return await asyncio.wait_for(loop.run_in_executor(_BLOCKING, fn, *args), timeout)
