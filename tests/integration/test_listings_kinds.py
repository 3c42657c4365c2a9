"""The listings read model keeps rows only of the kinds something lists (projections/listings.py).

No row for reservations, a node's bookings or a quota use: nothing lists them, and a row
rewritten at each of their events would cost every reservation create.
"""

from __future__ import annotations

from typing import Any

from better_compute.domain.access import LOCAL_OPERATOR as OP
from better_compute.projections.listings import LISTED_KINDS
from tests.fleet import count_calls, offered_pool


def _kinds(runtime: Any) -> set[str]:
    sql = runtime.projections.sql
    with sql.transaction(commit=False) as cursor:
        sql.execute(cursor, "SELECT DISTINCT kind FROM bc_listing")
        return {str(row["kind"]) for row in cursor.fetchall()}


def test_reservations_bookings_and_quotas_get_no_listing_row(runtime: Any) -> None:
    pool = offered_pool(runtime.service, nodes=1, gpus=4)
    doc = runtime.services.reservations.create(OP, tenant_id="acme", pool_id=pool, gpus=1,
                                               duration="1h", key="listing-kinds")
    runtime.services.reservations.release(OP, doc["id"])
    runtime.projections.catch_up("listings")

    kinds = _kinds(runtime)
    assert kinds <= set(LISTED_KINDS), kinds - set(LISTED_KINDS)
    assert {"tenant", "pool", "node", "site"} <= kinds
    assert [p["id"] for p in runtime.service.listing("pool")] == [pool]


def _rows(runtime: Any) -> list[tuple[Any, ...]]:
    sql = runtime.projections.sql
    with sql.transaction(commit=False) as cursor:
        sql.execute(cursor, "SELECT uuid, kind, id, tenant_id, audience, created_seq, version, "
                            "doc FROM bc_listing ORDER BY uuid")
        return [tuple(row[k] for k in ("uuid", "kind", "id", "tenant_id", "audience",
                                       "created_seq", "version", "doc"))
                for row in cursor.fetchall()]


def test_a_batch_writes_each_aggregate_once_and_the_same_rows_as_one_at_a_time(
        runtime: Any, monkeypatch: Any) -> None:
    """Listings groups a batch's events by aggregate: a node bound and released many times
    is rendered once per batch, and the rows equal those of applying one event at a time."""
    from better_compute.domain.node import Node

    pool = offered_pool(runtime.service, nodes=2, gpus=16)
    rs = runtime.services.reservations
    for i in range(6):
        doc = rs.create(OP, tenant_id="acme", pool_id=pool, gpus=1, duration="1h",
                        key=f"batch-{i}")
        rs.begin_binding(rs.reservation(OP, doc["id"]).id, rs.now(),
                         actor="controller:reservations")
        if i % 2:
            rs.release(OP, doc["id"])
    projections = runtime.projections
    rendered = count_calls(monkeypatch, Node, "to_doc")
    projections.rebuild("listings")
    batched = _rows(runtime)
    assert len(rendered) == len(set(rendered)) == 2, rendered  # each node once, in one batch
    node_versions = [r[6] for r in batched if r[1] == "node"]
    assert max(node_versions) > 3  # the nodes did take several events each

    monkeypatch.setattr(projections, "batch_size", 1)
    projections.rebuild("listings")
    assert _rows(runtime) == batched
    assert len(rendered) > 2 + 6  # one at a time: rendered at each node event


def test_the_kinds_skipped_by_their_event_class_are_real_and_never_listed() -> None:
    import better_compute.domain  # noqa: F401  (registers every aggregate)
    from better_compute.domain.base import TenantOwned
    from better_compute.projections.listings import _UNLISTED

    def subclasses(cls: type[TenantOwned]) -> set[str]:
        out: set[str] = set()
        for sub in cls.__subclasses__():
            out |= {sub.__name__.lower(), *subclasses(sub)}
        return out

    aggregates = subclasses(TenantOwned)
    assert aggregates >= _UNLISTED, _UNLISTED - aggregates
    assert not _UNLISTED & set(LISTED_KINDS)
    assert set(LISTED_KINDS) | _UNLISTED == aggregates  # every aggregate is one or the other
