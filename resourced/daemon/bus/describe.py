"""What the bus shows of the state: ``Describe``'s JSON and a claim's grant (a{sv}).

Read-only views of the engine, kept apart from the Manager's methods and signals.  Each
claim's JSON is kept from one ``Describe`` to the next until an event changes the claim
(``changed``): with 10,000 claims, building and encoding every record each time was
most of the cost of a Describe.
"""

import json

from resourced import __version__
from resourced.core.claims import Claim
from resourced.core.inventory import pci_order
from resourced.protocol.names import JSON_SCHEMA
from resourced.protocol.records import GRANT

from .options import wire_record

LIMITS = ("max_claims_per_user", "max_waiting_per_user", "max_gpus_per_user",
          "max_claims_per_session", "max_gpus_per_session", "max_bookings_per_user",
          "max_booked_gpu_hours_per_user", "max_booked_gpu_hours_per_session",
          "longest_booking", "booking_horizon", "warn_before", "no_show_after", "idle_after")
"""The configured limits every user is under, root too (``exempt_users`` are spared the
per-user ones, never a session's; 0 = no limit)."""


class StateView:
    def __init__(self, engine, mode: str, health):
        self.engine = engine
        self.mode = mode
        self.health = health
        self.pci_index: dict[str, int] = pci_order(engine.present)
        self._texts: dict[str, str] = {}  # claim id -> its JSON, until it changes

    def changed(self, claim_id: str) -> None:
        """An event touched the claim: its JSON is built again when next asked for."""
        self._texts.pop(claim_id, None)

    def describe(self) -> str:
        """Everything ``gpuctl status --json`` shows, as JSON text (``Describe``), exactly
        as ``json.dumps(..., sort_keys=True)`` writes it: gpuctl passes it on as it is."""
        rest = self._all_but_claims()
        before = json.dumps({k: v for k, v in rest.items() if k < "claims"}, sort_keys=True)
        after = json.dumps({k: v for k, v in rest.items() if k > "claims"}, sort_keys=True)
        claims = ", ".join(self._claim_json(c) for c in self.engine.ledger.claims.values())
        return f'{before[:-1]}, "claims": [{claims}], {after[1:]}'

    def _all_but_claims(self) -> dict:
        ledger = self.engine.ledger
        return {
            "schema": JSON_SCHEMA,
            "version": __version__,
            "mode": self.mode,
            "backend": self.engine.backend.name,
            "backend_note": self.engine.backend_note,
            "free": self.engine.tracker.free_count(),
            "gpus": [
                {
                    "index": g.index,
                    "alias": g.label,
                    "uuid": g.uuid,
                    "name": g.name,
                    "memory_bytes": g.memory_bytes,
                    "pci_bus_id": g.pci_bus_id,
                    "state": self.engine.tracker.gpu_state(g),
                    "claim": holder.id if (holder := ledger.holder(g.uuid)) else "",
                    "shared_by": [c.id for c in ledger.claims_on(g.uuid) if c.shared],
                    "vram_used_bytes": ledger.vram_used(g.uuid),
                    "slurm": g.uuid in ledger.slurm,  # Slurm schedules it ([slurm] gpus)
                }
                for g in ledger.gpus.values()
            ],
            "queue": [c.id for c in list(ledger.waiting)],
            "pools": [
                {"name": p.name, "unit": p.unit, "capacity": p.capacity,
                 "free": ledger.pool_free(p.name)}
                for p in ledger.pools.values()
            ],
            "health": self.health.describe(),
            "notices": [{"id": n.id, "text": n.text, "created_usec": n.created_usec,
                         "until_usec": n.until_usec} for n in self.engine.bookings.notices()],
            "bookings_scheduled": sum(1 for b in self.engine.calendar.bookings.values()
                                      if b.state == "scheduled"),
            "limits": {key: getattr(self.engine.settings, key) for key in LIMITS},
        }

    def _claim_json(self, c: Claim) -> str:
        text = self._texts.get(c.id)
        if text is None:
            text = self._texts[c.id] = json.dumps(self._claim_record(c), sort_keys=True)
        return text

    def _claim_record(self, c: Claim) -> dict:
        gpus = self.engine.ledger.gpus
        return {
            "id": c.id,
            "mode": c.mode,
            "state": c.state,
            "priority": c.priority,
            "reclaimable": c.reclaimable,
            "reclaim_requested": bool(c.reclaim_for),
            "vram_bytes": c.demand.vram,
            "pools": dict(c.demand.pools),
            "gpus_requested": c.demand.gpus,
            "user": c.user,
            "uid": c.uid,
            "owner_pid": c.owner.pid,
            "owner_alive": c.owner_alive,
            "label": c.label,
            "task_name": c.task_name,
            "session": c.session,
            "isolated": c.isolated,
            "created_usec": c.created_usec,
            "until_usec": c.until_usec,
            "until_booking": c.until_booking,
            "gpus": [gpus[u].label for u in c.gpus],
            "gpu_uuids": list(c.gpus),
            "gpu_indices": [gpus[u].index for u in c.gpus],
            "pci_indices": [self.pci_index[u] for u in c.gpus],
        }

    def grant(self, claim: Claim, warnings: list[str] = (), dry_run: bool = False) -> dict:
        """What ``Claim`` and ``GetGrant`` answer for a claim, as a{sv} (``DryRun``: what a
        claim would be, not made)."""
        gpus = self.engine.ledger.gpus
        return wire_record(GRANT, {
            **({"dry_run": True} if dry_run else {}),
            "state": claim.state,
            "mode": claim.mode,
            "gpu_uuids": list(claim.gpus),
            "gpu_indices": [gpus[u].index for u in claim.gpus],
            "pci_indices": [self.pci_index[u] for u in claim.gpus],
            "gpu_memory_bytes": [gpus[u].memory_bytes for u in claim.gpus],
            "vram_bytes": claim.demand.vram,
            "pools": dict(claim.demand.pools),
            "warnings": list(warnings),
            "until_usec": claim.until_usec,
            "until_booking": claim.until_booking,
            "session": claim.session,
            "isolated": claim.isolated,
        })
