"""The earliest start and the queue's head: where and when a request fits first, read-only.

``earliest_slot`` answers where and when a request fits first: the placer's fast path at the
requested start, else the earliest-start search (``domain/earliest.py``) over the index of
node blocks (``projections/earliest_index.py``), which reads only the nodes that can matter.
``earliest_answer`` is capacity.preview's verdict built on it.

The head's shadow (``domain/queue.py``) is where the first queued reservation of a pool
would start; ``check_line`` refuses a create that would delay it. Nothing here saves: the
changes to the line (enqueue, dispatch, moves, expiry) are in
api/services/reservation_queue.py.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from better_compute.api.services.reservation_base import ReservationCore
from better_compute.domain.base import iso
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
from better_compute.domain.errors import NoCapacity
from better_compute.domain.placement import Placement, PlacementRequest, place
from better_compute.domain.pool import Pool
from better_compute.domain.queue import Shadow, StartMode, delays_head
from better_compute.domain.reservation import Reservation
from better_compute.domain.selectors import parse_selector
from better_compute.projections.earliest_index import timeline_of, timelines
from better_compute.projections.free_gpus import fast_candidates
from better_compute.projections.reservations import held_quota, queue_head


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


class EarliestStart:
    """Earliest starts and the head's shadow of each pool, on the shared store access."""

    def __init__(self, core: ReservationCore) -> None:
        self.core = core
        self.store = core.store
        self.sql = core.sql
        self.projections = core.projections

    # ------------------------------------------------------------ the earliest start

    def earliest_slot(self, pool_id: str, request: PlacementRequest, length: timedelta,
                      not_before: datetime, moving: Reservation | None = None) -> Slot | None:
        """Where and when ``request`` fits first, at or after ``not_before``; None: never.

        ``moving``: a placed reservation looking for an earlier slot; its own booking does not
        count, and its node wins a tie.
        """
        seconds, t0 = length.total_seconds(), instant(not_before)
        if moving is None:
            try:  # the placer's fast path first: fits at the start among the fullest nodes
                placement = place(request, fast_candidates(
                    self.sql, pool_id, not_before, not_before + length, request.gpus))
                return Slot(t0, t0 + seconds, placement)
            except NoCapacity:
                pass
        self.projections.settle("free_gpus")  # the blocks of the nodes changed meanwhile
        walk = timelines(self.sql, pool_id, request.gpus, seconds, t0,
                         force=(moving.node_id,) if moving else (),
                         exclude_allocation=moving.allocation_id if moving else None)
        try:
            return earliest_start(request, seconds, t0, walk,
                                  prefer=moving.node_id if moving else None)
        finally:
            walk.close()

    def place_for(self, pool: Pool, request: PlacementRequest, begin: datetime, end: datetime,
                   mode: StartMode) -> tuple[Placement, datetime, datetime]:
        """Placement and interval for a create: at ``begin``, or at the earliest start."""
        if not mode.earliest:
            return self.core.choose(pool.public_id, request, begin, end), begin, end
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

    # ------------------------------------------------------------ the queue's head

    def quota_held(self, pool_id: str, tenant: str) -> tuple[tuple[int, float], ...]:
        """(GPUs, end) of each reservation holding the tenant's quota on the pool."""
        held = self.core.quota_of(pool_id, tenant).held
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

        The reservations read model is not caught up on every create: it holds every queue
        change this process saved (``ReservationCore.queue_mark``); one another process saved
        a moment ago may not be seen yet (its follower applies it within a batch), as one
        queued while this create runs never is (the check and the save are not atomic).
        """
        self.projections.wait_for("reservations", self.core.queue_mark)
        if self.core.has_no_queue(pool.public_id):
            return None
        head = queue_head(self.sql, pool.public_id)
        rsv = self.core.get(Reservation, UUID(head)) if head else None
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
