"""The listings read model: one row per tenant, token, site and pool.

Each row holds the object's public document (what ``list`` methods return),
who may see it (``audience``: the owner and, for pools, the tenants it is
offered to) and a snapshot of the aggregate, so the next event of the same
aggregate applies to the row without loading anything else.
"""

from __future__ import annotations

from typing import Any

from better_compute.domain.base import TenantOwned
from better_compute.domain.pool import Pool
from better_compute.projections import jsontext
from better_compute.projections.framework import Pending, SnapshotRows, Sql

LISTED_KINDS = ("tenant", "apitoken", "site", "pool", "jointoken", "node")


def kind_of(aggregate: Any) -> str:
    return type(aggregate).__name__.lower()


def audience_of(aggregate: TenantOwned) -> str:
    tenants = {aggregate.tenant_id}
    if isinstance(aggregate, Pool):
        tenants.update(aggregate.offerings)
    return "," + ",".join(sorted(tenants)) + ","


class Listings(SnapshotRows):
    name = "listings"
    # 2: only the listed kinds. Version 1 also kept a row (snapshot and document, rewritten
    # at every event) for every reservation, node's bookings and quota, which nothing
    # lists: about 40 % of this read model's work per reservation create.
    version = 2

    def table_names(self) -> list[str]:
        return ["bc_listing"]

    def tables(self) -> list[str]:
        return [
            "CREATE TABLE IF NOT EXISTS bc_listing ("
            "uuid TEXT PRIMARY KEY, kind TEXT NOT NULL, id TEXT NOT NULL, "
            "tenant_id TEXT NOT NULL, audience TEXT NOT NULL, created_seq BIGINT NOT NULL, "
            "version BIGINT NOT NULL, doc TEXT NOT NULL, snapshot_topic TEXT NOT NULL, "
            "snapshot TEXT NOT NULL)",
            "CREATE INDEX IF NOT EXISTS bc_listing_kind ON bc_listing (kind, created_seq)",
        ]

    def wants(self, event_type: type[Any]) -> bool:
        return _owner(event_type) not in _UNLISTED  # not a reservation's, bookings' or quota's

    def keeps(self, aggregate: Any) -> bool:
        return kind_of(aggregate) in LISTED_KINDS  # not PKI, nor any kind not listed

    def read_row(self, sql: Sql, cursor: Any, uuid: str) -> Any:
        sql.execute(
            cursor, "SELECT snapshot_topic, snapshot, created_seq FROM bc_listing WHERE uuid = ?",
            (uuid,),
        )
        return cursor.fetchone()

    def write(self, sql: Sql, cursor: Any, uuid: str, pending: Pending) -> None:
        aggregate = pending.aggregate
        topic, state = self.codec.snapshot(aggregate)
        params = (
            kind_of(aggregate), aggregate.public_id, aggregate.tenant_id,
            audience_of(aggregate), pending.created_seq, aggregate.version,
            jsontext.dumps(aggregate.to_doc()), topic, state, uuid,
        )
        if pending.new:
            sql.execute(
                cursor,
                "INSERT INTO bc_listing (kind, id, tenant_id, audience, created_seq, version, "
                "doc, snapshot_topic, snapshot, uuid) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                params,
            )
        else:
            sql.execute(
                cursor,
                "UPDATE bc_listing SET kind = ?, id = ?, tenant_id = ?, audience = ?, "
                "created_seq = ?, version = ?, doc = ?, snapshot_topic = ?, snapshot = ? "
                "WHERE uuid = ?",
                params,
            )


# Aggregates whose events never reach a row: their event classes are defined on them
# (``Reservation.Placed``), so the class tells without reading the table.
_UNLISTED = frozenset({"reservation", "nodebookings", "quotause", "pkibundle"})


def _owner(event_type: type[Any]) -> str:
    return event_type.__qualname__.split(".", 1)[0].lower()


def listing_seq_of(sql: Sql, kind: str, tenant_id: str, object_id: str) -> int | None:
    """Where ``object_id`` (of ``kind``, owned by ``tenant_id``) stands in its listing."""
    with sql.transaction(commit=False) as cursor:
        sql.execute(cursor, "SELECT created_seq FROM bc_listing WHERE kind = ? AND id = ? "
                    "AND tenant_id = ?", (kind, object_id, tenant_id))
        row = cursor.fetchone()
    return int(row["created_seq"]) if row is not None else None


def query_listing(
    sql: Sql, kind: str, *, tenant_id: str | None = None, visible_to: str | None = None,
    where: dict[str, str] | None = None, after_seq: int | None = None,
    limit: int | None = None,
) -> list[dict[str, Any]]:
    """Documents of one kind, oldest first; filtered by owner or by audience; with
    ``after_seq`` only those created after it, at most ``limit`` (before ``where``)."""
    clauses = ["kind = ?"]
    params: list[Any] = [kind]
    if tenant_id is not None:
        clauses.append("tenant_id = ?")
        params.append(tenant_id)
    if visible_to is not None:
        clauses.append("audience LIKE ?")
        params.append(f"%,{visible_to},%")
    if after_seq is not None:
        clauses.append("created_seq > ?")
        params.append(after_seq)
    bound = f" LIMIT {int(limit)}" if limit is not None else ""
    with sql.transaction(commit=False) as cursor:
        sql.execute(
            cursor,
            f"SELECT doc FROM bc_listing WHERE {' AND '.join(clauses)} "
            f"ORDER BY created_seq{bound}",
            params,
        )
        docs = [jsontext.loads(row["doc"]) for row in cursor.fetchall()]
    for field, value in (where or {}).items():
        docs = [d for d in docs if d.get(field) == value]
    return docs
