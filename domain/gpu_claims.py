"""GPU claims: a GPU UUID belongs to at most one node in the whole store.

One ``GpuClaim`` aggregate per GPU UUID (its id is derived from the UUID), so the store's own
optimistic concurrency makes the rule hold everywhere at once: adopting a node, or accepting
a node's changed inventory, saves the node together with a claim on each of its GPUs in ONE
atomic write. Two nodes that claim one UUID at the same moment save the same claim version
(or both create it): one save is refused, and the retry finds the GPU taken
(docs/nodes.md, "What a node may change").

A claim is released when its node is removed or an operator's ``nodes.acceptInventory`` takes
the GPU off it; the same GPU may then be claimed by another node (a card moved between
servers).

Events (internal, owned by the claiming node's tenant): ``gpu.recorded`` (the UUID first
seen), ``gpu.claimed``, ``gpu.released``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import UUID

from eventsourcing.domain import event

from better_compute.domain.base import TenantOwned
from better_compute.domain.errors import Conflict
from better_compute.domain.ids import named_uuid


def gpu_claim_uuid(gpu_uuid: str) -> UUID:
    return named_uuid("gpu-claim", gpu_uuid)


class GpuClaim(TenantOwned):
    PREFIX = "gpu"  # internal: its events' subject is the word gpu; data names the UUID
    TOPIC = "bc.aggregate.gpuclaim"
    COPY_ON_WRITE = True  # events assign, never change values in place

    class Event(TenantOwned.Event):
        TOPIC = "bc.gpuclaim.event"

    @staticmethod
    def create_id(uuid: str, **_: Any) -> UUID:
        return gpu_claim_uuid(uuid)

    @event("Recorded", topic="gpu.recorded")
    def __init__(self, tenant_id: str, uuid: str) -> None:
        self.tenant_id = tenant_id
        self.uuid = uuid
        self.node_id: str | None = None

    def held_by_another(self, node_id: str) -> str | None:
        """The node that holds this GPU when it is not ``node_id`` (None: free or its own)."""
        return self.node_id if self.node_id not in (None, node_id) else None

    def claim(self, node_id: str, tenant_id: str, at: datetime) -> bool:
        """``node_id`` takes the GPU; False when it already holds it. Conflict when another
        node holds it (checked by the caller first, to say which)."""
        if self.node_id == node_id:
            return False
        if self.node_id is not None:
            raise Conflict(f"GPU {self.uuid} belongs to node {self.node_id}: a GPU belongs to "
                           "one node")
        self._claimed(uuid=self.uuid, node_id=node_id, tenant_id=tenant_id, at=at)
        return True

    @event("Claimed", topic="gpu.claimed")
    def _claimed(self, uuid: str, node_id: str, tenant_id: str, at: datetime) -> None:
        self.node_id = node_id
        self.tenant_id = tenant_id  # a card moved to a node of another tenant: its events go there

    def release(self, node_id: str, at: datetime, reason: str) -> bool:
        """``node_id`` lets the GPU go (removed, or its inventory changed); False when it did
        not hold it."""
        if self.node_id != node_id:
            return False
        self._released(uuid=self.uuid, node_id=node_id, at=at, reason=reason)
        return True

    @event("Released", topic="gpu.released")
    def _released(self, uuid: str, node_id: str, at: datetime, reason: str) -> None:
        self.node_id = None

    def to_doc(self) -> dict[str, Any]:
        return {"uuid": self.uuid, "nodeId": self.node_id, "tenantId": self.tenant_id}
