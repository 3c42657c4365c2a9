"""reservations.* and capacity.preview (docs/reservations.md)."""

from __future__ import annotations

from typing import Any

from better_compute.api.http.rpc import Call, method
from better_compute.api.http.schemas import ListScope, Params


class ReservationsCreate(Params, kw_only=True):
    pool_id: str
    gpus: int
    duration: str  # --for: 30m, 2h, 1d
    tenant_id: str | None = None
    model: str | None = None
    product: str | None = None
    selector: str | None = None
    nvlink: bool = False
    start: str | None = None  # +2h, RFC 3339 or "earliest"; default now
    key: str | None = None
    kubernetes: bool = False  # hand the hold to the kubelet (pool with policy.kubernetes)
    queue: bool = False  # queued when it cannot be placed (docs/reservations.md, the queue)
    queue_timeout: str | None = None  # with queue: how long it waits (default 6h)
    move_earlier: bool = False  # with a later start: move earlier when GPUs free up


class CapacityPreview(Params, kw_only=True):
    pool_id: str
    gpus: int
    duration: str
    tenant_id: str | None = None
    model: str | None = None
    product: str | None = None
    selector: str | None = None
    nvlink: bool = False
    start: str | None = None


class ReservationRef(Params, kw_only=True):
    reservation_id: str
    tenant_id: str | None = None


class ReservationsList(ListScope, kw_only=True):
    pool_id: str | None = None
    state: str | None = None  # one state or a comma-separated list
    limit: int | None = None  # at most this many (1 to 1,000, the default)
    after: str | None = None  # only those created after this reservation (the next page)


class ReservationsExtend(Params, kw_only=True):
    reservation_id: str
    by: str
    tenant_id: str | None = None


@method("reservations.create", ReservationsCreate,
        "Reserve GPUs of a pool for a duration: the placer books them on one node with their "
        "host CPUs and memory (now, at start, or at the earliest start); key makes it "
        "retry-safe; queue waits in the pool's queue when it cannot be placed.", writes=True)
def reservations_create(call: Call, p: ReservationsCreate) -> dict[str, Any]:
    return call.services.reservations.create(
        call.principal, tenant_id=p.tenant_id, pool_id=p.pool_id, gpus=p.gpus,
        duration=p.duration, model=p.model, product=p.product, selector=p.selector,
        nvlink=p.nvlink, start=p.start, key=p.key, kubernetes=p.kubernetes, queue=p.queue,
        queue_timeout=p.queue_timeout, move_earlier=p.move_earlier,
    )


@method("reservations.get", ReservationRef, "One reservation with its state and binding.")
def reservations_get(call: Call, p: ReservationRef) -> dict[str, Any]:
    return call.services.reservations.get_doc(call.principal, p.reservation_id)


@method("reservations.list", ReservationsList,
        "A tenant's reservations (allTenants: every tenant's, root), oldest first, a page of "
        "at most limit (1,000) after after.")
def reservations_list(call: Call, p: ReservationsList) -> list[dict[str, Any]]:
    return call.services.reservations.list(call.principal, p.tenant_id, p.pool_id, p.state,
                                           p.limit, p.after, p.all_tenants)


@method("reservations.release", ReservationRef,
        "End a started reservation now: bookings end, quota is refunded, the hold leaves "
        "the node.", writes=True)
def reservations_release(call: Call, p: ReservationRef) -> dict[str, Any]:
    return call.services.reservations.release(call.principal, p.reservation_id)


@method("reservations.cancel", ReservationRef,
        "Withdraw a reservation that has not started yet (a queued one leaves the queue).",
        writes=True)
def reservations_cancel(call: Call, p: ReservationRef) -> dict[str, Any]:
    return call.services.reservations.release(call.principal, p.reservation_id, cancel=True)


@method("reservations.extend", ReservationsExtend,
        "Extend a reservation by a duration when its GPUs are free for the extra time.",
        writes=True)
def reservations_extend(call: Call, p: ReservationsExtend) -> dict[str, Any]:
    return call.services.reservations.extend(call.principal, p.reservation_id, p.by)


@method("capacity.preview", CapacityPreview,
        "Would a reservation fit now, and with which host CPUs and memory? When not, the "
        "earliest start at which it fits. Books nothing.")
def capacity_preview(call: Call, p: CapacityPreview) -> dict[str, Any]:
    return call.services.reservations.preview(
        call.principal, tenant_id=p.tenant_id, pool_id=p.pool_id, gpus=p.gpus,
        duration=p.duration, model=p.model, product=p.product, selector=p.selector,
        nvlink=p.nvlink, start=p.start,
    )
