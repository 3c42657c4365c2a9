"""The earliest start, the queue and moving reservations earlier (docs/reservations.md).

``earliest_slot`` answers where and when a request fits first: the placer's fast path at the
requested start, else the earliest-start search (``domain/earliest.py``) over the index of
node blocks (``projections/earliest_index.py``), which reads only the nodes that can matter.

``dispatch`` is one pass over a pool's line (``domain/queue.py``): queued reservations are
placed at their earliest start when their quota allows and a node can hold them; placed
reservations that asked for it move to an earlier start. Behind the first queued reservation
that cannot be placed (the head), nothing is placed or moved that would delay it. Each
change is ONE save of the reservation, the bookings it ends or makes and the quota use, with
optimistic concurrency: a concurrent writer makes it fail as a whole, and it is decided again
on fresh state. The queue dispatcher (``api/controllers/queue.py``) runs the passes.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from eventsourcing.persistence import IntegrityError

from better_compute.api.services.reservation_base import ReservationBase, _unique
from better_compute.domain.base import TenantOwned, iso
from better_compute.domain.durations import parse_duration
from better_compute.domain.earliest import (
    NEVER,
    Booking,
    Slot,
    earliest_start,
    instant,
    moment,
    quota_free_at,
)
from better_compute.domain.errors import Conflict, NoCapacity, QuotaExceeded
from better_compute.domain.ids import parse_id, public_id
from better_compute.domain.placement import Placement, PlacementRequest, place
from better_compute.domain.pool import Pool
from better_compute.domain.queue import Shadow, StartMode, delays_head
from better_compute.domain.reservation import PLACED, Reservation, new_allocation_id
from better_compute.domain.selectors import parse_selector
from better_compute.projections.earliest_index import timeline_of, timelines
from better_compute.projections.free_gpus import fast_candidates
from better_compute.projections.reservations import (
    held_quota,
    queue_head,
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


def request_of(rsv: Reservation) -> PlacementRequest:
    req = rsv.request
    return PlacementRequest(
        gpus=rsv.gpu_count, model=req.get("model"), product=req.get("product"),
        selector=parse_selector(req["selector"]) if req.get("selector") else None,
        nvlink=bool(req.get("nvlink")),
    )


def length_of(rsv: Reservation) -> timedelta:
    if rsv.start is not None and rsv.end is not None:
        return rsv.end - rsv.start
    return parse_duration(str(rsv.request["for"]))


class ReservationQueue(ReservationBase):
    """Earliest starts, the line of each pool and its dispatch, on the shared store access."""

    # ------------------------------------------------------------ the earliest start

    def earliest_slot(self, pool_id: str, request: PlacementRequest, length: timedelta,
                      not_before: datetime, moving: Reservation | None = None) -> Slot | None:
        """Where and when ``request`` fits first, at or after ``not_before``; None: never.

        ``moving``: a placed reservation looking for an earlier slot; its own booking does not
        count, and its node wins a tie.
        """
        self.projections.catch_up("free_gpus")
        seconds, t0 = length.total_seconds(), instant(not_before)
        if moving is None:
            try:  # the placer's fast path first: fits at the start among the fullest nodes
                placement = place(request, fast_candidates(
                    self.sql, pool_id, not_before, not_before + length, request.gpus))
                return Slot(t0, t0 + seconds, placement)
            except NoCapacity:
                pass
        walk = timelines(self.sql, pool_id, request.gpus, seconds, t0,
                         force=(moving.node_id,) if moving else (),
                         exclude_allocation=moving.allocation_id if moving else None)
        try:
            return earliest_start(request, seconds, t0, walk,
                                  prefer=moving.node_id if moving else None)
        finally:
            walk.close()

    def _place_for(self, pool: Pool, request: PlacementRequest, begin: datetime, end: datetime,
                   mode: StartMode) -> tuple[Placement, datetime, datetime]:
        """Placement and interval for a create: at ``begin``, or at the earliest start."""
        if not mode.earliest:
            return self.choose(pool.public_id, request, begin, end), begin, end
        slot = self.earliest_slot(pool.public_id, request, end - begin, begin)
        if slot is None:
            raise NoCapacity(
                f"no schedulable node of pool {pool.public_id} can ever hold "
                f"{request.describe()}: add --queue to wait for a node that can, or ask for "
                "fewer GPUs, or relax --model/--product/--selector/--nvlink",
                data={"requested": request.gpus},
            )
        return slot.placement, moment(slot.start), moment(slot.end)

    def earliest_answer(self, pool: Pool, tenant: str, request: PlacementRequest,
                        begin: datetime, end: datetime, now: datetime) -> dict[str, Any]:
        """capacity.preview's verdict: fits at ``begin``, or why not and the earliest start."""
        limit = pool.quota_for(tenant)
        not_before = begin
        verdict: dict[str, Any] = {}
        if limit is not None:
            held = self.quota_held(pool.public_id, tenant)
            in_use = sum(g for g, _ in held)
            if in_use + request.gpus > limit:
                free_at = quota_free_at(limit, held, request.gpus, instant(begin))
                verdict = {
                    "fits": False, "reason": "quota_exceeded", "quotaFreesAt": None,
                    "message": f"quota gpu={limit}: {in_use} in use, "
                               f"{max(0, limit - in_use)} available",
                }
                if free_at is None:
                    return {**verdict, "earliest": None}
                not_before = moment(free_at)
                verdict["quotaFreesAt"] = iso(not_before)
                verdict["message"] += (f"; your reservations, ending as booked, leave room at "
                                       f"{iso(not_before)}: reserve --queue waits for it")
        slot = self.earliest_slot(pool.public_id, request, end - begin, not_before)
        if slot is None:
            return {"fits": False, "reason": verdict.get("reason", "no_capacity"),
                    "message": verdict.get("message") or (
                        f"no schedulable node of pool {pool.public_id} can ever hold "
                        f"{request.describe()}: reserve --queue waits for one"),
                    "earliest": None}
        placement = slot.placement
        earliest = {"start": iso(moment(slot.start)), "end": iso(moment(slot.end)),
                    "nodeId": placement.node_id, "gpus": list(placement.gpus),
                    "hostResources": {"cpus": placement.cpus, "memoryGiB": placement.memory_gib}}
        if verdict:
            return {**verdict, "earliest": earliest}
        try:
            self.check_line(pool, tenant, placement, moment(slot.start), moment(slot.end),
                            request.gpus if limit is not None else 0, now)
        except NoCapacity as exc:
            return {"fits": False, "reason": "queue", "message": exc.message,
                    "earliest": earliest}
        if slot.start == instant(begin):
            return {"fits": True, "nodeId": placement.node_id,
                    "hostResources": earliest["hostResources"], "earliest": earliest}
        return {"fits": False, "reason": "no_capacity",
                "message": f"does not fit at {iso(begin)}; the earliest start is "
                           f"{earliest['start']} on {placement.node_id} "
                           "(reserve --start earliest books it)",
                "earliest": earliest}

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
                now: datetime, mode: StartMode, refused: Exception) -> dict[str, Any]:
        """Queue a create that cannot be placed now; ``refused`` when it never could."""
        limit = pool.quota_for(tenant)
        if limit is not None and request.gpus > limit:
            raise refused  # more than the whole quota: waiting would never end
        rsv = Reservation.enqueue(
            id=uuid, tenant_id=tenant, pool_id=pool.public_id, gpu_count=request.gpus,
            request=fields, key=key, fingerprint=fp, created_by=created_by, at=now,
            deadline=now + mode.queue_timeout,
        )
        try:
            self.store.save(rsv)
        except IntegrityError:
            existing = self.get(Reservation, uuid)
            if existing is None:
                raise
            existing.check_retry(fp, "reservation", key)
            return self.doc_of(existing)
        return self.doc_of(rsv)

    def quota_held(self, pool_id: str, tenant: str) -> tuple[tuple[int, float], ...]:
        """(GPUs, end) of each reservation holding the tenant's quota on the pool."""
        held = self.quota_of(pool_id, tenant).held
        if not held:
            return ()
        self.projections.catch_up("reservations")
        ends = {rsv_id: end for rsv_id, _, end in held_quota(self.sql, pool_id, tenant)}
        return tuple((gpus, ends.get(rsv_id, NEVER)) for rsv_id, gpus in sorted(held.items()))

    def shadow(self, pool: Pool, rsv: Reservation, now: datetime) -> Shadow | None:
        """Where the queued ``rsv`` would start (None when no node could ever hold it)."""
        t_now = instant(now)
        limit = pool.quota_for(rsv.tenant_id)
        held = self.quota_held(pool.public_id, rsv.tenant_id) if limit is not None else ()
        free_at = quota_free_at(limit, held, rsv.gpu_count, t_now)
        if free_at is None:
            return None
        request = request_of(rsv)
        slot = self.earliest_slot(pool.public_id, request, length_of(rsv), moment(free_at))
        if slot is None:
            return None
        node = timeline_of(self.sql, slot.placement.node_id)
        if node is None:
            return None
        return Shadow(rsv.public_id, rsv.tenant_id, request, slot, node, limit, held, t_now)

    def head_shadow(self, pool: Pool, now: datetime) -> Shadow | None:
        """The shadow of the first queued reservation of ``pool`` (None: no queue, or none).

        The reservations projection is followed, not caught up on every create: a
        reservation queued by another process a moment ago may not be seen yet, as one
        queued while this create runs never is (the check and the save are not atomic).
        """
        self.projections.follow("reservations")
        head = queue_head(self.sql, pool.public_id)
        rsv = self.get(Reservation, UUID(head)) if head else None
        return self.shadow(pool, rsv, now) if rsv is not None and rsv.queued else None

    def check_line(self, pool: Pool, tenant: str, placement: Placement, begin: datetime,
                   end: datetime, quota_gpus: int, now: datetime) -> None:
        """NoCapacity when booking ``placement`` for [begin, end) would delay the queue's head."""
        shadow = self.head_shadow(pool, now)
        booking = Booking("new", frozenset(placement.gpus), instant(begin), instant(end),
                          placement.cpus, placement.memory_gib)
        if delays_head(shadow, tenant, placement.node_id, booking, quota_gpus):
            assert shadow is not None
            raise NoCapacity(
                f"pool {pool.public_id} has a queue, and booking {placement.node_id} from "
                f"{iso(begin)} to {iso(end)} would delay its head {shadow.reservation_id} "
                f"(which starts at {iso(moment(shadow.slot.start))} at the earliest): add "
                "--queue to wait in line, or reserve later with --start",
                data={"queueHead": shadow.reservation_id},
            )

    # ---------------------------------------------------------------- dispatch

    def dispatch(self, pool_id: str, now: datetime | None = None) -> DispatchReport:
        """One pass over a pool's line, first come first (see the module docstring)."""
        report = DispatchReport()
        now = now or self.now()
        self.projections.catch_up("reservations")
        line = [row for row in waiting_in_pool(self.sql, pool_id, instant(now))
                if row["state"] == "queued" or json.loads(row["doc"])["request"].get("moveEarlier")]
        pool = self.get(Pool, parse_id("pool", pool_id)) if line else None
        if pool is None:  # nobody waits (placed for a fixed start: it never moves)
            return report
        shadow: Shadow | None = None
        with self._pool_lock(pool_id):
            for row in line:
                uuid = UUID(str(row["uuid"]))
                if row["state"] == "queued":
                    outcome = self._retry(self._dequeue, pool, uuid, now, shadow)
                    if outcome.kind == "busy":
                        report.undecided = True
                        break  # nobody behind it goes first; the next pass decides again
                    if outcome.kind == "placed":
                        shadow = outcome.shadow
                        report.placed.append(public_id("rsv", uuid))
                    elif outcome.kind == "blocked" and report.head is None:
                        report.head = public_id("rsv", uuid)
                        rsv = self.get(Reservation, uuid)
                        shadow = self.shadow(pool, rsv, now) if rsv and rsv.queued else None
                else:
                    outcome = self._retry(self._move, pool, uuid, now, shadow)
                    if outcome.kind == "moved":
                        shadow = outcome.shadow
                        report.rescheduled.append(public_id("rsv", uuid))
        return report

    def _retry(self, attempt: Callable[[Pool, UUID, datetime, Shadow | None], _Outcome],
               pool: Pool, uuid: UUID, now: datetime, shadow: Shadow | None) -> _Outcome:
        for _ in range(RETRIES):
            try:
                return attempt(pool, uuid, now, shadow)
            except IntegrityError:
                continue  # another writer got there first: decide again on fresh state
            except Conflict:
                continue  # the index was behind the bookings: it catches up, decide again
        return _Outcome("busy")

    def _dequeue(self, pool: Pool, uuid: UUID, now: datetime, shadow: Shadow | None
                 ) -> _Outcome:
        """Place one queued reservation when its quota allows and a node can hold it."""
        rsv = self.get(Reservation, uuid)
        if rsv is None or not rsv.queued:
            return _Outcome("gone")
        limit = pool.quota_for(rsv.tenant_id)
        quota = None
        if limit is not None:
            quota = self.quota_of(pool.public_id, rsv.tenant_id)
            try:
                quota.take(rsv.public_id, rsv.gpu_count, limit)
            except QuotaExceeded:
                return _Outcome("blocked")
        slot = self.earliest_slot(pool.public_id, request_of(rsv), length_of(rsv), now)
        if slot is None:
            return _Outcome("blocked")
        placement = slot.placement
        allocation_id = new_allocation_id()
        booking = Booking(allocation_id, frozenset(placement.gpus), slot.start, slot.end,
                          placement.cpus, placement.memory_gib)
        if delays_head(shadow, rsv.tenant_id, placement.node_id, booking, rsv.gpu_count):
            return _Outcome("waits")
        start, end = moment(slot.start), moment(slot.end)
        bookings = self.bookings_of(placement.node_id, pool)
        self._book(bookings, placement, allocation_id=allocation_id,
                   reservation_id=rsv.public_id, holder=rsv.tenant_id, start=start, end=end)
        rsv.dequeue(at=now, allocation_id=allocation_id, node_id=placement.node_id,
                    gpus=list(placement.gpus), cpus=placement.cpus,
                    memory_gib=placement.memory_gib, start=start, end=end)
        changed: list[TenantOwned] = [rsv, bookings, *([quota] if quota is not None else [])]
        self.store.save(*changed)
        return _Outcome("placed", shadow and shadow.after(rsv.tenant_id, placement.node_id,
                                                          booking, rsv.gpu_count))

    def _move(self, pool: Pool, uuid: UUID, now: datetime, shadow: Shadow | None) -> _Outcome:
        """Move one placed reservation earlier when it asked to and a slot is free."""
        rsv = self.get(Reservation, uuid)
        if rsv is None or rsv.state != PLACED or not rsv.moves_earlier or rsv.start <= now:
            return _Outcome("stays", shadow)
        slot = self.earliest_slot(pool.public_id, request_of(rsv), length_of(rsv), now,
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
        old = self.bookings_of(rsv.node_id, pool)
        old.end(rsv.allocation_id, now)
        new = old if placement.node_id == rsv.node_id else self.bookings_of(placement.node_id, pool)
        start = moment(slot.start)
        self._book(new, placement, allocation_id=allocation_id, reservation_id=rsv.public_id,
                   holder=rsv.tenant_id, start=start, end=moment(slot.end))
        previous_allocation = rsv.allocation_id
        rsv.reschedule(reason="gpus-freed", allocation_id=allocation_id,
                       node_id=placement.node_id, gpus=list(placement.gpus),
                       cpus=placement.cpus, memory_gib=placement.memory_gib, start=start)
        self.store.save(*_unique([rsv, old, new]))
        return _Outcome("moved", shadow and shadow.after(rsv.tenant_id, placement.node_id,
                                                         booking, 0, releases=previous_allocation))

    def expire_queued(self, uuid: UUID, now: datetime) -> bool:
        """End the wait of a queued reservation whose queue timeout has passed."""
        done = {"changed": False}

        def change() -> list[TenantOwned]:
            rsv = self.get(Reservation, uuid)
            if rsv is None or not rsv.queued or rsv.queue_deadline > now:
                return []
            done["changed"] = rsv.expire_queue(now)
            return [rsv]

        self._retrying(change)
        return done["changed"]

