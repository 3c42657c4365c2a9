"""20 queued requests made at once keep their order, and dispatchers racing never overbook.

Four Runtimes on the same store stand for four server processes. Twenty clients queue at
once (their tenant is over its quota); then the quota frees in two steps, each time with
three dispatchers running at once (as if leadership changed hands mid-pass). The checks
read the store: the queue placed first come first served, no GPU is booked twice, the
quota is never exceeded and the log shows the placements in queue order.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from eventsourcing.application import AggregateNotFoundError

from better_compute.api.controllers.queue import QueueDispatcher
from better_compute.domain.access import LOCAL_OPERATOR as OP
from better_compute.domain.bookings import NodeBookings, bookings_uuid, overlaps
from better_compute.domain.ids import public_id
from better_compute.domain.quota import QuotaUse, quota_uuid
from tests.fleet import add_nodes, make_pool
from tests.integration.test_reservations_service import ACME
from tests.support import open_runtime

QUOTA = 8
CLIENTS = 20


def together(count: int, work: Callable[[int], Any]) -> list[Any]:
    barrier = threading.Barrier(count)
    results: list[Any] = [None] * count

    def run(n: int) -> None:
        barrier.wait()
        try:
            results[n] = work(n)
        except Exception as exc:  # reported by the assertions below, with its message
            results[n] = exc

    threads = [threading.Thread(target=run, args=(n,)) for n in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=240)
    return results


def test_twenty_queued_requests_keep_fifo_and_never_overbook(env: dict[str, str],
                                                            runtime: Any) -> None:
    pool = make_pool(runtime.service)
    nodes = add_nodes(runtime.service, pool, 2)
    runtime.service.tenants_create(OP, "acme", None)
    runtime.service.pools_offer(OP, pool, "acme", {"gpu": QUOTA})
    runtimes = [runtime] + [open_runtime(env) for _ in range(3)]
    services = [r.services.reservations for r in runtimes]
    try:
        held = [services[0].create(ACME, tenant_id=None, pool_id=pool, gpus=4, duration="4h")
                for _ in range(2)]
        queued = together(CLIENTS, lambda n: services[n % 4].create(
            ACME, tenant_id=None, pool_id=pool, gpus=1, duration="1h", queue=True,
            key=f"client-{n}"))
        assert [q for q in queued if not isinstance(q, dict)] == []
        assert {q["state"] for q in queued} == {"queued"}
        line = services[0].list(ACME, None, pool, "queued")
        assert [r["queue"]["position"] for r in line] == list(range(1, CLIENTS + 1))
        order = [r["id"] for r in line]

        def dispatch_at_once() -> list[str]:
            reports = together(3, lambda n: QueueDispatcher(services[n + 1]).run())
            assert [r for r in reports if isinstance(r, Exception)] == []
            return [rsv for r in reports for rsv in r.placed]

        services[0].release(ACME, held[0]["id"])  # 4 GPUs of quota free
        assert sorted(dispatch_at_once()) == sorted(order[:4])
        services[0].release(ACME, held[1]["id"])
        for rsv in order[:2]:
            services[0].release(ACME, rsv)  # 2 more: 6 in all
        assert sorted(dispatch_at_once()) == sorted(order[4:10])
        assert [r["id"] for r in services[0].list(ACME, None, pool, "queued")] == order[10:]
    finally:
        for extra in runtimes[1:]:
            extra.close()

    store = runtime.store
    booked: list[dict[str, Any]] = []
    for node_id in nodes:
        try:
            agg = store.repository.get(bookings_uuid(node_id))
        except AggregateNotFoundError:
            continue  # nothing was ever booked on this node
        assert isinstance(agg, NodeBookings)
        booked.extend({**b, "node": node_id} for b in agg.bookings.values())
    for i, x in enumerate(booked):
        for y in booked[i + 1:]:
            if x["node"] == y["node"] and overlaps(x["start"], x["end"], y["start"], y["end"]):
                assert not set(x["gpus"]) & set(y["gpus"]), (x, y)
    assert sorted(b["reservationId"] for b in booked) == sorted(order[2:10])
    quota = store.repository.get(quota_uuid(pool, "acme"))
    assert isinstance(quota, QuotaUse) and quota.in_use == 8 and set(quota.held) == set(order[2:10])
    # First come first served, as the log recorded it: the placements in queue order.
    dequeued = store.recorder.select_notifications(start=1, limit=10_000,
                                                   topics=["reservation.dequeued"])
    placed = [public_id("rsv", store.mapper.to_domain_event(n).originator_id) for n in dequeued]
    assert placed == order[:10]
