"""Binding: the start, the node's verified report, failures, re-placement, the end time.

The reservations controller (api/controllers/reservations.py) calls
``begin_binding``, ``bind_failed`` (timeouts) and ``expire``; the gateway's
journal handlers (api/services/reservation_journal.py) call ``bound`` and
``bind_failed`` once the node's signature verified. Each change re-reads the
reservation inside its own save and is retried when another writer got there
first, so a change is recorded once however often it is asked for.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import UUID

from eventsourcing.persistence import IntegrityError

from better_compute.api.services.reservation_base import ReservationCore, unique_aggregates
from better_compute.domain.base import TenantOwned
from better_compute.domain.errors import Conflict, NoCapacity
from better_compute.domain.ids import parse_id
from better_compute.domain.node import Node
from better_compute.domain.placement import PlacementRequest
from better_compute.domain.policy import DEFAULT_RESOURCE, kubernetes_resource
from better_compute.domain.pool import Pool
from better_compute.domain.quota import QuotaUse, quota_uuid
from better_compute.domain.reservation import BINDING, Reservation, new_allocation_id
from better_compute.domain.reservation_rules import cdi_devices, check_bound_devices
from better_compute.domain.selectors import parse_selector
from better_compute.projections.reservations import reservation_of_allocation


class ReservationBinding:

    def __init__(self, core: ReservationCore) -> None:
        self.core = core
        self.store = core.store
        self.sql = core.sql
        self.projections = core.projections
    def expire(self, uuid: UUID, now: datetime, *, actor: str) -> bool:
        """End a live reservation whose end time has come (the controller's timer)."""
        done = {"changed": False}

        def change() -> list[TenantOwned]:
            rsv = self.core.get(Reservation, uuid)
            if rsv is None or not rsv.live or rsv.end > now:
                return []
            rsv.release(rsv.end, reason="expired")
            done["changed"] = True
            return [rsv, *self.core.end_hold(rsv, rsv.end)]

        self.core.retrying(change, actor=actor)
        return done["changed"]

    def begin_binding(self, uuid: UUID, now: datetime, *, actor: str) -> bool:
        """The start came: the node's desired state gains the hold's device assignment."""
        done = {"changed": False}

        def change() -> list[TenantOwned]:
            rsv = self.core.get(Reservation, uuid)
            if rsv is None or rsv.state != "placed" or rsv.start > now:
                return []
            done["changed"] = True
            return [rsv, *self.bind_at_create(rsv, now)]

        self.core.retrying(change, actor=actor)
        return done["changed"]

    def bind_at_create(self, rsv: Reservation, now: datetime) -> list[TenantOwned]:
        """A reservation that starts now binds in its create's own save: ``reservation.binding``
        and the node's device assignment are recorded with ``reservation.placed``, so no
        timers' pass loads and saves it again (``begin_binding`` binds the same way). Returns
        the node to save with it (none when it starts later: the timers bind it then)."""
        if rsv.start > now:
            return []
        rsv.begin_binding(now)
        node = self.core.to_save(Node, parse_id("node", rsv.node_id))
        if node is not None and node.assign_devices(rsv.assignment(), now):
            return [node]
        return []

    def begin_bindings(self, uuids: list[UUID], now: datetime, *, actor: str) -> list[UUID]:
        """``begin_binding`` for many reservations in ONE save (the timers' pass under a
        stream of creates); on a conflict each one again on its own. Returns those bound."""
        rsvs: list[Reservation] = []
        nodes: dict[str, Node] = {}
        for uuid in uuids:
            rsv = self.core.get(Reservation, uuid)
            if rsv is None or rsv.state != "placed" or rsv.start > now:
                continue
            rsv.begin_binding(now)
            rsvs.append(rsv)
            node = nodes.get(rsv.node_id) or self.core.get(Node, parse_id("node", rsv.node_id))
            if node is not None:
                nodes[rsv.node_id] = node
                node.assign_devices(rsv.assignment(), now)
        if not rsvs:
            return []
        try:
            self.store.save(*rsvs, *nodes.values(), actor=actor)
        except IntegrityError:
            return [rsv.id for rsv in rsvs if self.begin_binding(rsv.id, now, actor=actor)]
        return [rsv.id for rsv in rsvs]

    def bound(self, node_id: str, entry: dict[str, Any], *, actor: str) -> bool:
        """A verified ``allocation.bound`` from ``node_id``: the reservation becomes active.

        The hold must be exactly what was booked: the same node and the CDI
        device names of exactly the booked GPU UUIDs; anything else is refused.
        """
        allocation_id = str(entry.get("allocationId") or "")
        done = {"changed": False}

        def change() -> list[TenantOwned]:
            rsv = self._by_allocation(allocation_id)
            if rsv is None or rsv.node_id != node_id or rsv.state != BINDING:
                return []
            check_bound_devices(node_id, allocation_id, rsv.public_id, rsv.gpus,
                                entry.get("cdiDevices") or [])
            binding: dict[str, Any] = {
                "nodeId": node_id, "cdiDevices": cdi_devices(rsv.gpus),
                "envFile": str(entry.get("envFile") or ""),
                "cgroupParent": str(entry.get("cgroupParent") or "")}
            if rsv.kubernetes:
                binding["kubernetes"] = self._kubelet_view(rsv)
            if not rsv.bound(allocation_id, binding, self.core.now()):
                return []
            done["changed"] = True
            return [rsv]

        self.core.retrying(change, actor=actor)
        return done["changed"]

    def bind_failed(self, node_id: str | None, allocation_id: str, reason: str, message: str,
                    now: datetime, *, actor: str) -> bool:
        """A hold failed on its node (or timed out): place again at most twice, then fail."""
        done = {"changed": False}

        def change() -> list[TenantOwned]:
            rsv = self._by_allocation(allocation_id)
            if rsv is None or rsv.state != BINDING:
                return []
            if node_id is not None and rsv.node_id != node_id:
                return []
            done["changed"] = True
            ended = self.core.end_hold(rsv, now, refund=False)
            if rsv.can_replace:
                replaced = self._replace(rsv, reason, message, now)
                if replaced is not None:
                    return unique_aggregates([rsv, *ended, *replaced])
            rsv.fail(reason, f"{message} (after {rsv.attempt} placement"
                     f"{'s' if rsv.attempt != 1 else ''})", now)
            quota = self.core.get(QuotaUse, quota_uuid(rsv.pool_id, rsv.tenant_id))
            extra = [quota] if quota is not None and quota.refund(rsv.public_id) else []
            return unique_aggregates([rsv, *ended, *extra])

        self.core.retrying(change, actor=actor)
        return done["changed"]

    def _replace(self, rsv: Reservation, reason: str, message: str, now: datetime
                 ) -> list[TenantOwned] | None:
        pool = self.core.get(Pool, parse_id("pool", rsv.pool_id))
        if pool is None:
            return None
        tried = frozenset({rsv.node_id, *(h["nodeId"] for h in rsv.history)})
        req = rsv.request
        request = PlacementRequest(
            gpus=rsv.gpu_count, model=req.get("model"), product=req.get("product"),
            selector=parse_selector(req["selector"]) if req.get("selector") else None,
            nvlink=bool(req.get("nvlink")), exclude_nodes=tried,
        )
        begin = max(rsv.start, now)
        try:
            placement = self.core.choose(pool.public_id, request, begin, rsv.end)
        except NoCapacity:
            return None
        bookings = self.core.bookings_of(placement.node_id, pool)
        freed = bookings.free_from(list(placement.gpus))  # the end stays the reservation's
        begin = max(begin, freed) if freed is not None else begin
        if begin >= rsv.end:
            return None
        allocation_id = new_allocation_id()
        try:
            self.core.book(bookings, placement, allocation_id=allocation_id,
                       reservation_id=rsv.public_id, holder=rsv.tenant_id, start=begin,
                       end=rsv.end)
        except Conflict:
            return None
        rsv.replace(reason=reason, message=message, allocation_id=allocation_id,
                    node_id=placement.node_id, gpus=list(placement.gpus), cpus=placement.cpus,
                    memory_gib=placement.memory_gib)
        return [bookings]

    def _kubelet_view(self, rsv: Reservation) -> dict[str, Any]:
        """What the kubelet sees of a kubernetes hold: the pool's resource, the GPU UUIDs."""
        pool = self.core.get(Pool, parse_id("pool", rsv.pool_id))
        resource = kubernetes_resource(pool.policy) if pool is not None else None
        return {"resourceName": resource or DEFAULT_RESOURCE, "deviceIds": list(rsv.gpus)}

    def _by_allocation(self, allocation_id: str) -> Reservation | None:
        if not allocation_id.startswith("alloc_"):
            return None
        self.projections.catch_up("reservations")
        uuid = reservation_of_allocation(self.sql, allocation_id)
        if uuid is None:
            return None
        rsv = self.core.get(Reservation, UUID(uuid))
        if rsv is None or rsv.allocation_id != allocation_id:
            return None
        return rsv
