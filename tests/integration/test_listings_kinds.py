"""The listings read model keeps rows only of the kinds something lists (projections/listings.py).

Version 1 also kept a row, rewritten at every event, for every reservation, node's bookings
and quota; nothing read them, and each reservation create paid for it.
"""

from __future__ import annotations

from typing import Any

from better_compute.domain.access import LOCAL_OPERATOR as OP
from better_compute.projections.listings import LISTED_KINDS
from tests.fleet import add_nodes, make_pool


def _kinds(runtime: Any) -> set[str]:
    sql = runtime.projections.sql
    with sql.transaction(commit=False) as cursor:
        sql.execute(cursor, "SELECT DISTINCT kind FROM bc_listing")
        return {str(row["kind"]) for row in cursor.fetchall()}


def test_reservations_bookings_and_quotas_get_no_listing_row(runtime: Any) -> None:
    pool = make_pool(runtime.service)
    add_nodes(runtime.service, pool, 1)
    runtime.service.tenants_create(OP, "acme", None)
    runtime.service.pools_offer(OP, pool, "acme", {"gpu": 4})
    doc = runtime.services.reservations.create(OP, tenant_id="acme", pool_id=pool, gpus=1,
                                               duration="1h", key="listing-kinds")
    runtime.services.reservations.release(OP, doc["id"])
    runtime.projections.catch_up("listings")

    kinds = _kinds(runtime)
    assert kinds <= set(LISTED_KINDS), kinds - set(LISTED_KINDS)
    assert {"tenant", "pool", "node", "site"} <= kinds
    assert [p["id"] for p in runtime.service.listing("pool")] == [pool]
