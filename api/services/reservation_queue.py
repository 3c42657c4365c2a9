"""The queue: queued reservations, their positions, and moving reservations earlier.

docs/reservations.md, "The queue". ``enqueue`` puts a create that cannot be placed now in its
pool's line; ``doc_of`` and ``add_positions`` show each queued reservation's position.

``dispatch`` is one pass over a pool's line (``domain/queue.py``): queued reservations are
placed at their earliest start when their quota allows and a node can hold them; placed
reservations that asked for it move to an earlier start. Behind the first queued reservation
that cannot be placed (the head), nothing is placed or moved that would delay it. Each
change is ONE save of the reservation, the bookings it ends or makes and the quota use, with
optimistic concurrency: a concurrent writer makes it fail as a whole, and it is decided again
on fresh state. The queue dispatcher (``api/controllers/queue.py``) runs the passes.

Where and when a request fits first, and the head's shadow, are read-only and live in
api/services/reservation_earliest.py.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from uuid import UUID

from eventsourcing.persistence import IntegrityError

from better_compute.api.services.reservation_base import ReservationCore, unique_aggregates
from better_compute.api.services.reservation_earliest import EarliestStart, length_of, request_of
from better_compute.domain.base import TenantOwned
from better_compute.domain.earliest import Booking, instant, moment
from better_compute.domain.errors import Conflict, QuotaExceeded
from better_compute.domain.ids import parse_id, public_id
from better_compute.domain.placement import PlacementRequest
from better_compute.domain.pool import Pool
from better_compute.domain.queue import Shadow, StartMode, delays_head
from better_compute.domain.reservation import PLACED, Reservation, new_allocation_id
from better_compute.projections.reservations import (
    count_in_state,
    queue_positions,
    waiting_in_pool,
)

RETRIES = 5  # a change decided again after this many concurrent writers gives up (next pass)


@dataclass
class DispatchReport:
    """What one pass did, by reservation id (for logs and tests)."""

    placed: list[str] = field(default_factory=list)
    rescheduled: list[str] = field(default_factory=list)
    head: str | None = None
    undecided: bool = False  # concurrent writers kept it from deciding: look again soon

    @property
    def changed(self) -> bool:
        return bool(self.placed or self.rescheduled)


@dataclass(frozen=True)
class _Outcome:
    """One decision of a pass: placed, moved, blocked, waits, stays, gone or busy."""

    kind: str
    shadow: Shadow | None = None  # after a placement or a move: the head's shadow, updated


class ReservationQueue:
    """The line of each pool and its dispatch, on the earliest start and the shared access."""

    def __init__(self, core: ReservationCore, earliest: EarliestStart) -> None:
        self.max_queued = core.service.limits.max_queued  # 0: no bound
        self.core = core
        self.store = core.store
        self.sql = core.sql
        self.projections = core.projections
        self.earliest = earliest

    # ----------------------------------------------------------------- the line

    def doc_of(self, rsv: Reservation) -> dict[str, Any]:
        """The reservation's document, with its position when it is queued."""
        doc = rsv.to_doc()
        if rsv.queued:
            self.projections.catch_up("reservations")
            position = queue_positions(self.sql, [rsv.pool_id]).get(rsv.public_id)
            doc["queue"] = {**doc.get("queue", {}), "position": position}
        return doc

    def add_positions(self, docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        pools = sorted({d["poolId"] for d in docs if d["state"] == "queued"})
        positions = queue_positions(self.sql, pools)
        for doc in docs:
            if doc["id"] in positions:
                doc["queue"] = {**doc.get("queue", {}), "position": positions[doc["id"]]}
        return docs

    def enqueue(self, *, uuid: UUID, tenant: str, pool: Pool, request: PlacementRequest,
                fields: dict[str, Any], key: str | None, fp: str, created_by: str | None,
                now: datetime, mode: StartMode, refused: Exception, actor: str
                ) -> dict[str, Any]:
        """Queue a create that cannot be placed now; ``refused`` when it never could."""
        limit = pool.quota_for(tenant)
        if limit is not None and request.gpus > limit:
            raise refused  # more than the whole quota: waiting would never end
        full = self._queue_full(tenant, pool.public_id)
        if full is not None:
            existing = self.core.get(Reservation, uuid)  # a retry of one queued before
            if existing is None:
                raise full
            existing.check_retry(fp, "reservation", key)
            return self.doc_of(existing)
        rsv = Reservation.enqueue(
            id=uuid, tenant_id=tenant, pool_id=pool.public_id, gpu_count=request.gpus,
            request=fields, key=key, fingerprint=fp, created_by=created_by, at=now,
            deadline=now + mode.queue_timeout,
        )
        try:
            self.store.save(rsv, actor=actor)
        except IntegrityError:
            existing = self.core.get(Reservation, uuid)
            if existing is None:
                raise
            existing.check_retry(fp, "reservation", key)
            return self.doc_of(existing)
        return self.doc_of(rsv)

    def _queue_full(self, tenant: str, pool_id: str) -> QuotaExceeded | None:
        """The refusal when ``tenant`` has ``max_queued`` reservations queued in the pool.
        Read from the reservations read model as the request finds it (so creates racing
        in other processes may each pass it once: docs/reservations.md)."""
        if not self.max_queued:
            return None
        self.projections.catch_up("reservations")
        queued = count_in_state(self.sql, tenant, pool_id, "queued")
        if queued < self.max_queued:
            return None
        return QuotaExceeded(
            f"tenant {tenant} already has {queued} reservations queued in pool {pool_id} (at "
            f"most {self.max_queued}, reservations.max_queued): wait until some are placed, or "
            "take some out of the queue with `better-compute release --cancel RSV`",
            data={"per": "queued", "queued": queued, "limit": self.max_queued})

    # ---------------------------------------------------------------- dispatch

    def dispatch(self, pool_id: str, now: datetime | None = None, *, actor: str
                 ) -> DispatchReport:
        """One pass over a pool's line, first come first (see the module docstring); what it
        changes is saved as ``actor``."""
        report = DispatchReport()
        now = now or self.core.now()
        self.projections.catch_up("reservations")
        line = [row for row in waiting_in_pool(self.sql, pool_id, instant(now))
                if row["state"] == "queued" or json.loads(row["doc"])["request"].get("moveEarlier")]
        pool = self.core.get(Pool, parse_id("pool", pool_id)) if line else None
        if pool is None:  # nobody waits (placed for a fixed start: it never moves)
            return report
        shadow: Shadow | None = None
        with self.core.pool_lock(pool_id):
            for row in line:
                uuid = UUID(str(row["uuid"]))
                if row["state"] == "queued":
                    outcome = self._retry(self._dequeue, pool, uuid, now, shadow, actor)
                    if outcome.kind == "busy":
                        report.undecided = True
                        break  # nobody behind it goes first; the next pass decides again
                    if outcome.kind == "placed":
                        shadow = outcome.shadow
                        report.placed.append(public_id("rsv", uuid))
                    elif outcome.kind == "blocked" and report.head is None:
                        report.head = public_id("rsv", uuid)
                        rsv = self.core.get(Reservation, uuid)
                        shadow = self.earliest.shadow(pool, rsv, now) if rsv and rsv.queued else None
                else:
                    outcome = self._retry(self._move, pool, uuid, now, shadow, actor)
                    if outcome.kind == "moved":
                        shadow = outcome.shadow
                        report.rescheduled.append(public_id("rsv", uuid))
        return report

    def _retry(self, attempt: Callable[[Pool, UUID, datetime, Shadow | None, str], _Outcome],
               pool: Pool, uuid: UUID, now: datetime, shadow: Shadow | None, actor: str
               ) -> _Outcome:
        for _ in range(RETRIES):
            try:
                return attempt(pool, uuid, now, shadow, actor)
            except IntegrityError:
                continue  # another writer got there first: decide again on fresh state
            except Conflict:
                continue  # the index was behind the bookings: it catches up, decide again
        return _Outcome("busy")

    def _dequeue(self, pool: Pool, uuid: UUID, now: datetime, shadow: Shadow | None,
                 actor: str) -> _Outcome:
        """Place one queued reservation when its quota allows and a node can hold it."""
        rsv = self.core.get(Reservation, uuid)
        if rsv is None or not rsv.queued:
            return _Outcome("gone")
        limit = pool.quota_for(rsv.tenant_id)
        quota = None
        if limit is not None:
            quota = self.core.quota_of(pool.public_id, rsv.tenant_id)
            try:
                quota.take(rsv.public_id, rsv.gpu_count, limit)
            except QuotaExceeded:
                return _Outcome("blocked")
        slot = self.earliest.earliest_slot(pool.public_id, request_of(rsv), length_of(rsv), now)
        if slot is None:
            return _Outcome("blocked")
        placement = slot.placement
        allocation_id = new_allocation_id()
        booking = Booking(allocation_id, frozenset(placement.gpus), slot.start, slot.end,
                          placement.cpus, placement.memory_gib)
        if delays_head(shadow, rsv.tenant_id, placement.node_id, booking, rsv.gpu_count):
            return _Outcome("waits")
        start, end = moment(slot.start), moment(slot.end)
        bookings = self.core.bookings_of(placement.node_id, pool)
        start, end = self.core.book(bookings, placement, allocation_id=allocation_id,
                                    reservation_id=rsv.public_id, holder=rsv.tenant_id,
                                    start=start, end=end)
        rsv.dequeue(at=now, allocation_id=allocation_id, node_id=placement.node_id,
                    gpus=list(placement.gpus), cpus=placement.cpus,
                    memory_gib=placement.memory_gib, start=start, end=end)
        changed: list[TenantOwned] = [rsv, bookings, *([quota] if quota is not None else [])]
        self.store.save(*changed, actor=actor)
        return _Outcome("placed", shadow and shadow.after(rsv.tenant_id, placement.node_id,
                                                          booking, rsv.gpu_count))

    def _move(self, pool: Pool, uuid: UUID, now: datetime, shadow: Shadow | None,
              actor: str) -> _Outcome:
        """Move one placed reservation earlier when it asked to and a slot is free."""
        rsv = self.core.get(Reservation, uuid)
        if rsv is None or rsv.state != PLACED or not rsv.moves_earlier or rsv.start <= now:
            return _Outcome("stays", shadow)
        slot = self.earliest.earliest_slot(pool.public_id, request_of(rsv), length_of(rsv), now,
                                  moving=rsv)
        if slot is None or slot.start >= instant(rsv.start):
            return _Outcome("stays", shadow)
        placement = slot.placement
        allocation_id = new_allocation_id()
        booking = Booking(allocation_id, frozenset(placement.gpus), slot.start, slot.end,
                          placement.cpus, placement.memory_gib)
        if delays_head(shadow, rsv.tenant_id, placement.node_id, booking, 0,
                       releases=rsv.allocation_id):
            return _Outcome("stays", shadow)
        old = self.core.bookings_of(rsv.node_id, pool)
        old.end(rsv.allocation_id, now)
        new = old if placement.node_id == rsv.node_id else self.core.bookings_of(placement.node_id, pool)
        start, _ = self.core.book(new, placement, allocation_id=allocation_id,
                                  reservation_id=rsv.public_id, holder=rsv.tenant_id,
                                  start=moment(slot.start), end=moment(slot.end))
        previous_allocation = rsv.allocation_id
        rsv.reschedule(reason="gpus-freed", allocation_id=allocation_id,
                       node_id=placement.node_id, gpus=list(placement.gpus),
                       cpus=placement.cpus, memory_gib=placement.memory_gib, start=start)
        self.store.save(*unique_aggregates([rsv, old, new]), actor=actor)
        return _Outcome("moved", shadow and shadow.after(rsv.tenant_id, placement.node_id,
                                                         booking, 0, releases=previous_allocation))

    def expire_queued(self, uuid: UUID, now: datetime, *, actor: str) -> bool:
        """End the wait of a queued reservation whose queue timeout has passed."""
        done = {"changed": False}

        def change() -> list[TenantOwned]:
            rsv = self.core.get(Reservation, uuid)
            if rsv is None or not rsv.queued or rsv.queue_deadline > now:
                return []
            done["changed"] = rsv.expire_queue(now)
            return [rsv]

        self.core.retrying(change, actor=actor)
        return done["changed"]

