"""The reservations read model: listings and the reservations controller's worklist.

One row per reservation with its public document and the columns the
controller asks about: state, node, allocation, start, end and the binding
deadline (epoch seconds). A queued reservation has no start or end yet: its
row's start is when it was queued and its end its queue deadline (when the
timers end its wait), and its position in the pool's queue is its
``created_seq`` (the sequence of ``reservation.queued``) among the pool's
queued rows. The row keeps a snapshot of the aggregate, so each
``reservation.*`` event is applied by the aggregate's own code.
"""

from __future__ import annotations

from typing import Any

from better_compute.projections import jsontext
from better_compute.projections.framework import Pending, SnapshotRows, Sql


def _epoch(value: Any) -> float | None:
    return None if value is None else float(value.timestamp())


class Reservations(SnapshotRows):
    name = "reservations"
    # 2: counts by tenant, pool and state (bc_rsv_count, read by /metrics); 3: no row at 0
    version = 3

    def table_names(self) -> list[str]:
        return ["bc_rsv", "bc_rsv_count"]

    def tables(self) -> list[str]:
        return [
            "CREATE TABLE IF NOT EXISTS bc_rsv ("
            "uuid TEXT PRIMARY KEY, id TEXT NOT NULL, tenant_id TEXT NOT NULL, "
            "pool_id TEXT NOT NULL, node_id TEXT NOT NULL, allocation_id TEXT NOT NULL, "
            "state TEXT NOT NULL, start_at DOUBLE PRECISION NOT NULL, "
            "end_at DOUBLE PRECISION NOT NULL, bind_deadline DOUBLE PRECISION, "
            "created_seq BIGINT NOT NULL, doc TEXT NOT NULL, snapshot_topic TEXT NOT NULL, "
            "snapshot TEXT NOT NULL)",
            "CREATE INDEX IF NOT EXISTS bc_rsv_tenant ON bc_rsv (tenant_id, created_seq)",
            "CREATE INDEX IF NOT EXISTS bc_rsv_state ON bc_rsv (state, start_at)",
            "CREATE INDEX IF NOT EXISTS bc_rsv_alloc ON bc_rsv (allocation_id)",
            "CREATE TABLE IF NOT EXISTS bc_rsv_count (tenant_id TEXT NOT NULL, "
            "pool_id TEXT NOT NULL, state TEXT NOT NULL, n BIGINT NOT NULL, "
            "PRIMARY KEY (tenant_id, pool_id, state))",
            "CREATE INDEX IF NOT EXISTS bc_rsv_line ON bc_rsv (pool_id, state, created_seq)",
        ]

    def wants(self, event_type: type[Any]) -> bool:
        return str(event_type.TOPIC).startswith("reservation.")

    def begin_batch(self) -> None:
        super().begin_batch()
        self._counts: dict[tuple[str, str, str], int] = {}

    def end_batch(self, sql: Sql, cursor: Any) -> None:
        super().end_batch(sql, cursor)
        counts, self._counts = self._counts, {}
        # One statement per batch, whatever it moved between states. A count that falls to 0
        # loses its row: which states a reservation is seen in depends on where batches end
        # (placed and bound in one save, it is seen placed only when a batch ends between the
        # two), so rows at 0 would make the table depend on how it was applied, and differ
        # from a rebuild (``store verify``). A key moved to and from (n + 0) may be new at 0.
        changed = [(*key, n) for key, n in sorted(counts.items())]
        if not changed:
            return
        sql.execute(cursor, "INSERT INTO bc_rsv_count (tenant_id, pool_id, state, n) "
                    f"VALUES {', '.join('(?, ?, ?, ?)' for _ in changed)} "
                    "ON CONFLICT (tenant_id, pool_id, state) "
                    "DO UPDATE SET n = bc_rsv_count.n + excluded.n",
                    [value for row in changed for value in row])
        fallen = [row[:3] for row in changed if row[3] <= 0]
        if fallen:
            sql.execute(cursor, "DELETE FROM bc_rsv_count WHERE n = 0 AND ("
                        + " OR ".join("(tenant_id = ? AND pool_id = ? AND state = ?)"
                                      for _ in fallen) + ")",
                        [value for key in fallen for value in key])

    def read_row(self, sql: Sql, cursor: Any, uuid: str) -> Any:
        sql.execute(cursor, "SELECT snapshot_topic, snapshot, created_seq, tenant_id, "
                    "pool_id, state FROM bc_rsv WHERE uuid = ?", (uuid,))
        return cursor.fetchone()

    def write(self, sql: Sql, cursor: Any, uuid: str, pending: Pending) -> None:
        aggregate = pending.aggregate
        row = pending.row  # as the table counts it now: (tenant, pool, state), or not at all
        before = None if row is None else (str(row["tenant_id"]), str(row["pool_id"]),
                                           str(row["state"]))
        after = (aggregate.tenant_id, aggregate.pool_id, aggregate.state)
        if after != before:  # counted once per batch (``end_batch``)
            for key, change in ((before, -1), (after, 1)):
                if key is not None:
                    self._counts[key] = self._counts.get(key, 0) + change
        topic, state = self.codec.snapshot(aggregate)
        start = aggregate.start or getattr(aggregate, "queued_at", None)
        end = aggregate.end or getattr(aggregate, "queue_deadline", None)
        params = (
            aggregate.public_id, aggregate.tenant_id, aggregate.pool_id, aggregate.node_id,
            aggregate.allocation_id, aggregate.state, _epoch(start),
            _epoch(end), _epoch(aggregate.bind_deadline), pending.created_seq,
            jsontext.dumps(aggregate.to_doc()), topic, state, uuid,
        )
        if pending.new:
            # An upsert: a new version of this projection applies the log again from 0 over
            # the rows the previous version left, and each reservation starts afresh here.
            columns = ("id", "tenant_id", "pool_id", "node_id", "allocation_id", "state",
                       "start_at", "end_at", "bind_deadline", "created_seq", "doc",
                       "snapshot_topic", "snapshot")
            sql.execute(
                cursor,
                f"INSERT INTO bc_rsv ({', '.join(columns)}, uuid) VALUES "
                f"({', '.join('?' for _ in columns)}, ?) ON CONFLICT (uuid) DO UPDATE SET "
                + ", ".join(f"{c} = excluded.{c}" for c in columns),
                params,
            )
        else:
            sql.execute(
                cursor,
                "UPDATE bc_rsv SET id = ?, tenant_id = ?, pool_id = ?, node_id = ?, "
                "allocation_id = ?, state = ?, start_at = ?, end_at = ?, bind_deadline = ?, "
                "created_seq = ?, doc = ?, snapshot_topic = ?, snapshot = ? WHERE uuid = ?",
                params,
            )


def count_reservations(sql: Sql) -> list[tuple[str, str, str, int]]:
    """(tenant, pool, state, how many) for every combination there is one of."""
    with sql.transaction(commit=False) as cursor:
        sql.execute(cursor, "SELECT tenant_id, pool_id, state, n FROM bc_rsv_count WHERE n > 0 "
                    "ORDER BY tenant_id, pool_id, state")
        return [(str(r["tenant_id"]), str(r["pool_id"]), str(r["state"]), int(r["n"]))
                for r in cursor.fetchall()]


def count_in_state(sql: Sql, tenant_id: str, pool_id: str, state: str) -> int:
    """How many of ``tenant_id``'s reservations in ``pool_id`` are in ``state`` now."""
    with sql.transaction(commit=False) as cursor:
        sql.execute(cursor, "SELECT n FROM bc_rsv_count WHERE tenant_id = ? AND pool_id = ? "
                    "AND state = ?", (tenant_id, pool_id, state))
        row = cursor.fetchone()
    return int(row["n"]) if row is not None else 0


def created_seq_of(sql: Sql, tenant_id: str | None, reservation_id: str) -> int | None:
    """Where ``reservation_id`` stands in ``tenant_id``'s list (None: not one of its), or in
    every tenant's (``tenant_id`` None)."""
    with sql.transaction(commit=False) as cursor:
        if tenant_id is None:
            sql.execute(cursor, "SELECT created_seq FROM bc_rsv WHERE id = ?", (reservation_id,))
        else:
            sql.execute(cursor, "SELECT created_seq FROM bc_rsv WHERE id = ? AND tenant_id = ?",
                        (reservation_id, tenant_id))
        row = cursor.fetchone()
    return int(row["created_seq"]) if row is not None else None


def list_reservations(sql: Sql, *, tenant_id: str | None = None, pool_id: str | None = None,
                      states: tuple[str, ...] = (), after_seq: int | None = None,
                      limit: int | None = None) -> list[dict[str, Any]]:
    """Oldest first; with ``after_seq`` only those created after it, at most ``limit``."""
    clauses: list[str] = ["1 = 1"]
    params: list[str | int] = []
    if tenant_id is not None:
        clauses.append("tenant_id = ?")
        params.append(tenant_id)
    if pool_id is not None:
        clauses.append("pool_id = ?")
        params.append(pool_id)
    if states:
        clauses.append(f"state IN ({', '.join('?' for _ in states)})")
        params.extend(states)
    if after_seq is not None:
        clauses.append("created_seq > ?")
        params.append(after_seq)
    bound = f" LIMIT {int(limit)}" if limit is not None else ""
    with sql.transaction(commit=False) as cursor:
        sql.execute(cursor, f"SELECT doc FROM bc_rsv WHERE {' AND '.join(clauses)} "
                    f"ORDER BY created_seq{bound}", params)
        return [jsontext.loads(row["doc"]) for row in cursor.fetchall()]


def due_reservations(sql: Sql, now: float, limit: int = 500) -> list[dict[str, Any]]:
    """Reservations the controller must act on at ``now`` (epoch seconds).

    placed and started; binding past its deadline; any live one past its end; queued past
    its queue deadline.
    """
    with sql.transaction(commit=False) as cursor:
        sql.execute(
            cursor,
            "SELECT uuid, id, state, start_at, end_at, bind_deadline FROM bc_rsv WHERE "
            "(state = 'placed' AND start_at <= ?) "
            "OR (state = 'binding' AND bind_deadline <= ?) "
            "OR (state IN ('placed', 'binding', 'active', 'queued') AND end_at <= ?) "
            f"ORDER BY start_at LIMIT {int(limit)}",
            (now, now, now),
        )
        return [dict(row) for row in cursor.fetchall()]


def reservation_of_allocation(sql: Sql, allocation_id: str) -> str | None:
    """The reservation uuid that holds (or held) ``allocation_id`` as its current allocation."""
    with sql.transaction(commit=False) as cursor:
        sql.execute(cursor, "SELECT uuid FROM bc_rsv WHERE allocation_id = ?", (allocation_id,))
        row = cursor.fetchone()
    return str(row["uuid"]) if row else None


def queue_positions(sql: Sql, pool_ids: list[str]) -> dict[str, int]:
    """Each queued reservation's position (1 = the head) in its pool's queue, by public id."""
    if not pool_ids:
        return {}
    marks = ", ".join("?" for _ in pool_ids)
    with sql.transaction(commit=False) as cursor:
        sql.execute(cursor, f"SELECT id, pool_id FROM bc_rsv WHERE state = 'queued' AND pool_id "
                    f"IN ({marks}) ORDER BY pool_id, created_seq", pool_ids)
        out: dict[str, int] = {}
        counts: dict[str, int] = {}
        for row in cursor.fetchall():
            counts[row["pool_id"]] = counts.get(row["pool_id"], 0) + 1
            out[str(row["id"])] = counts[row["pool_id"]]
        return out


def queue_head(sql: Sql, pool_id: str) -> str | None:
    """The uuid of the first queued reservation of a pool."""
    with sql.transaction(commit=False) as cursor:
        sql.execute(cursor, "SELECT uuid FROM bc_rsv WHERE pool_id = ? AND state = 'queued' "
                    "ORDER BY created_seq LIMIT 1", (pool_id,))
        row = cursor.fetchone()
    return str(row["uuid"]) if row else None


def waiting_in_pool(sql: Sql, pool_id: str, now: float) -> list[dict[str, Any]]:
    """A pool's line, first come first: queued reservations, and placed ones not started yet.

    Each row: uuid, id, tenant_id, state, created_seq, start_at, end_at and the document.
    """
    with sql.transaction(commit=False) as cursor:
        sql.execute(cursor, "SELECT uuid, id, tenant_id, state, created_seq, start_at, end_at, doc "
                    "FROM bc_rsv WHERE pool_id = ? AND (state = 'queued' OR "
                    "(state = 'placed' AND start_at > ?)) ORDER BY created_seq", (pool_id, now))
        return [dict(row) for row in cursor.fetchall()]


def queued_pools(sql: Sql, after: int = 0) -> list[str]:
    """Pools with queued reservations (queued after sequence ``after``, when given)."""
    with sql.transaction(commit=False) as cursor:
        sql.execute(cursor, "SELECT DISTINCT pool_id FROM bc_rsv WHERE state = 'queued' "
                    "AND created_seq > ?", (after,))
        return sorted(str(r["pool_id"]) for r in cursor.fetchall())


def held_quota(sql: Sql, pool_id: str, tenant_id: str) -> list[tuple[str, int, float]]:
    """(id, GPUs, end) of a tenant's live reservations on a pool: what holds its quota."""
    with sql.transaction(commit=False) as cursor:
        sql.execute(cursor, "SELECT id, doc, end_at FROM bc_rsv WHERE pool_id = ? AND "
                    "tenant_id = ? AND state IN ('placed', 'binding', 'active')",
                    (pool_id, tenant_id))
        return [(str(r["id"]), int(jsontext.loads(r["doc"])["gpuCount"]), float(r["end_at"]))
                for r in cursor.fetchall()]
