"""The engine: the ledger plus the edges it needs (GPU backend, process facts, liveness).

It knows nothing of D-Bus.  The bus adapter hands it a ``Caller`` and plain arguments,
and subscribes to the events it publishes.  Blocking work (the GPU backend, user-name
lookups) runs in a thread with a deadline before a decision; the decision itself is one
synchronous call into the ledger, so it never interleaves with another caller's.
"""

import asyncio
import logging
import pwd
import secrets
import string
import time
from collections.abc import Callable
from dataclasses import dataclass

from .backends import Backend, NoGpus
from .core.claims import Claim, ClaimRequest
from .core.inventory import Gpu
from .core.ledger import ClaimGranted, ClaimReleased, Event, Ledger, OwnerDied
from .errors import Internal, InvalidRequest, NotClaimOwner, NotProcessOwner, ResourcedError
from .evidence.liveness import ExitWatcher
from .evidence.processes import process_ref, process_uid
from .sd import audit

log = logging.getLogger("resourced")

ID_ALPHABET = string.ascii_lowercase + string.digits


@dataclass(frozen=True)
class Caller:
    """Who is calling, as the bus (never the caller) says."""

    uid: int
    pid: int
    bus_name: str = ""


def wall_clock_usec() -> int:
    return time.time_ns() // 1000


class Engine:
    def __init__(self, backend: Backend, store=None, probe_timeout: float = 10.0,
                 clock=wall_clock_usec):
        self.backend = backend
        self.store = store  # a ClaimStore, or None to keep claims in memory only
        self.probe_timeout = probe_timeout
        self.clock = clock
        self.ledger = Ledger([])
        self.backend_note = getattr(backend, "reason", "")
        self._listeners: list[Callable[[list[Event]], None]] = []
        self._watcher: ExitWatcher | None = None
        self._user_names: dict[int, str] = {}

    # -- lifecycle ---------------------------------------------------------------------
    async def start(self, restored: dict[str, Claim] | None = None) -> None:
        """Read the inventory (off the loop, with a deadline), take back ``restored`` claims
        from before a restart, and watch their owners (dead ones are handled at once)."""
        loop = asyncio.get_running_loop()
        self._watcher = ExitWatcher(loop, self._owner_exited)
        try:
            gpus = await self._blocking(self.backend.inventory)
        except Exception as exc:  # noqa: BLE001 - any backend failure leaves us GPU-less
            self.backend_note = f"{self.backend.name} backend failed: {exc}"
            self.backend = NoGpus(self.backend_note)
            gpus = []
        self.ledger = Ledger(gpus)
        if not gpus:
            log.warning("no GPUs to manage: %s", self.backend_note or "the backend lists none")
        for claim, why in self.ledger.restore((restored or {}).values()):
            log.error("dropping restored claim %s: %s", claim.id, why)
        for claim in list(self.ledger.claims.values()):
            if claim.owner_alive and not self._watcher.watch(claim.id, claim.owner):
                self._commit(self.ledger.owner_died(claim.id))
        if self.ledger.claims:
            log.info("restored %d claim(s)", len(self.ledger.claims))

    def close(self) -> None:
        if self._watcher:
            self._watcher.close()

    def subscribe(self, listener: Callable[[list[Event]], None]) -> None:
        self._listeners.append(listener)

    # -- operations --------------------------------------------------------------------
    async def claim(
        self,
        caller: Caller,
        gpus: int,
        mode: str,
        owner_pid: int | None = None,
        label: str = "",
        task_name: str = "",
    ) -> Claim:
        pid = caller.pid if owner_pid is None else owner_pid
        owner = process_ref(pid)
        if owner is None:
            raise InvalidRequest(f"owner process {pid} does not exist")
        if caller.uid != 0 and process_uid(pid) != caller.uid:
            raise NotProcessOwner(f"process {pid} does not belong to uid {caller.uid}")
        user = await self._user_name(caller.uid)
        request = ClaimRequest(
            gpus=gpus, mode=mode, owner=owner, uid=caller.uid, user=user,
            label=label, task_name=task_name,
        )
        # The decision: synchronous from here on.
        try:
            events = self.ledger.grant(request, self._new_id(), self.clock())
        except ResourcedError as exc:
            audit(f"refused {gpus} GPU(s) to uid {caller.uid}: {exc.message}", priority=4,
                  uid=caller.uid, refusal=exc.code)
            raise
        claim = events[0].claim
        self._commit(events, undo=lambda: self.ledger.release(claim.id))
        if not self._watcher.watch(claim.id, claim.owner):
            self._commit(self.ledger.owner_died(claim.id))
        return claim

    def release(self, caller: Caller, claim_id: str) -> Claim:
        claim = self.ledger.get(claim_id)
        if caller.uid not in (0, claim.uid):
            raise NotClaimOwner(f"claim {claim_id} belongs to {claim.user or claim.uid}")
        self._watcher.forget(claim_id)
        self._commit(self.ledger.release(claim_id))
        return claim

    # -- views -------------------------------------------------------------------------
    def gpu_state(self, gpu: Gpu) -> str:
        return "claimed" if self.ledger.holder(gpu.uuid) else "free"

    def free_count(self) -> int:
        return len(self.ledger.free_gpus())

    # -- internals ---------------------------------------------------------------------
    def _new_id(self) -> str:
        while True:
            claim_id = "c" + "".join(secrets.choice(ID_ALPHABET) for _ in range(6))
            if claim_id not in self.ledger.claims:
                return claim_id

    def _owner_exited(self, claim_id: str) -> None:
        self._commit(self.ledger.owner_died(claim_id))

    def _commit(self, events: list[Event], undo=None) -> None:
        """Persist ``events`` (before anyone hears of them), then audit and publish them.

        If they cannot be persisted and ``undo`` is given, the change is undone and the
        caller gets an error: nothing is acknowledged that a restart would forget.
        """
        if self.store is not None and events:
            try:
                self.store.record(events, self.ledger.claims)
            except OSError as exc:
                log.error("cannot persist claims to %s: %s", self.store.path, exc)
                if undo is not None:
                    undo()
                    raise Internal("the daemon cannot record claims; see its log") from exc
        for event in events:
            self._audit(event)
        for listener in self._listeners:
            listener(events)

    @staticmethod
    def _audit(event: Event) -> None:
        c = event.claim
        gpus = ",".join(c.gpus)
        if isinstance(event, ClaimGranted):
            audit(f"granted {c.id} ({c.mode}) to {c.user or c.uid}: {gpus}",
                  claim=c.id, uid=c.uid, gpu=gpus, event="granted")
        elif isinstance(event, ClaimReleased):
            audit(f"released {c.id} ({event.reason}): {gpus}",
                  claim=c.id, uid=c.uid, gpu=gpus, event="released", reason=event.reason)
        elif isinstance(event, OwnerDied):
            audit(f"owner {c.owner.pid} of {c.id} exited; the claim stays until released",
                  claim=c.id, uid=c.uid, gpu=gpus, event="owner-died")

    async def _blocking(self, fn, *args):
        """Run a blocking call in a thread; give up waiting after ``probe_timeout``."""
        loop = asyncio.get_running_loop()
        return await asyncio.wait_for(loop.run_in_executor(None, fn, *args), self.probe_timeout)

    async def _user_name(self, uid: int) -> str:
        if uid not in self._user_names:
            try:
                entry = await self._blocking(pwd.getpwuid, uid)
                self._user_names[uid] = entry.pw_name
            except (KeyError, asyncio.TimeoutError):
                return str(uid)
        return self._user_names[uid]
