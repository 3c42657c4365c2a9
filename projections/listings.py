"""The listings read model: one row per tenant, token, site and pool.

Each row holds the object's public document (what ``list`` methods return),
who may see it (``audience``: the owner and, for pools, the tenants it is
offered to) and a snapshot of the aggregate, so the next event of the same
aggregate applies to the row without loading anything else.

``bc_live_token`` beside it has one row per API token that is active or rotated as its
events left it, with its end (epoch seconds; NULL for none): ``live_tokens`` counts a
tenant's live ones (``tokens create``'s bound) and ``ended_tokens``/``next_token_end`` find
the ones whose end has passed and the next end (the tokens controller,
api/services/tokens.py), without reading the revoked and expired ones, which only grow.
Version 3 added it.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from better_compute.domain.base import TenantOwned
from better_compute.domain.pool import Pool
from better_compute.domain.token import ApiToken
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
    # 3: the live API tokens (bc_live_token).
    version = 3

    def table_names(self) -> list[str]:
        return ["bc_listing", "bc_live_token"]

    def tables(self) -> list[str]:
        return [
            "CREATE TABLE IF NOT EXISTS bc_listing ("
            "uuid TEXT PRIMARY KEY, kind TEXT NOT NULL, id TEXT NOT NULL, "
            "tenant_id TEXT NOT NULL, audience TEXT NOT NULL, created_seq BIGINT NOT NULL, "
            "version BIGINT NOT NULL, doc TEXT NOT NULL, snapshot_topic TEXT NOT NULL, "
            "snapshot TEXT NOT NULL)",
            "CREATE INDEX IF NOT EXISTS bc_listing_kind ON bc_listing (kind, created_seq)",
            "CREATE TABLE IF NOT EXISTS bc_live_token (uuid TEXT PRIMARY KEY, "
            "tenant_id TEXT NOT NULL, ends_at DOUBLE PRECISION)",
            "CREATE INDEX IF NOT EXISTS bc_live_token_tenant ON bc_live_token (tenant_id)",
            "CREATE INDEX IF NOT EXISTS bc_live_token_ends ON bc_live_token (ends_at)",
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
        doc = aggregate.to_doc()
        params = (
            kind_of(aggregate), aggregate.public_id, aggregate.tenant_id,
            audience_of(aggregate), pending.created_seq, aggregate.version,
            jsontext.dumps(doc), topic, state, uuid,
        )
        if isinstance(aggregate, ApiToken):
            _keep_live(sql, cursor, uuid, aggregate, doc)
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


def _keep_live(sql: Sql, cursor: Any, uuid: str, token: ApiToken, doc: dict[str, Any]
               ) -> None:
    """The token's row in ``bc_live_token`` while its events leave it active or rotated."""
    sql.execute(cursor, "DELETE FROM bc_live_token WHERE uuid = ?", (uuid,))
    if doc["state"] in ("active", "rotated"):
        ends = token.ends_at
        sql.execute(cursor, "INSERT INTO bc_live_token (uuid, tenant_id, ends_at) "
                    "VALUES (?, ?, ?)", (uuid, token.tenant_id,
                                         ends.timestamp() if ends is not None else None))


def live_tokens(sql: Sql, tenant_id: str, now: datetime) -> int:
    """The tenant's API tokens that are active or rotated at ``now`` (their end not passed)."""
    with sql.transaction(commit=False) as cursor:
        sql.execute(cursor, "SELECT COUNT(*) AS n FROM bc_live_token WHERE tenant_id = ? AND "
                    "(ends_at IS NULL OR ends_at > ?)", (tenant_id, now.timestamp()))
        row = cursor.fetchone()
    return int(row["n"])


def ended_tokens(sql: Sql, now: datetime) -> list[str]:
    """The uuids of the tokens still recorded active or rotated whose end is at or before
    ``now``."""
    with sql.transaction(commit=False) as cursor:
        sql.execute(cursor, "SELECT uuid FROM bc_live_token WHERE ends_at <= ? ORDER BY ends_at",
                    (now.timestamp(),))
        return [str(row["uuid"]) for row in cursor.fetchall()]


def next_token_end(sql: Sql) -> datetime | None:
    """The earliest end of a token still recorded active or rotated."""
    with sql.transaction(commit=False) as cursor:
        sql.execute(cursor, "SELECT MIN(ends_at) AS ends FROM bc_live_token")
        row = cursor.fetchone()
    ends = row["ends"] if row is not None else None
    return datetime.fromtimestamp(float(ends), UTC) if ends is not None else None


# Aggregates whose events never reach a row: their event classes are defined on them
# (``Reservation.Placed``), so the class tells without reading the table.
_UNLISTED = frozenset({"reservation", "nodebookings", "quotause", "pkibundle", "gpuclaim"})


def _owner(event_type: type[Any]) -> str:
    return event_type.__qualname__.split(".", 1)[0].lower()


def listing_seq_of(sql: Sql, kind: str, tenant_id: str | None, object_id: str) -> int | None:
    """Where ``object_id`` (of ``kind``, owned by ``tenant_id``, or by anyone for None) stands
    in its listing."""
    with sql.transaction(commit=False) as cursor:
        if tenant_id is None:
            sql.execute(cursor, "SELECT created_seq FROM bc_listing WHERE kind = ? AND id = ?",
                        (kind, object_id))
        else:
            sql.execute(cursor, "SELECT created_seq FROM bc_listing WHERE kind = ? AND id = ? "
                        "AND tenant_id = ?", (kind, object_id, tenant_id))
        row = cursor.fetchone()
    return int(row["created_seq"]) if row is not None else None


def query_listing(
    sql: Sql, kind: str, *, tenant_id: str | None = None, visible_to: str | None = None,
    where: dict[str, str] | None = None, after_seq: int | None = None,
    limit: int | None = None, containing: str | None = None,
) -> list[dict[str, Any]]:
    """Documents of one kind, oldest first; filtered by owner or by audience; with
    ``after_seq`` only those created after it, at most ``limit`` (before ``where``); with
    ``containing`` only those whose JSON text holds that text (a name's JSON string, found
    without decoding the other rows)."""
    clauses = ["kind = ?"]
    params: list[Any] = [kind]
    if tenant_id is not None:
        clauses.append("tenant_id = ?")
        params.append(tenant_id)
    if visible_to is not None:
        clauses.append("audience LIKE ?")
        params.append(f"%,{visible_to},%")
    if containing is not None:
        clauses.append("doc LIKE ? ESCAPE '\\'")
        escaped = containing.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        params.append(f"%{escaped}%")
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
