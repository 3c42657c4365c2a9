"""reservations.* and capacity.preview (docs/reservations.md)."""

from __future__ import annotations

from typing import Any

from better_compute.api.http.methods import Call
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


def reservations_create(call: Call, p: ReservationsCreate) -> dict[str, Any]:
    return call.services.reservations.create(
        call.principal, tenant_id=p.tenant_id, pool_id=p.pool_id, gpus=p.gpus,
        duration=p.duration, model=p.model, product=p.product, selector=p.selector,
        nvlink=p.nvlink, start=p.start, key=p.key, kubernetes=p.kubernetes, queue=p.queue,
        queue_timeout=p.queue_timeout, move_earlier=p.move_earlier,
    )


def reservations_get(call: Call, p: ReservationRef) -> dict[str, Any]:
    return call.services.reservations.get_doc(call.principal, p.reservation_id)


def reservations_list(call: Call, p: ReservationsList) -> list[dict[str, Any]]:
    return call.services.reservations.list(call.principal, p.tenant_id, p.pool_id, p.state,
                                           p.limit, p.after, p.all_tenants)


def reservations_release(call: Call, p: ReservationRef) -> dict[str, Any]:
    return call.services.reservations.release(call.principal, p.reservation_id)


def reservations_cancel(call: Call, p: ReservationRef) -> dict[str, Any]:
    return call.services.reservations.release(call.principal, p.reservation_id, cancel=True)


def reservations_extend(call: Call, p: ReservationsExtend) -> dict[str, Any]:
    return call.services.reservations.extend(call.principal, p.reservation_id, p.by)


def capacity_preview(call: Call, p: CapacityPreview) -> dict[str, Any]:
    return call.services.reservations.preview(
        call.principal, tenant_id=p.tenant_id, pool_id=p.pool_id, gpus=p.gpus,
        duration=p.duration, model=p.model, product=p.product, selector=p.selector,
        nvlink=p.nvlink, start=p.start,
    )
