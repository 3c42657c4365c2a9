"""Reservations: GPUs of one pool booked by a tenant for a time interval.

States (docs/reservations.md)::

    placed ──► binding ──► active ──► released
      │  ▲        │
      │  └────────┤ (the node failed the hold or did not report: placed again,
      │           │  at most twice: MAX_PLACEMENTS placements in all)
      │           └──► failed
      └──► cancelled   (withdrawn before its start)

``placed``: the placer booked GPUs on a node. ``binding``: the start came and
the node's desired state carries the device assignment; the node must report
within BIND_TIMEOUT. ``active``: the node journalled a verified
AllocationBound. ``released``: the bookings ended (release, or the end time
came). Each placement has its own allocation id (``alloc_…``, no dashes: it
goes into slice names).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from eventsourcing.domain import event

from better_compute.domain.base import TenantOwned, iso
from better_compute.domain.errors import Conflict
from better_compute.domain.ids import NAMESPACE, keyed_or_new, new_uuid, public_id

PLACED = "placed"
BINDING = "binding"
ACTIVE = "active"
RELEASED = "released"
CANCELLED = "cancelled"
FAILED = "failed"
LIVE_STATES = (PLACED, BINDING, ACTIVE)
STATES = (PLACED, BINDING, ACTIVE, RELEASED, CANCELLED, FAILED)

MAX_PLACEMENTS = 3  # the first placement and at most two re-placements
BIND_TIMEOUT = timedelta(minutes=5)
BIND_FAILURE_REASONS = ("overlap", "device-missing", "resources-exhausted", "timeout")


def new_allocation_id() -> str:
    return public_id("alloc", new_uuid())


def reservation_uuid(tenant_id: str, key: str | None, namespace: UUID = NAMESPACE) -> UUID:
    return keyed_or_new(tenant_id, "reservation", key, namespace)


class Reservation(TenantOwned):
    PREFIX = "rsv"
    TOPIC = "bc.aggregate.reservation"

    class Event(TenantOwned.Event):
        TOPIC = "bc.reservation.event"

    @event("Placed", topic="reservation.placed")
    def __init__(
        self, id: UUID, tenant_id: str, pool_id: str, gpu_count: int, request: dict[str, Any],
        start: datetime, end: datetime, key: str | None, fingerprint: str | None,
        created_by: str | None, allocation_id: str, node_id: str, gpus: list[str],
        cpus: int, memory_gib: int,
    ) -> None:
        self.tenant_id = tenant_id
        self.pool_id = pool_id
        self.gpu_count = gpu_count
        self.request = request
        self.start = start
        self.end = end
        self.key = key
        self.fingerprint = fingerprint
        self.created_by = created_by
        self.allocation_id = allocation_id
        self.node_id = node_id
        self.gpus = gpus
        self.cpus = cpus
        self.memory_gib = memory_gib
        self.state = PLACED
        self.attempt = 1
        self.binding: dict[str, Any] | None = None
        self.bind_deadline: datetime | None = None
        self.ended_at: datetime | None = None
        self.failure: dict[str, Any] | None = None
        self.history: list[dict[str, Any]] = []

    # ------------------------------------------------------------- queries

    @property
    def live(self) -> bool:
        return self.state in LIVE_STATES

    def started(self, now: datetime) -> bool:
        return self.state in (BINDING, ACTIVE) or (self.state == PLACED and self.start <= now)

    @property
    def can_replace(self) -> bool:
        return self.attempt < MAX_PLACEMENTS

    @property
    def kubernetes(self) -> bool:
        """Asked with ``--kubernetes``: bcd's device plugin hands the hold to the kubelet."""
        return bool(self.request.get("kubernetes"))

    def assignment(self) -> dict[str, Any]:
        """The device assignment the node's desired state carries for this hold."""
        out = {"allocationId": self.allocation_id, "reservationId": self.public_id,
               "gpus": list(self.gpus), "cpus": self.cpus, "memoryGiB": self.memory_gib}
        return out | ({"kubernetes": True} if self.kubernetes else {})

    # ------------------------------------------------------------ commands

    def begin_binding(self, now: datetime) -> None:
        if self.state != PLACED:
            raise Conflict(f"reservation {self.public_id} is {self.state}, not placed")
        self._binding(node_id=self.node_id, allocation_id=self.allocation_id,
                      deadline=now + BIND_TIMEOUT)

    @event("Binding", topic="reservation.binding")
    def _binding(self, node_id: str, allocation_id: str, deadline: datetime) -> None:
        self.state = BINDING
        self.bind_deadline = deadline

    def bound(self, allocation_id: str, binding: dict[str, Any], at: datetime | None = None
              ) -> bool:
        """The node verified the hold (at ``at``); False when it is about an older allocation."""
        if allocation_id != self.allocation_id or self.state != BINDING:
            return False
        self._active(allocation_id=allocation_id, binding=binding, at=at)
        return True

    @event("Active", topic="reservation.active")
    def _active(self, allocation_id: str, binding: dict[str, Any],
                at: datetime | None = None) -> None:  # at: None in events before it existed
        self.state = ACTIVE
        self.binding = dict(binding)
        self.bind_deadline = None

    def replace(self, *, reason: str, message: str, allocation_id: str, node_id: str,
                gpus: list[str], cpus: int, memory_gib: int) -> None:
        """Place again after a failed hold (at most MAX_PLACEMENTS placements in all)."""
        if not self.can_replace:
            raise Conflict(f"reservation {self.public_id} was already placed {self.attempt} times")
        self._replaced(reason=reason, message=message, previous_allocation_id=self.allocation_id,
                       previous_node_id=self.node_id, allocation_id=allocation_id,
                       node_id=node_id, gpus=list(gpus), cpus=cpus, memory_gib=memory_gib,
                       attempt=self.attempt + 1)

    @event("Replaced", topic="reservation.replaced")
    def _replaced(self, reason: str, message: str, previous_allocation_id: str,
                  previous_node_id: str, allocation_id: str, node_id: str, gpus: list[str],
                  cpus: int, memory_gib: int, attempt: int) -> None:
        self.history = [*self.history, {"allocationId": previous_allocation_id,
                                        "nodeId": previous_node_id, "reason": reason,
                                        "message": message}]
        self.allocation_id = allocation_id
        self.node_id = node_id
        self.gpus = gpus
        self.cpus = cpus
        self.memory_gib = memory_gib
        self.attempt = attempt
        self.state = PLACED
        self.bind_deadline = None

    def fail(self, reason: str, message: str, at: datetime) -> None:
        if not self.live:
            return
        self._failed(reason=reason, message=message, at=at)

    @event("Failed", topic="reservation.failed")
    def _failed(self, reason: str, message: str, at: datetime) -> None:
        self.state = FAILED
        self.failure = {"reason": reason, "message": message}
        self.ended_at = at
        self.bind_deadline = None

    def extend(self, end: datetime) -> None:
        if not self.live:
            raise Conflict(
                f"reservation {self.public_id} is {self.state}: only a placed, binding or active "
                "reservation can be extended; reserve again instead"
            )
        self._extended(end=end, previous_end=self.end)

    @event("Extended", topic="reservation.extended")
    def _extended(self, end: datetime, previous_end: datetime) -> None:
        self.end = end

    def release(self, at: datetime, reason: str) -> bool:
        """End the reservation at ``at``; False when it had already ended."""
        if not self.live:
            return False
        self._released(at=at, reason=reason, allocation_id=self.allocation_id,
                       node_id=self.node_id)
        return True

    @event("Released", topic="reservation.released")
    def _released(self, at: datetime, reason: str, allocation_id: str, node_id: str) -> None:
        self.state = RELEASED
        self.ended_at = at
        self.bind_deadline = None

    def cancel(self, now: datetime) -> None:
        """Withdraw a reservation that has not started; Conflict once it has."""
        if self.state == CANCELLED:
            return
        if self.started(now) or not self.live:
            raise Conflict(
                f"reservation {self.public_id} is {self.state} and "
                f"{'started at ' + (iso(self.start) or '') if self.started(now) else 'over'}: "
                "--cancel only withdraws a reservation before its start; end it with "
                f"`better-compute release {self.public_id}`"
            )
        self._cancelled(at=now, allocation_id=self.allocation_id, node_id=self.node_id)

    @event("Cancelled", topic="reservation.cancelled")
    def _cancelled(self, at: datetime, allocation_id: str, node_id: str) -> None:
        self.state = CANCELLED
        self.ended_at = at

    def to_doc(self) -> dict[str, Any]:
        return {
            "id": self.public_id,
            "tenantId": self.tenant_id,
            "poolId": self.pool_id,
            "state": self.state,
            "gpuCount": self.gpu_count,
            "request": dict(self.request),
            "kubernetes": self.kubernetes,
            "start": iso(self.start),
            "end": iso(self.end),
            "key": self.key,
            "allocationId": self.allocation_id,
            "nodeId": self.node_id,
            "gpus": list(self.gpus),
            "hostResources": {"cpus": self.cpus, "memoryGiB": self.memory_gib},
            "attempt": self.attempt,
            "binding": dict(self.binding) if self.binding else None,
            "bindDeadline": iso(self.bind_deadline),
            "endedAt": iso(self.ended_at),
            "failure": dict(self.failure) if self.failure else None,
            "previousPlacements": [dict(h) for h in self.history],
            "createdAt": iso(self.created_on),
        }
