"""What a store must hold after concurrent creates: no GPU booked twice, no quota overrun."""

from __future__ import annotations

from typing import Any

from eventsourcing.application import AggregateNotFoundError

from better_compute.domain.bookings import NodeBookings, bookings_uuid, overlaps
from better_compute.domain.ids import parse_id
from better_compute.domain.quota import QuotaUse, quota_uuid
from better_compute.domain.reservation import Reservation


def assert_booked_once_within_quota(store: Any, pool: str, nodes: list[str],
                                    placed: list[dict[str, Any]], tenant: str, quota: int,
                                    gpus: int) -> None:
    """Against the store: every booking, every placed reservation, ``tenant``'s quota use
    and the pool's ``gpus``."""
    booked: list[dict[str, Any]] = []
    for node_id in nodes:
        try:
            agg = store.repository.get(bookings_uuid(node_id))
        except AggregateNotFoundError:  # nothing was ever booked on it
            continue
        assert isinstance(agg, NodeBookings)
        booked.extend({**b, "node": node_id} for b in agg.bookings.values())
    for i, x in enumerate(booked):
        for y in booked[i + 1:]:
            if x["node"] == y["node"] and overlaps(x["start"], x["end"], y["start"], y["end"]):
                assert not set(x["gpus"]) & set(y["gpus"]), (x, y)
    assert sorted(b["reservationId"] for b in booked) == sorted(d["id"] for d in placed)
    for doc in placed:
        rsv = store.repository.get(parse_id("rsv", doc["id"]))
        assert isinstance(rsv, Reservation) and rsv.gpus == doc["gpus"]
    held = sum(d["gpuCount"] for d in placed if d["tenantId"] == tenant)
    assert held <= quota, f"{tenant} holds {held} GPUs, over its quota of {quota}"
    try:
        use = store.repository.get(quota_uuid(pool, tenant))
    except AggregateNotFoundError:  # none of the tenant's creates was placed
        assert held == 0
    else:
        assert isinstance(use, QuotaUse) and use.in_use == held
    assert sum(len(b["gpus"]) for b in booked) <= gpus
