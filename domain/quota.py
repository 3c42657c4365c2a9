"""Quota use: how many GPUs one tenant holds on one pool.

One ``QuotaUse`` aggregate per (pool, tenant) that is not the pool's owner
(the owner's quota is effectively unlimited, so nothing needs counting). A
reservation takes its GPUs from it in the same atomic write that books them;
two racing reservations of one tenant save the same version and the loser
places again, so an offered tenant's ``gpu`` quota is never exceeded. A
reservation counts from the moment it is placed (also before it starts) until
it is released, cancelled, failed or ends; then its GPUs are refunded.

Events: ``quota.opened``, ``quota.taken``, ``quota.refunded`` (the tenant's own).
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from eventsourcing.domain import event

from better_compute.domain.base import TenantOwned
from better_compute.domain.errors import QuotaExceeded
from better_compute.domain.ids import named_uuid


def quota_uuid(pool_id: str, tenant_id: str) -> UUID:
    return named_uuid("quota-use", f"{pool_id}\x00{tenant_id}")


class QuotaUse(TenantOwned):
    PREFIX = "quota"
    TOPIC = "bc.aggregate.quota"
    # Every event gives ``held`` a new dict, never changes it in place: the aggregate cache
    # hands out shallow copies (api/store/aggregate_cache.py), not one pickled copy of every
    # live reservation of the tenant per load.
    COPY_ON_WRITE = True

    class Event(TenantOwned.Event):
        TOPIC = "bc.quota.event"

    @staticmethod
    def create_id(tenant_id: str, pool_id: str, **_: Any) -> UUID:
        return quota_uuid(pool_id, tenant_id)

    @event("Opened", topic="quota.opened")
    def __init__(self, tenant_id: str, pool_id: str) -> None:
        self.tenant_id = tenant_id
        self.pool_id = pool_id
        self.held: dict[str, int] = {}

    @property
    def in_use(self) -> int:
        return sum(self.held.values())

    def take(self, reservation_id: str, gpus: int, limit: int | None) -> None:
        """Count ``gpus`` for a reservation; QuotaExceeded when it would pass ``limit``."""
        if reservation_id in self.held:
            return
        if limit is not None and self.in_use + gpus > limit:
            available = max(0, limit - self.in_use)
            raise QuotaExceeded(
                f"quota exceeded on pool {self.pool_id}: tenant {self.tenant_id} has a gpu quota "
                f"of {limit}, holds {self.in_use} and asked for {gpus}; {available} "
                f"{'is' if available == 1 else 'are'} available now. Release a reservation "
                "(`better-compute reservations list`) or ask the pool's owner for a larger quota",
                data={"quota": limit, "inUse": self.in_use, "requested": gpus,
                      "available": available},
            )
        self._taken(reservation_id=reservation_id, gpus=gpus)

    @event("Taken", topic="quota.taken")
    def _taken(self, reservation_id: str, gpus: int) -> None:
        self.held = {**self.held, reservation_id: gpus}

    def refund(self, reservation_id: str) -> bool:
        if reservation_id not in self.held:
            return False
        self._refunded(reservation_id=reservation_id, gpus=self.held[reservation_id])
        return True

    @event("Refunded", topic="quota.refunded")
    def _refunded(self, reservation_id: str, gpus: int) -> None:
        self.held = {k: v for k, v in self.held.items() if k != reservation_id}

    def to_doc(self) -> dict[str, Any]:
        return {"poolId": self.pool_id, "tenantId": self.tenant_id, "inUse": self.in_use,
                "reservations": dict(self.held)}
