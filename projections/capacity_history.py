"""Each pool's GPU rollup over time, in 5-minute buckets, kept by the capacity read model.

``bc_capacity_history`` holds, per pool and bucket (the bucket's start, whole seconds since
the epoch, a multiple of ``BUCKET_S``), the pool's GPU figures (``total``, ``allocatable``,
``allocated``, ``reserved``, ``available``, docs/capacity.md) as they stood after the last
event of that bucket that touched one of the pool's nodes. A bucket in which nothing happened
has no row: the pool's figures did not move, so the row before it still holds.

The bucket of an event is that of its own time (``timestamp``), so a rebuild from the log
writes the same rows as following it live, whatever the batches (``Capacity`` writes a
bucket's rows whenever the next event falls in another bucket, and at a batch's end; the last
write to a bucket is always the state after its last event). A pool keeps
``RETENTION_S`` of buckets and the one row before them (the figures at the retention's
start): at most 8 * 288 + 1 rows.

``read_history`` answers the figures at evenly spaced instants of a window of at most
``MAX_WINDOW_S``: one indexed range read of at most as many rows as the window has buckets,
whatever the number of nodes, reservations or events.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from better_compute.projections.framework import Sql

TABLE = "bc_capacity_history"
BUCKET_S = 300  # 5 minutes
MAX_WINDOW_S = 7 * 86400
RETENTION_S = MAX_WINDOW_S + 86400
FIELDS = ("total", "allocatable", "allocated", "reserved", "available")
# The spacing of a window's points: the finest that gives at most MAX_POINTS intervals.
STEPS_S = (300, 900, 1800, 3600, 7200, 10800, 21600)
MAX_POINTS = 288


def tables() -> list[str]:
    numbers = ", ".join(f"{f} DOUBLE PRECISION NOT NULL" for f in FIELDS)
    return [f"CREATE TABLE IF NOT EXISTS {TABLE} (pool_id TEXT NOT NULL, bucket BIGINT NOT NULL, "
            f"{numbers}, PRIMARY KEY (pool_id, bucket))"]


def bucket_of(moment: datetime) -> int:
    return int(moment.timestamp()) // BUCKET_S * BUCKET_S


def record(sql: Sql, cursor: Any, pool_ids: list[str], bucket: int, sums_table: str) -> None:
    """Write each pool's GPU sums (``sums_table``, resource ``gpu``) as bucket ``bucket``'s
    row, and drop its rows older than the retention but the newest of those."""
    names = ", ".join(FIELDS)
    updates = ", ".join(f"{f} = excluded.{f}" for f in FIELDS)
    for pool in pool_ids:
        sql.execute(cursor,
                    f"INSERT INTO {TABLE} (pool_id, bucket, {names}) SELECT pool_id, ?, {names} "
                    f"FROM {sums_table} WHERE pool_id = ? AND resource = 'gpu' "
                    f"ON CONFLICT (pool_id, bucket) DO UPDATE SET {updates}",
                    (bucket, pool))
        sql.execute(cursor,
                    f"DELETE FROM {TABLE} WHERE pool_id = ? AND bucket < (SELECT MAX(bucket) "
                    f"FROM {TABLE} WHERE pool_id = ? AND bucket <= ?)",
                    (pool, pool, bucket - RETENTION_S))


def step_for(window_s: int) -> int:
    return next((s for s in STEPS_S if window_s <= s * MAX_POINTS), STEPS_S[-1])


def read_history(sql: Sql, pool_id: str, now: datetime, window_s: int) -> dict[str, Any]:
    """The pool's GPU figures at the window's start, at every step boundary in it and at
    ``now``, oldest first: ``{"step": seconds, "points": [{"at", <FIELDS>}]}``. A point at an
    instant ``T`` holds the figures after every event of the buckets that start before ``T``
    (exact at a boundary; the window's start is within its bucket); the last point, at
    ``now``, the figures now (the read model's)."""
    step = step_for(window_s)
    end = int(now.timestamp())
    last_boundary = end // step * step
    first = end - window_s
    times = [first, *(t for t in range(last_boundary - (window_s // step) * step,
                                      last_boundary + 1, step) if first < t < end), end]
    with sql.transaction(commit=False) as cursor:
        sql.execute(cursor, f"SELECT bucket, {', '.join(FIELDS)} FROM {TABLE} "
                    "WHERE pool_id = ? AND bucket < ? ORDER BY bucket DESC LIMIT 1",
                    (pool_id, first))
        before = cursor.fetchall()
        sql.execute(cursor, f"SELECT bucket, {', '.join(FIELDS)} FROM {TABLE} "
                    "WHERE pool_id = ? AND bucket >= ? AND bucket <= ? ORDER BY bucket",
                    (pool_id, first, end))
        rows = [*before, *cursor.fetchall()]
    points: list[dict[str, Any]] = []
    current = dict.fromkeys(FIELDS, 0.0)
    i = 0
    for t in times:
        # Rows of buckets that start before T; at ``now``, every row (the current bucket's too).
        while i < len(rows) and (int(rows[i]["bucket"]) < t or t == end):
            current = {f: float(rows[i][f]) for f in FIELDS}
            i += 1
        points.append({"at": _iso(t), **{f: round(v) for f, v in current.items()}})
    return {"step": step, "points": points}


def _iso(seconds: int) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat().replace("+00:00", "Z")
