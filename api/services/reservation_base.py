"""What the reservation commands share: loading aggregates, placing, booking, ending holds.

Time is "database time" (``now()``, api/services/unit.py): on PostgreSQL the server's
``now()``, so every replica books on one clock; on SQLite the process clock.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from datetime import datetime
from typing import Any, TypeVar
from uuid import UUID

from better_compute.api.services.compute import ComputeService
from better_compute.domain.base import TenantOwned, iso
from better_compute.domain.bookings import NodeBookings, bookings_uuid
from better_compute.domain.errors import NoCapacity, NotFound
from better_compute.domain.ids import parse_id
from better_compute.domain.node import Node
from better_compute.domain.placement import NodePartition, Placement, PlacementRequest, place
from better_compute.domain.pool import Pool
from better_compute.domain.quota import QuotaUse, quota_uuid
from better_compute.domain.reservation import Reservation
from better_compute.projections.capacity import read_capacity
from better_compute.projections.free_gpus import (
    FAST_PATH_NODES,
    all_candidates,
    fast_candidates,
    node_host_share,
)
from better_compute.projections.reservations import queued_pools

A = TypeVar("A", bound=TenantOwned)
# The events that change who is in a pool's queue (its head).
QUEUE_CHANGES = frozenset({"reservation.queued", "reservation.dequeued",
                           "reservation.cancelled", "reservation.expired"})


class ReservationCore:
    """Store access, placement and booking that the reservation service's parts share.

    One instance per ReservationService; the earliest start, the queue and the binding
    each hold it (composition: no part subclasses another)."""

    def __init__(self, service: ComputeService, partition: NodePartition | None = None) -> None:
        self.service = service
        self.partition = partition  # this process's nodes, packed first (serve --workers)
        self.aggregates = service.aggregates
        self.store = service.store
        self.sql = service.sql
        self.projections = service.projections
        self._locks: dict[str, threading.Lock] = {}
        self._quota_locks: dict[tuple[str, str], threading.Lock] = {}
        self._claims: dict[str, dict[str, int]] = {}  # pool -> node -> placements saving
        self._claims_guard = threading.Lock()  # not the pool's: a choice holds that for long
        self._locks_guard = threading.Lock()
        # The sequence of this process's last save that changed a pool's queue: a create
        # checking the queue's head waits for the reservations read model to hold it.
        self.queue_mark = 0
        # (position, pools with a queue) as of the follower's last pass; None without one.
        self._queues: tuple[int, frozenset[str]] | None = None

    def note_queues(self) -> None:
        """After a pass of this process's follower: the pools that have a queue, as of the
        reservations read model's position (a create on another pool reads no queue head)."""
        at = self.projections.known_position("reservations")
        self._queues = (at, frozenset(queued_pools(self.sql)))

    def forget_queues(self) -> None:
        self._queues = None

    def has_no_queue(self, pool_id: str) -> bool:
        """Whether ``pool_id`` had no queue at the follower's last pass, which holds every
        queue change this process saved."""
        known = self._queues
        return known is not None and known[0] >= self.queue_mark and pool_id not in known[1]

    def note_queue_changes(self, recordings: list[Any]) -> None:
        """The store's recording listener (wired by the composition root): notes the queue
        changes among what this process saved."""
        for recording in recordings:
            if recording.domain_event.TOPIC in QUEUE_CHANGES:
                self.queue_mark = max(self.queue_mark, recording.notification.id)

    # ----------------------------------------------------------------- helpers

    def now(self) -> datetime:
        """Database time (api/services/unit.py)."""
        return self.aggregates.now()

    def get(self, cls: type[A], uuid: UUID, *, fresh: bool = True) -> A | None:
        return self.aggregates.get(cls, uuid, fresh=fresh)

    def to_save(self, cls: type[A], uuid: UUID) -> A | None:
        """An aggregate this create saves, as this process last saw it (no read): when
        another writer saved a newer version, the save is refused and the retry reads it
        (api/services/unit.py ``Aggregates.get``). Only where a stale copy can make the
        command refuse nothing by itself: a refusal it makes (a booking that overlaps, quota
        used up) is checked again on a fresh read (``forget``) before it stands."""
        return self.aggregates.get(cls, uuid, fresh=False)

    def forget(self, aggregate: TenantOwned) -> None:
        """The next load of ``aggregate`` reads it from the store."""
        self.store.cache.forget([aggregate.id])

    def get_aggregate(self, uuid: UUID) -> Reservation | None:
        return self.get(Reservation, uuid)

    def pool_lock(self, pool_id: str) -> threading.Lock:
        with self._locks_guard:
            return self._locks.setdefault(pool_id, threading.Lock())

    def lock_quota(self, pool: Pool | None, tenant_id: str) -> AbstractContextManager[Any]:
        """The tenant's lock on its quota use on ``pool``, for a create or a release: this
        process's and the store's; nothing to wait for when it has none (the pool's owner,
        unlimited)."""
        if pool is None or pool.quota_for(tenant_id) is None:
            return nullcontext()
        return self._lock_quota(pool.public_id, tenant_id)

    @contextmanager
    def _lock_quota(self, pool_id: str, tenant_id: str) -> Iterator[None]:
        """This process's lock (``quota_lock``), then the store's, across the workers of
        ``serve --workers N`` and other replicas (api/store/locks.py)."""
        with self.quota_lock(pool_id, tenant_id), \
                self.store.locks.hold(f"quota/{pool_id}/{tenant_id}"):
            yield

    def quota_lock(self, pool_id: str, tenant_id: str) -> threading.Lock:
        """Held by a create of ``tenant_id`` on ``pool_id`` from loading the tenant's quota use
        to its save (taken before the pool's lock): every create of a tenant changes its ONE
        quota use, so two of one process saving at once would both take from the same
        version and one would lose its save and place again."""
        with self._locks_guard:
            return self._quota_locks.setdefault((pool_id, tenant_id), threading.Lock())

    def in_flight(self, pool_id: str) -> frozenset[str]:
        """Nodes of ``pool_id`` that placements of this process are booking and saving on
        (read under the pool's lock, by the placement about to choose)."""
        with self._claims_guard:
            return frozenset(self._claims.get(pool_id, ()))

    def claim(self, pool_id: str, node_id: str) -> None:
        """``node_id`` is being booked (under the pool's lock, with the choice)."""
        with self._claims_guard:
            claims = self._claims.setdefault(pool_id, {})
            claims[node_id] = claims.get(node_id, 0) + 1

    def unclaim(self, pool_id: str, node_id: str) -> None:
        """The booking on ``node_id`` is saved or given up: at once, not behind the pool's
        lock, which another placement may hold for its whole choice."""
        with self._claims_guard:
            claims = self._claims.get(pool_id, {})
            claims[node_id] = claims.get(node_id, 1) - 1
            if claims[node_id] <= 0:
                del claims[node_id]

    def bookings_of(self, node_id: str, pool: Pool | None = None, owner: str | None = None,
                    *, to_save: bool = False) -> NodeBookings:
        """The node's bookings; ``to_save``: for a create that only adds a booking (no read,
        ``to_save``). Never for a command that ends or changes a booking: a copy that does
        not hold it would change nothing, save nothing, and so never be found stale."""
        uuid = bookings_uuid(node_id)
        bookings = self.to_save(NodeBookings, uuid) if to_save else self.get(NodeBookings, uuid)
        if bookings is None:
            if pool is None and owner is None:
                raise NotFound(f"node {node_id} has no bookings")
            bookings = NodeBookings(tenant_id=owner or pool.tenant_id,  # type: ignore[union-attr]
                                    node_id=node_id, pool_id=pool.public_id if pool else "")
        return bookings

    def quota_of(self, pool_id: str, tenant_id: str, *, to_save: bool = False) -> QuotaUse:
        """The tenant's quota use on the pool; ``to_save``: one this command saves (no read,
        ``to_save``)."""
        uuid = quota_uuid(pool_id, tenant_id)
        quota = self.to_save(QuotaUse, uuid) if to_save else self.get(QuotaUse, uuid)
        return quota or QuotaUse(tenant_id=tenant_id, pool_id=pool_id)

    def _pool_gpus(self, pool_id: str) -> dict[str, float]:
        """The pool's GPU rollup, for an error that names the true cause."""
        self.projections.catch_up("capacity")
        return read_capacity(self.sql, pool_id)["gpu"]

    def choose(self, pool_id: str, request: PlacementRequest, start: datetime, end: datetime
               ) -> Placement:
        """Read the free-GPU index and place; NoCapacity says what is available.

        Every save applies the index in its own transaction (kept inline), so it holds every
        committed booking: nothing to follow first. The few fullest nodes that fit are read
        first; only when none of them fits, every node of the pool.
        """
        limit = FAST_PATH_NODES + len(request.exclude_nodes)  # as many left to choose from
        try:
            return place(request, fast_candidates(self.sql, pool_id, start, end, request.gpus,
                                                  limit), partition=self.partition)
        except NoCapacity:
            pass
        try:
            return place(request, all_candidates(self.sql, pool_id, start, end),
                         self._pool_gpus(pool_id), partition=self.partition)
        except NoCapacity as exc:
            raise NoCapacity(f"pool {pool_id}, {iso(start)} to {iso(end)}: {exc.message}",
                             data=exc.data) from None

    def book(self, bookings: NodeBookings, placement: Placement, *, allocation_id: str,
             reservation_id: str, holder: str, start: datetime, end: datetime
             ) -> tuple[datetime, datetime]:
        """Book ``placement`` on ``bookings``; the interval booked: [start, end), or moved to
        where the GPUs' last booking ended when ``start`` is before it (``NodeBookings.book``),
        which the reservation then records too."""
        cpu_cap = mem_cap = None
        if placement.host is not None:  # the candidate's: nothing to read
            cpu_cap, mem_cap = placement.host
        elif (share := node_host_share(self.sql, placement.node_id)) is not None:
            cpu_cap, mem_cap = share[0] * share[2], share[1] * share[2]
        return bookings.book(allocation_id=allocation_id, reservation_id=reservation_id,
                             holder=holder, gpus=list(placement.gpus), cpus=placement.cpus,
                             memory_gib=placement.memory_gib, start=start, end=end,
                             cpu_capacity=cpu_cap, memory_capacity_gib=mem_cap)

    def retrying(self, change: Callable[[], list[TenantOwned]], *, actor: str) -> None:
        """Run ``change`` (which re-reads what it changes) and save as ``actor``; again on a
        conflict (the one retry policy: ``Aggregates.retrying``)."""
        self.aggregates.retrying(change, actor=actor, conflict="another request changed this reservation "
                                 "at the same time; nothing was saved: run the command again")

    def end_hold(self, rsv: Reservation, at: datetime, refund: bool = True
                  ) -> list[TenantOwned]:
        """Aggregates that end the current hold of ``rsv``: bookings, quota, node."""
        out: list[TenantOwned] = []
        if not rsv.allocation_id:  # it was queued: it never held anything
            return out
        bookings = self.get(NodeBookings, bookings_uuid(rsv.node_id))
        if bookings is not None and bookings.end(rsv.allocation_id, at):
            out.append(bookings)
        if refund:
            quota = self.get(QuotaUse, quota_uuid(rsv.pool_id, rsv.tenant_id))
            if quota is not None and quota.refund(rsv.public_id):
                out.append(quota)
        node = self.get(Node, parse_id("node", rsv.node_id))
        if node is not None:
            changed = node.unassign_devices(rsv.allocation_id, at)
            if bookings is not None and not bookings.bookings:  # a draining node's last one
                changed = node.mark_drained(at) or changed
            if changed:
                out.append(node)
        return out


def unique_aggregates(aggregates: list[TenantOwned]) -> list[TenantOwned]:
    seen: dict[UUID, TenantOwned] = {}
    for aggregate in aggregates:
        seen.setdefault(aggregate.id, aggregate)
    return list(seen.values())
