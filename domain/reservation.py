"""Reservations: GPUs of one pool booked by a tenant for a time interval.

States (docs/reservations.md)::

    placed ──► binding ──► active ──► released
      │  ▲        │
      │  └────────┤ (the node failed the hold or did not report: placed again,
      │           │  at most twice: MAX_PLACEMENTS placements in all)
      │           └──► failed
      └──► cancelled   (withdrawn before its start)

    queued ──► placed (``reservation.dequeued``) ──► …   (reserve --queue, docs/reservations.md)
      ├──► cancelled   (release --cancel leaves the queue)
      └──► expired     (its queue timeout passed)

``placed``: the placer booked GPUs on a node. ``binding``: the start came and
the node's desired state carries the device assignment; the node must report
within BIND_TIMEOUT. ``active``: the node journalled a verified
AllocationBound. ``released``: the bookings ended (release, or the end time
came). Each placement has its own allocation id (``alloc_…``, no dashes: it
goes into slice names).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any
from uuid import UUID

from eventsourcing.domain import Aggregate, event

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
QUEUED = "queued"
EXPIRED = "expired"
STATES = (PLACED, BINDING, ACTIVE, RELEASED, CANCELLED, FAILED, QUEUED, EXPIRED)

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
    # Every event gives an attribute a new value, never changes one in place: the aggregate
    # cache hands out shallow copies (api/store/aggregate_cache.py, COPY_ON_WRITE).
    COPY_ON_WRITE = True

    class Event(TenantOwned.Event):
        TOPIC = "bc.reservation.event"

    if TYPE_CHECKING:  # set when a reservation is queued (not dataclass fields of __init__)
        queued_at: datetime
        queue_deadline: datetime

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
        if self.state == QUEUED:  # it leaves the queue; it held nothing
            self._cancelled(at=now, allocation_id="", node_id="")
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
            "allocationId": self.allocation_id or None,
            "nodeId": self.node_id or None,
            "gpus": list(self.gpus),
            "hostResources": {"cpus": self.cpus, "memoryGiB": self.memory_gib},
            "attempt": self.attempt,
            "binding": dict(self.binding) if self.binding else None,
            "bindDeadline": iso(self.bind_deadline),
            "endedAt": iso(self.ended_at),
            "failure": dict(self.failure) if self.failure else None,
            "previousPlacements": [dict(h) for h in self.history],
            "createdAt": iso(self.created_on),
            **self._queue_doc(),
        }

    # ------------------------------------------------------------------ the queue
    # (reserve --queue, --start earliest and --move-earlier: docs/reservations.md)

    class Queued(Aggregate.Created):
        """``reservation.queued``: created waiting for GPUs or quota, holding nothing."""

        TOPIC = "reservation.queued"
        pool_id: str
        gpu_count: int
        request: dict[str, Any]
        key: str | None
        fingerprint: str | None
        created_by: str | None
        at: datetime
        deadline: datetime

        def mutate(self, aggregate: Any) -> Any:
            rsv = Reservation.__new__(Reservation)
            rsv.__base_init__(originator_id=self.originator_id,
                              originator_version=self.originator_version,
                              timestamp=self.timestamp)
            rsv.__init__(  # type: ignore[misc]  # the state a placed one starts with, unplaced
                id=self.originator_id, tenant_id=self.tenant_id,  # type: ignore[attr-defined]
                pool_id=self.pool_id, gpu_count=self.gpu_count, request=self.request,
                start=None, end=None, key=self.key, fingerprint=self.fingerprint,
                created_by=self.created_by, allocation_id="", node_id="", gpus=[], cpus=0,
                memory_gib=0,
            )
            rsv.state = QUEUED
            rsv.attempt = 0
            rsv.queued_at = self.at
            rsv.queue_deadline = self.deadline
            return rsv

    @classmethod
    def enqueue(cls, *, id: UUID, tenant_id: str, pool_id: str, gpu_count: int,
                request: dict[str, Any], key: str | None, fingerprint: str | None,
                created_by: str | None, at: datetime, deadline: datetime) -> Reservation:
        """A reservation that waits in its pool's queue until it can be placed."""
        return cls._create(cls.Queued, id=id, tenant_id=tenant_id, pool_id=pool_id,
                           gpu_count=gpu_count, request=request, key=key,
                           fingerprint=fingerprint, created_by=created_by, at=at,
                           deadline=deadline)

    @property
    def queued(self) -> bool:
        return self.state == QUEUED

    @property
    def moves_earlier(self) -> bool:
        """Placed for a later start, and asked to be moved earlier when GPUs free up."""
        return bool(self.request.get("moveEarlier"))

    def dequeue(self, *, at: datetime, allocation_id: str, node_id: str, gpus: list[str],
                cpus: int, memory_gib: int, start: datetime, end: datetime) -> None:
        """Leave the queue placed: booked on ``node_id`` for [start, end)."""
        if self.state != QUEUED:
            raise Conflict(f"reservation {self.public_id} is {self.state}, not queued")
        self._dequeued(at=at, queued_at=getattr(self, "queued_at", at),
                       allocation_id=allocation_id, node_id=node_id, gpus=list(gpus), cpus=cpus,
                       memory_gib=memory_gib, start=start, end=end)

    @event("Dequeued", topic="reservation.dequeued")
    def _dequeued(self, at: datetime, queued_at: datetime, allocation_id: str, node_id: str,
                  gpus: list[str], cpus: int, memory_gib: int, start: datetime, end: datetime
                  ) -> None:
        self.state = PLACED
        self.attempt = 1
        self.allocation_id = allocation_id
        self.node_id = node_id
        self.gpus = gpus
        self.cpus = cpus
        self.memory_gib = memory_gib
        self.start = start
        self.end = end
        self.dequeued_at = at

    def expire_queue(self, at: datetime) -> bool:
        """The queue timeout passed while still queued; False when it is not queued."""
        if self.state != QUEUED:
            return False
        self._queue_expired(at=at, deadline=self.queue_deadline)
        return True

    @event("QueueExpired", topic="reservation.expired")
    def _queue_expired(self, at: datetime, deadline: datetime) -> None:
        self.state = EXPIRED
        self.ended_at = at

    def reschedule(self, *, reason: str, allocation_id: str, node_id: str, gpus: list[str],
                   cpus: int, memory_gib: int, start: datetime) -> None:
        """Move a placed reservation that has not started to an earlier start."""
        if self.state != PLACED or start >= self.start:
            raise Conflict(f"reservation {self.public_id} can only move to an earlier start "
                           f"while placed (it is {self.state}, starting at {iso(self.start)})")
        self._rescheduled(
            reason=reason, previous_start=self.start, previous_end=self.end,
            previous_allocation_id=self.allocation_id, previous_node_id=self.node_id,
            start=start, end=start + (self.end - self.start), allocation_id=allocation_id,
            node_id=node_id, gpus=list(gpus), cpus=cpus, memory_gib=memory_gib,
        )

    @event("Rescheduled", topic="reservation.rescheduled")
    def _rescheduled(self, reason: str, previous_start: datetime, previous_end: datetime,
                     previous_allocation_id: str, previous_node_id: str, start: datetime,
                     end: datetime, allocation_id: str, node_id: str, gpus: list[str], cpus: int,
                     memory_gib: int) -> None:
        self.start = start
        self.end = end
        self.allocation_id = allocation_id
        self.node_id = node_id
        self.gpus = gpus
        self.cpus = cpus
        self.memory_gib = memory_gib
        self.moves = getattr(self, "moves", 0) + 1

    def _queue_doc(self) -> dict[str, Any]:
        queued_at = getattr(self, "queued_at", None)
        if queued_at is None:
            return {}
        return {"queue": {"queuedAt": iso(queued_at),
                          "deadline": iso(self.queue_deadline),
                          "dequeuedAt": iso(getattr(self, "dequeued_at", None))}}
