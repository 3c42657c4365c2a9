"""reservations.* and capacity.preview: placing, booking, releasing and extending.

A create reads the free-GPU projection to choose a node (domain/placement.py),
then saves the reservation, the node's bookings and the tenant's quota use in
ONE atomic write. Correctness rests on that write, not on the projection: the
bookings aggregate refuses an overlap, the quota aggregate refuses going over
the quota, and a concurrent writer of either makes the save fail as a whole
(optimistic concurrency); then the placer catches the projection up and
places again. Within one process, placements on one pool also take a lock,
so threads of one server do not race each other for the same node: the lock covers the
choice only, and a choice avoids the nodes other placements of the process are saving on
(while other nodes fit), so the saves run side by side.

The shared machinery (time, loading, placing, ending holds) is in
api/services/reservation_base.py; binding, failures and the end time in
api/services/reservation_binding.py; the earliest start in api/services/reservation_earliest.py;
the queue and moving reservations earlier in api/services/reservation_queue.py.
"""

from __future__ import annotations

import time
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from eventsourcing.persistence import IntegrityError

from better_compute.api.services.compute import ComputeService
from better_compute.api.services.reservation_base import ReservationCore
from better_compute.api.services.reservation_binding import ReservationBinding
from better_compute.api.services.reservation_earliest import EarliestStart
from better_compute.api.services.reservation_queue import DispatchReport, ReservationQueue
from better_compute.api.services.unit import retry_pause
from better_compute.domain.access import Principal
from better_compute.domain.base import TenantOwned, fingerprint, iso
from better_compute.domain.bookings import NodeBookings, bookings_uuid
from better_compute.domain.durations import format_duration, parse_duration, parse_start
from better_compute.domain.errors import (
    Conflict,
    InvalidInput,
    KubernetesNotEnabled,
    NoCapacity,
    NotFound,
    QuotaExceeded,
)
from better_compute.domain.gpu_models import same_model
from better_compute.domain.gpus import parse_gpu_model
from better_compute.domain.ids import check_key, parse_id, public_id
from better_compute.domain.paging import page_size, position_after
from better_compute.domain.placement import NodePartition, PlacementRequest
from better_compute.domain.policy import kubernetes_resource
from better_compute.domain.pool import Pool
from better_compute.domain.queue import StartMode, start_mode
from better_compute.domain.quota import QuotaUse
from better_compute.domain.reservation import (
    STATES,
    Reservation,
    new_allocation_id,
)
from better_compute.domain.reservation_rules import (
    MAX_START_AHEAD,
    check_extension,
    check_gpu_count,
    check_length,
)
from better_compute.domain.selectors import parse_selector
from better_compute.projections.reservations import created_seq_of, list_reservations

PLACEMENT_DEADLINE_S = 30.0  # how long a create keeps placing again after conflicts


def check_kubernetes(pool: Pool) -> None:
    """``--kubernetes`` needs a pool whose nodes run bcd's device plugin (policy.kubernetes)."""
    if kubernetes_resource(pool.policy) is None:
        raise KubernetesNotEnabled(
            f"pool {pool.public_id} has no kubernetes in its policy, so its nodes run no device "
            "plugin and no kubelet would see the GPUs: reserve without --kubernetes, or use a "
            'pool created with "kubernetes": {} in its policy (docs/kubernetes.md)'
        )


class ReservationService:
    """Reservations on top of the ComputeService's store, projections and clock.

    Composed of parts that share one ``ReservationCore`` (store access, placement, booking):
    ``earliest`` (the earliest start and the queue head's shadow, read-only), ``queue`` (the
    line and its dispatch) and ``binding`` (a hold's life on its node). The commands are
    here; the controllers' and the gateway's entry points are delegated below.
    """

    def __init__(self, service: ComputeService, partition: NodePartition | None = None) -> None:
        self.service = service
        self.aggregates = service.aggregates
        self.store = service.store
        self.sql = service.sql
        self.projections = service.projections
        self.core = ReservationCore(service, partition)
        self.earliest = EarliestStart(self.core)
        self.queue = ReservationQueue(self.core, self.earliest)
        self.binding = ReservationBinding(self.core)

    # ------------------------------------------------ entry points of the parts

    def now(self) -> datetime:
        return self.core.now()

    def get_aggregate(self, uuid: UUID) -> Reservation | None:
        return self.core.get_aggregate(uuid)

    def dispatch(self, pool_id: str, now: datetime | None = None, *, actor: str
                 ) -> DispatchReport:
        return self.queue.dispatch(pool_id, now, actor=actor)

    def expire_queued(self, uuid: UUID, now: datetime, *, actor: str) -> bool:
        return self.queue.expire_queued(uuid, now, actor=actor)

    def expire(self, uuid: UUID, now: datetime, *, actor: str) -> bool:
        return self.binding.expire(uuid, now, actor=actor)

    def begin_binding(self, uuid: UUID, now: datetime, *, actor: str) -> bool:
        return self.binding.begin_binding(uuid, now, actor=actor)

    def begin_bindings(self, uuids: list[UUID], now: datetime, *, actor: str) -> list[UUID]:
        return self.binding.begin_bindings(uuids, now, actor=actor)

    def bound(self, node_id: str, entry: dict[str, Any], *, actor: str) -> bool:
        return self.binding.bound(node_id, entry, actor=actor)

    def bind_failed(self, node_id: str | None, allocation_id: str, reason: str, message: str,
                    now: datetime, *, actor: str) -> bool:
        return self.binding.bind_failed(node_id, allocation_id, reason, message, now,
                                        actor=actor)

    # ------------------------------------------------------------- commands

    def reservation(self, principal: Principal, reservation_id: str) -> Reservation:
        rsv = self.core.get(Reservation, parse_id("rsv", reservation_id))
        if rsv is None or not principal.can_see_tenant(rsv.tenant_id):
            raise NotFound(
                f"no reservation {reservation_id!r}: `better-compute reservations list` shows "
                "your reservations"
            )
        return rsv

    def _visible_pool(self, principal: Principal, tenant: str, pool_id: str) -> Pool:
        pool = self.core.get(Pool, parse_id("pool", pool_id))
        if pool is None or not (pool.visible_to(tenant) and principal.can_see_tenant(tenant)):
            raise NotFound(
                f"no pool {pool_id!r} for tenant {tenant}: `better-compute pools list` shows "
                "the pools you own or are offered"
            )
        return pool

    # ---------------------------------------------------------------- placing

    def _request(self, pool: Pool, gpus: int, model: str | None, product: str | None,
                 selector: str | None, nvlink: bool) -> PlacementRequest:
        check_gpu_count(gpus)
        family = None
        if model:
            family = parse_gpu_model(model, "--model")
            if not same_model(family, pool.gpu_model):
                raise InvalidInput(
                    f"--model {model} does not match pool {pool.public_id}, which holds "
                    f"{pool.gpu_model} GPUs: drop --model or pick a pool of {family}"
                )
        parsed = parse_selector(selector) if selector else None
        return PlacementRequest(gpus=gpus, model=family, product=product or None,
                                selector=parsed, nvlink=bool(nvlink))

    def _interval(self, duration: str, start: str | None, now: datetime
                  ) -> tuple[datetime, datetime]:
        length = parse_duration(duration, flag="--for")
        check_length(length, duration)
        begin = parse_start(start, now, latest=MAX_START_AHEAD) if start else now
        begin = max(begin, now)  # a start in the past means now
        return begin, begin + length

    def create(
        self, principal: Principal, *, tenant_id: str | None, pool_id: str, gpus: int,
        duration: str, model: str | None = None, product: str | None = None,
        selector: str | None = None, nvlink: bool = False, start: str | None = None,
        key: str | None = None, queue: bool = False, queue_timeout: str | None = None,
        move_earlier: bool = False, kubernetes: bool = False,
    ) -> dict[str, Any]:
        tenant = self.service.aggregates.scope(principal, tenant_id)
        principal.require_member_of(tenant, "reserve GPUs")
        if key:
            check_key(key)
        pool = self._visible_pool(principal, tenant, pool_id)
        request = self._request(pool, gpus, model, product, selector, nvlink)
        if kubernetes:
            check_kubernetes(pool)
        mode = start_mode(start, queue, queue_timeout, move_earlier)
        params = {"pool": pool.public_id, "gpus": gpus, "for": duration, "model": request.model,
                  "product": request.product, "selector": selector or None,
                  "nvlink": request.nvlink, "start": start or None, **mode.fingerprint()}
        params |= {"kubernetes": True} if kubernetes else {}  # old keys keep their print
        fp = fingerprint(params)
        uuid = self.service.new_id(tenant, "reservation", key)
        if key:
            existing = self.core.get(Reservation, uuid)
            if existing is not None:
                existing.check_retry(fp, "reservation", key)
                return self.queue.doc_of(existing)
        now = self.core.now()
        begin, end = self._interval(duration, mode.start, now)
        fields = {"model": request.model, "product": request.product,
                  "selector": selector or None, "nvlink": request.nvlink,
                  "for": format_duration(end - begin), **mode.request_fields()}
        fields |= {"kubernetes": True} if kubernetes else {}  # queued ones keep it too
        return self._place_and_book(principal, uuid=uuid, tenant=tenant, pool=pool,
                                    request=request, mode=mode, fields=fields, key=key, fp=fp,
                                    begin=begin, end=end, now=now)

    def _place_and_book(self, principal: Principal, *, uuid: Any, tenant: str, pool: Pool,
                        request: PlacementRequest, mode: StartMode, fields: dict[str, Any],
                        key: str | None, fp: str, begin: datetime, end: datetime,
                        now: datetime) -> dict[str, Any]:
        """Choose under the pool's lock, then book and save outside it; again when another
        writer got there first. Refused for quota or capacity: queued when asked, else raised.
        A create that takes quota holds the tenant's lock on it (``ReservationCore.lock_quota``:
        this process's and the store's) from choosing to saving."""
        limit = pool.quota_for(tenant)
        with self.core.lock_quota(pool, tenant):
            return self._placed_and_booked(principal, uuid=uuid, tenant=tenant, pool=pool,
                                           request=request, mode=mode, fields=fields, key=key,
                                           fp=fp, begin=begin, end=end, now=now, limit=limit)

    def _placed_and_booked(self, principal: Principal, *, uuid: Any, tenant: str, pool: Pool,
                           request: PlacementRequest, mode: StartMode, fields: dict[str, Any],
                           key: str | None, fp: str, begin: datetime, end: datetime,
                           now: datetime, limit: int | None) -> dict[str, Any]:
        gpus = request.gpus
        rsv_id = public_id("rsv", uuid)
        give_up = time.monotonic() + PLACEMENT_DEADLINE_S
        avoid = True  # nodes other placements of this process are saving on, while others fit
        clashes = 0
        while True:
            quota = None
            with self.core.pool_lock(pool.public_id):  # the choice only, not the save
                busy = self.core.in_flight(pool.public_id) if avoid else frozenset()
                try:
                    if limit is not None:
                        quota = self._take_quota(pool, tenant, rsv_id, gpus, limit)
                    placement, begin, end = self.earliest.place_for(
                        pool, replace(request, exclude_nodes=request.exclude_nodes | busy),
                        begin, end, mode)
                    self.earliest.check_line(pool, tenant, placement, begin, end,
                                    gpus if limit is not None else 0, now)
                except (QuotaExceeded, NoCapacity) as refused:
                    if busy and isinstance(refused, NoCapacity):
                        avoid = False  # only the nodes being saved on were left: try them
                        continue
                    if not mode.queue:
                        raise
                    return self.queue.enqueue(uuid=uuid, tenant=tenant, pool=pool, request=request,
                                        fields=fields, key=key, fp=fp,
                                        created_by=principal.token_id, now=now, mode=mode,
                                        refused=refused, actor=principal.actor)
                self.core.claim(pool.public_id, placement.node_id)
            try:
                done = self._book_and_save(principal, uuid=uuid, tenant=tenant, pool=pool,
                                           gpus=gpus, fields=fields, key=key, fp=fp,
                                           placement=placement, begin=begin, end=end,
                                           quota=quota, give_up=give_up, now=now)
            finally:
                self.core.unclaim(pool.public_id, placement.node_id)
            if done is not None:
                return done
            avoid = True  # another writer got there first: its booking is in the index now
            time.sleep(retry_pause(clashes))  # not again in step with the other writers
            clashes += 1

    def _take_quota(self, pool: Pool, tenant: str, rsv_id: str, gpus: int, limit: int
                    ) -> QuotaUse:
        """The tenant's quota use with ``gpus`` taken for ``rsv_id`` (to save with the
        booking); QuotaExceeded only when a fresh read of it says so too."""
        quota = self.core.quota_of(pool.public_id, tenant, to_save=True)
        try:
            quota.take(rsv_id, gpus, limit)
        except QuotaExceeded:
            self.core.forget(quota)  # the copy kept here may be older than the store's
            quota = self.core.quota_of(pool.public_id, tenant)
            quota.take(rsv_id, gpus, limit)
        return quota

    def _book_and_save(self, principal: Principal, *, uuid: Any, tenant: str, pool: Pool,
                       gpus: int, fields: dict[str, Any], key: str | None, fp: str,
                       placement: Any, begin: datetime, end: datetime, quota: Any,
                       give_up: float, now: datetime) -> dict[str, Any] | None:
        """Book ``placement`` and save reservation, bookings and quota in ONE write (with its
        binding and the node's assignment when it starts now); None when another writer got
        there first (place again)."""
        rsv_id = public_id("rsv", uuid)
        bookings = self.core.bookings_of(placement.node_id, pool, to_save=True)
        allocation_id = new_allocation_id()
        starts_now = begin <= now
        try:
            begin, end = self.core.book(bookings, placement, allocation_id=allocation_id,
                                        reservation_id=rsv_id, holder=tenant, start=begin,
                                        end=end)
        except Conflict:
            self.core.forget(bookings)  # kept here, maybe older than the store's: read again
            if time.monotonic() > give_up:
                raise
            return None
        if starts_now:  # moved to where the GPUs were freed, it still starts now
            now = max(now, begin)
        rsv = Reservation(
            id=uuid, tenant_id=tenant, pool_id=pool.public_id, gpu_count=gpus,
            request=fields, start=begin, end=end, key=key, fingerprint=fp,
            created_by=principal.token_id, allocation_id=allocation_id,
            node_id=placement.node_id, gpus=list(placement.gpus), cpus=placement.cpus,
            memory_gib=placement.memory_gib,
        )
        answer = rsv.to_doc()  # placed: what the placer did (docs/reservations.md)
        node = self.binding.bind_at_create(rsv, now)
        try:
            self.store.save(rsv, bookings, *([quota] if quota is not None else []), *node,
                            actor=principal.actor)
        except IntegrityError:
            existing = self.core.get(Reservation, uuid)
            if existing is not None:  # the same key won a race: that is our answer
                existing.check_retry(fp, "reservation", key)
                return self.queue.doc_of(existing)
            if time.monotonic() > give_up:
                raise Conflict(
                    f"pool {pool.public_id} is too busy to place this reservation "
                    f"within {PLACEMENT_DEADLINE_S:.0f}s; nothing was booked: run the "
                    "command again with the same --key"
                ) from None
            return None
        return answer

    def preview(self, principal: Principal, *, tenant_id: str | None, pool_id: str, gpus: int,
                duration: str, model: str | None = None, product: str | None = None,
                selector: str | None = None, nvlink: bool = False, start: str | None = None
                ) -> dict[str, Any]:
        """Would this request fit now, and if not, when first? Books nothing."""
        tenant = self.service.aggregates.scope(principal, tenant_id)
        pool = self._visible_pool(principal, tenant, pool_id)
        request = self._request(pool, gpus, model, product, selector, nvlink)
        now = self.core.now()
        begin, end = self._interval(duration, start, now)
        answer: dict[str, Any] = {"poolId": pool.public_id, "gpus": gpus, "start": iso(begin),
                                  "end": iso(end)}
        limit = pool.quota_for(tenant)
        in_use = self.core.quota_of(pool.public_id, tenant).in_use if limit is not None else 0
        answer["quota"] = {"gpu": "unlimited" if limit is None else limit, "inUse": in_use}
        return {**answer, **self.earliest.earliest_answer(pool, tenant, request, begin, end, now)}

    # ---------------------------------------------------------------- queries

    def get_doc(self, principal: Principal, reservation_id: str) -> dict[str, Any]:
        return self.queue.doc_of(self.reservation(principal, reservation_id))

    def list(self, principal: Principal, tenant_id: str | None, pool_id: str | None,
             state: str | None, limit: int | None = None, after: str | None = None,
             all_tenants: bool = False) -> list[dict[str, Any]]:
        """One page of a tenant's reservations (``all_tenants``: every tenant's), oldest
        first: at most ``limit`` (default and most ``MAX_PAGE``, domain/paging.py) created
        after ``after``; a page shorter than ``limit`` is the last (docs/api.md)."""
        tenant = self.service.aggregates.listed_tenant(principal, tenant_id, all_tenants,
                                                       "reservations")
        if pool_id:
            parse_id("pool", pool_id)
        page = page_size(limit, "reservation")
        if after is not None:
            parse_id("rsv", after)
        self.projections.catch_up("reservations")
        states = tuple(s.strip() for s in state.split(",") if s.strip()) if state else ()
        unknown = [s for s in states if s not in STATES]
        if unknown:
            raise InvalidInput(f"--state {', '.join(unknown)} is not a reservation state: use "
                               f"{', '.join(STATES)} (comma-separated)")
        after_seq = position_after(after, lambda rsv: created_seq_of(self.sql, tenant, rsv),
                                   "reservation", tenant or "any")
        return self.queue.add_positions(list_reservations(
            self.sql, tenant_id=tenant, pool_id=pool_id or None, states=states,
            after_seq=after_seq, limit=page))

    # --------------------------------------------------------------- changing

    def release(self, principal: Principal, reservation_id: str, cancel: bool = False
                ) -> dict[str, Any]:
        first = self.reservation(principal, reservation_id)
        principal.require_member_of(first.tenant_id, "release reservations")
        result: dict[str, Any] = {}
        loaded = [first]  # the first attempt changes what was just loaded; a retry re-reads

        def change() -> list[TenantOwned]:
            rsv = loaded.pop() if loaded else self.core.get(Reservation, first.id)
            assert rsv is not None
            now = self.core.now()
            result["rsv"] = rsv
            if cancel:
                rsv.cancel(now)
            else:
                if rsv.queued:
                    raise Conflict(f"reservation {rsv.public_id} is queued and holds nothing: "
                                   f"leave the queue with `better-compute release "
                                   f"{rsv.public_id} --cancel`")
                if not rsv.live:
                    return []
                if not rsv.started(now):
                    raise Conflict(
                        f"reservation {rsv.public_id} has not started (it starts at "
                        f"{iso(rsv.start)}): withdraw it with `better-compute release "
                        f"{rsv.public_id} --cancel`"
                    )
                rsv.release(now, reason="released")
            if not rsv.pending_events:
                return []
            return [rsv, *self.core.end_hold(rsv, now)]

        # Ending a hold refunds the tenant's ONE quota use: releases of a tenant with a quota
        # hold its lock in this process, as its creates do, instead of losing saves to each
        # other (the pool's owner has no quota use: its releases do not wait for each other).
        with self.core.lock_quota(self.core.get(Pool, parse_id("pool", first.pool_id)),
                                  first.tenant_id):
            self.core.retrying(change, actor=principal.actor)
        return result["rsv"].to_doc()  # type: ignore[no-any-return]

    def extend(self, principal: Principal, reservation_id: str, by: str) -> dict[str, Any]:
        first = self.reservation(principal, reservation_id)
        principal.require_member_of(first.tenant_id, "extend reservations")
        delta = parse_duration(by, flag="--by")
        if delta <= timedelta(0):
            raise InvalidInput(f"--by {by} must be longer than 0 (for example --by 2h)")
        result: dict[str, Any] = {}
        loaded = [first]  # the first attempt changes what was just loaded; a retry re-reads

        def change() -> list[TenantOwned]:
            rsv = loaded.pop() if loaded else self.core.get(Reservation, first.id)
            assert rsv is not None
            result["rsv"] = rsv
            new_end = rsv.end + delta
            check_extension(rsv.start, new_end)
            rsv.extend(new_end)
            bookings = self.core.get(NodeBookings, bookings_uuid(rsv.node_id))
            if bookings is None or bookings.booking(rsv.allocation_id) is None:
                raise Conflict(f"reservation {rsv.public_id} holds no booking to extend")
            bookings.extend(rsv.allocation_id, new_end)
            return [rsv, bookings]

        self.core.retrying(change, actor=principal.actor)
        return result["rsv"].to_doc()  # type: ignore[no-any-return]
