"""The health monitor: measures the configured RAM and disk checks now and then, on asyncio.

    monitor = HealthMonitor(config.checks, config.daemon.sample_interval,
                            config.daemon.probe_timeout)
    monitor.subscribe(lambda events: ...)    # level changes of a round, when there are any
    monitor.on_sample(lambda states: ...)    # after every round: the figures moved
    task = asyncio.create_task(monitor.run())
    monitor.describe()                       # {"level": "WARN", "checks": [...]}, for JSON

No D-Bus here: the daemon turns the events into signals.  The decisions are the pure
``core.health``; this module adds the clock, the threads and the deadline.

Probes run off the event loop, each in a thread of its own, with a deadline of
``probe_timeout`` from the moment it started.  A probe that overruns makes its check
UNAVAILABLE; while it stays hung (a dead NFS server), later rounds do not start another
probe of the same check behind it but report UNAVAILABLE at once, and the check comes back
by itself once the call returns.  Two rounds that overlap share a probe still in time.

The threads are daemon threads, not a ``ThreadPoolExecutor``'s: the interpreter joins a
pool's workers when it exits, so one ``statvfs`` stuck on a dead mount would keep
``gpuctl resources`` (and the daemon's shutdown) from ever finishing.  At most one thread
per check is ever in flight, so their number stays bounded.
"""

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from dataclasses import dataclass

from resourced.config import CheckEntry
from resourced.core.health import (
    ERROR,
    OK,
    STOP,
    UNAVAILABLE,
    WARN,
    CheckState,
    HealthBook,
    LevelChanged,
    Measurement,
    level_for,
)
from resourced.linux import sd
from resourced.linux.threads import DaemonThreads

__all__ = ["HealthMonitor", "state_dict"]

log = logging.getLogger("resourced.health")

EventListener = Callable[[list[LevelChanged]], None]
SampleListener = Callable[[list[dict]], None]

# Audit priorities (syslog): a STOP or a check that cannot be measured is a warning.
_PRIORITY = {OK: 5, WARN: 5, STOP: 4, ERROR: 4, UNAVAILABLE: 4}


@dataclass
class _Probe:
    future: Future
    started: float


def _describe_error(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.filename}: {exc.strerror}" if exc.filename else exc.strerror
    return str(exc) or type(exc).__name__


def state_dict(state: CheckState) -> dict:
    """One check's state as plain data for JSON (``Describe``'s ``health.checks``)."""
    m = state.measurement
    return {
        "name": state.name,
        "type": state.type,
        "path": state.path,
        "level": state.level,
        "reason": state.reason,
        "free_bytes": None if m is None else m.free_bytes,
        "total_bytes": None if m is None else m.total_bytes,
        "free_pct": None if m is None else round(m.free_pct, 2),
        "used_pct": None if m is None else round(m.used_pct, 2),
        "limits": dict(state.limits),
    }


class HealthMonitor:
    """Samples the checks every ``sample_interval`` seconds and reports level changes."""

    def __init__(self, checks: Iterable[CheckEntry], sample_interval: float,
                 probe_timeout: float,
                 measure: Callable[[CheckEntry], Measurement] | None = None,
                 audit: bool = True):
        if measure is None:
            from resourced.evidence.host import measure
        self.measure = measure
        self.sample_interval = sample_interval
        self.probe_timeout = probe_timeout
        self.audit = audit
        self._book = HealthBook(checks)
        self._executor = DaemonThreads("health-probe")
        self._probes: dict[CheckEntry, _Probe] = {}
        self._event_listeners: list[EventListener] = []
        self._sample_listeners: list[SampleListener] = []
        self._wake = asyncio.Event()

    # -- listeners -------------------------------------------------------------------
    def subscribe(self, listener: EventListener) -> Callable[[], None]:
        """Call ``listener(events)`` after each round (or ``apply``) that changed a level.

        Listeners run on the event loop and must not block; the returned function
        unsubscribes.
        """
        self._event_listeners.append(listener)
        return lambda: self._event_listeners.remove(listener)

    def on_sample(self, listener: SampleListener) -> Callable[[], None]:
        """Call ``listener(states())`` after every round, changed or not."""
        self._sample_listeners.append(listener)
        return lambda: self._sample_listeners.remove(listener)

    # -- what is known -----------------------------------------------------------------
    @property
    def health(self) -> str:
        """The machine's health: the worst check (``core.health.worst``)."""
        return self._book.health

    @property
    def checks(self) -> tuple[CheckEntry, ...]:
        return self._book.checks

    def states(self) -> list[dict]:
        """Every check, in the configuration's order, as ``state_dict`` gives it."""
        return [state_dict(s) for s in self._book.states()]

    def levels(self) -> dict[str, str]:
        """Check name -> level."""
        return {s.name: s.level for s in self._book.states()}

    def describe(self) -> dict:
        """``{"level": health, "checks": states()}``: ``Describe``'s ``health`` value."""
        return {"level": self.health, "checks": self.states()}

    # -- sampling ----------------------------------------------------------------------
    async def run(self) -> None:
        """Sample now, then every ``sample_interval`` seconds (sooner after ``apply``)."""
        while True:
            self._wake.clear()
            await self.sample_now()
            try:
                await asyncio.wait_for(self._wake.wait(), self.sample_interval)
            except TimeoutError:
                pass

    async def sample_now(self) -> list[LevelChanged]:
        """Measure every check once (concurrently); returns this round's level changes."""
        checks = self._book.checks
        results = await asyncio.gather(*(self._probe(c) for c in checks))
        events: list[LevelChanged] = []
        for check, (level, measurement, reason) in zip(checks, results):
            if check not in self._book.checks:
                continue  # reconfigured while this round ran: its reading is of the old check
            events += self._book.update(check.name, level, measurement, reason)
        self._publish(events)
        states = self.states()
        for listener in list(self._sample_listeners):
            self._call(listener, states)
        return events

    def apply(self, checks: Iterable[CheckEntry], sample_interval: float,
              probe_timeout: float) -> list[LevelChanged]:
        """Take a reloaded configuration; ``run`` samples again at once.

        Checks that stay keep their level until measured; removed ones that were not OK
        yield a change to OK (published like any other); new ones are UNAVAILABLE until
        measured.
        """
        events = self._book.configure(checks)
        self.sample_interval = sample_interval
        self.probe_timeout = probe_timeout
        self._publish(events)
        self._wake.set()
        return events

    def close(self) -> None:
        """Stop waiting for probes; a hung one is left to its (daemon) thread."""
        self._probes.clear()

    async def _probe(self, check: CheckEntry) -> tuple[str, Measurement | None, str]:
        now = time.monotonic()
        probe = self._probes.get(check)
        if probe is not None and probe.future.done():
            probe = None
        if probe is None:
            # A thread-safe future, not an asyncio one: it outlives the loop that started it.
            probe = self._probes[check] = _Probe(self._executor.submit(self.measure, check), now)
        elif now - probe.started >= self.probe_timeout:
            return (UNAVAILABLE, None,
                    f"the previous probe has not returned for {now - probe.started:.0f} s")
        remaining = self.probe_timeout - (now - probe.started)
        waiter = asyncio.wrap_future(probe.future)
        # Whoever stops waiting, the outcome is consumed, never left unretrieved.
        waiter.add_done_callback(lambda f: f.cancelled() or f.exception())
        try:
            # shield: a waiter that gives up must not cancel the probe others share
            m = await asyncio.wait_for(asyncio.shield(waiter), remaining)
        except TimeoutError:
            return UNAVAILABLE, None, f"no answer within {self.probe_timeout:g} s"
        except (OSError, ValueError) as exc:
            return ERROR, None, _describe_error(exc)
        except Exception as exc:
            log.warning("check %s: the probe failed unexpectedly", check.name, exc_info=True)
            return ERROR, None, f"{type(exc).__name__}: {_describe_error(exc)}"
        finally:
            if probe.future.done() and self._probes.get(check) is probe:
                del self._probes[check]
        if not isinstance(m, Measurement):
            return ERROR, None, f"the probe returned {type(m).__name__}, not a measurement"
        level, reason = level_for(check, m)
        return level, m, reason

    def _publish(self, events: list[LevelChanged]) -> None:
        if not events:
            return
        if self.audit:
            for e in events:
                sd.audit(f"check {e.check}: {e.old} -> {e.new} ({e.reason})",
                         priority=_PRIORITY.get(e.new, 5), check=e.check, level=e.new,
                         old_level=e.old, reason=e.reason)
        for listener in list(self._event_listeners):
            self._call(listener, list(events))

    @staticmethod
    def _call(listener, arg) -> None:
        try:
            listener(arg)
        except Exception:
            log.exception("a health listener failed")
