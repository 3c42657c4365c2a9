"""The index the earliest-start search reads: each node's first block, per GPU count and length.

Part of the free-GPU projection (``projections/free_gpus.py`` calls it in the same batch
transaction, after it changed a node's row or bookings), two tables:

* ``bc_fg_block``: per node, per length rung and per GPU count k, the node's first block
  (``domain/earliest.py``, ``first_blocks``): an interval (from, until) in which the node
  cannot start any request of k GPUs lasting at least the rung. Only the ends of the node's
  bookings move it. A request looking from ``t0`` inside the block cannot start on that node
  before ``until``: that is the node's lower bound, and the search reads nodes in ascending
  bound (an index range scan) and stops at the first bound later than the best start found.
* ``bc_fg_change``: per pool, the sequence of the last event that may have freed capacity
  in it (a booking ended, a node changed, the pool's quotas changed): what wakes the queue
  dispatcher (``api/controllers/queue.py``) for that pool only.

Reading (``timelines``): first every node whose bound is ``t0`` (it has no block, or ``t0``
is outside its first block: it may fit at ``t0``), then the nodes blocked at ``t0`` in
ascending ``until``, in small batches, each with its own bookings only.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterator
from typing import Any

from better_compute.domain.earliest import NEVER, RUNGS, Booking, Timeline, first_blocks, rung_for
from better_compute.domain.placement import FreeGpu
from better_compute.projections.framework import Sql

TABLES = [
    "CREATE TABLE IF NOT EXISTS bc_fg_block ("
    "node_id TEXT NOT NULL, pool_id TEXT NOT NULL, rung DOUBLE PRECISION NOT NULL, "
    "k INTEGER NOT NULL, from_at DOUBLE PRECISION NOT NULL, "
    "until_at DOUBLE PRECISION NOT NULL, PRIMARY KEY (node_id, rung, k))",
    "CREATE INDEX IF NOT EXISTS bc_fg_block_from ON bc_fg_block (pool_id, rung, k, from_at)",
    "CREATE INDEX IF NOT EXISTS bc_fg_block_until ON bc_fg_block "
    "(pool_id, rung, k, until_at, node_id)",
    "CREATE TABLE IF NOT EXISTS bc_fg_change (pool_id TEXT PRIMARY KEY, seq BIGINT NOT NULL)",
    "CREATE INDEX IF NOT EXISTS bc_fg_change_seq ON bc_fg_change (seq)",
]
TABLE_NAMES = ["bc_fg_block", "bc_fg_change"]
FIRST_BATCH = 4
MAX_BATCH = 64


def _bookings(rows: list[Any]) -> tuple[Booking, ...]:
    return tuple(
        Booking(str(b["allocation_id"]), frozenset(json.loads(b["gpus"])), float(b["start_at"]),
                float(b["end_at"]), int(b["cpus"]), int(b["memory_gib"]))
        for b in rows
    )


def refresh_blocks(sql: Sql, cursor: Any, node_id: str) -> None:
    """Recompute a node's blocks from its row and its live bookings (inside the batch)."""
    sql.execute(cursor, "SELECT pool_id, schedulable, gpus FROM bc_fg_node WHERE node_id = ?",
                (node_id,))
    node = cursor.fetchone()
    sql.execute(cursor, "DELETE FROM bc_fg_block WHERE node_id = ?", (node_id,))
    if node is None:
        return
    gpus = json.loads(node["gpus"])
    usable = [g["uuid"] for g in gpus if g["attributes"].get("healthy")]
    sql.execute(cursor, "SELECT allocation_id, gpus, start_at, end_at, cpus, memory_gib "
                "FROM bc_fg_booking WHERE node_id = ?", (node_id,))
    bookings = _bookings(list(cursor.fetchall()))
    rows = []
    for rung in RUNGS:
        for k, start, until in first_blocks(usable, len(gpus), bookings, rung,
                                            bool(node["schedulable"])):
            rows.append((node_id, str(node["pool_id"]), rung, k, start, until))
    if rows:
        cursor.executemany(sql.q("INSERT INTO bc_fg_block (node_id, pool_id, rung, k, from_at, "
                                 "until_at) VALUES (?, ?, ?, ?, ?, ?)"), rows)


def mark_changed(sql: Sql, cursor: Any, pool_id: str, sequence: int) -> None:
    """Capacity in ``pool_id`` may have grown at ``sequence``: the dispatcher looks again."""
    if not pool_id:
        return
    sql.execute(cursor, "INSERT INTO bc_fg_change (pool_id, seq) VALUES (?, ?) "
                "ON CONFLICT (pool_id) DO UPDATE SET seq = excluded.seq", (pool_id, sequence))


def changed_pools(sql: Sql, after: int) -> dict[str, int]:
    """Pools whose capacity may have grown after sequence ``after``, with the sequence."""
    with sql.transaction(commit=False) as cursor:
        sql.execute(cursor, "SELECT pool_id, seq FROM bc_fg_change WHERE seq > ?", (after,))
        return {str(r["pool_id"]): int(r["seq"]) for r in cursor.fetchall()}


def _load(sql: Sql, cursor: Any, bounds: list[tuple[str, float]],
          exclude_allocation: str | None) -> list[Timeline]:
    if not bounds:
        return []
    ids = [node_id for node_id, _ in bounds]
    marks = ", ".join("?" for _ in ids)
    sql.execute(cursor, "SELECT node_id, gpus, cpus_per_gpu, memory_gib_per_gpu, schedulable "
                f"FROM bc_fg_node WHERE node_id IN ({marks})", ids)
    nodes = {str(r["node_id"]): r for r in cursor.fetchall()}
    sql.execute(cursor, "SELECT node_id, allocation_id, gpus, start_at, end_at, cpus, memory_gib "
                f"FROM bc_fg_booking WHERE node_id IN ({marks})", ids)
    held: dict[str, list[Any]] = {}
    for row in cursor.fetchall():
        if row["allocation_id"] != exclude_allocation:
            held.setdefault(str(row["node_id"]), []).append(row)
    out = []
    for node_id, bound in bounds:
        row = nodes.get(node_id)
        if row is None or not row["schedulable"]:
            continue
        gpus = json.loads(row["gpus"])
        usable = tuple(FreeGpu(g["uuid"], int(g["index"]), g["attributes"]) for g in gpus
                       if g["attributes"].get("healthy"))
        out.append(Timeline(node_id, usable, len(gpus), int(row["cpus_per_gpu"]),
                            int(row["memory_gib_per_gpu"]),
                            _bookings(held.get(node_id, [])), bound))
    return out


def timeline_of(sql: Sql, node_id: str, exclude_allocation: str | None = None
                ) -> Timeline | None:
    """One node's timeline (its bound: none), for checks on a node already chosen."""
    with sql.transaction(commit=False) as cursor:
        found = _load(sql, cursor, [(node_id, -NEVER)], exclude_allocation)
    return found[0] if found else None


def timelines(sql: Sql, pool_id: str, gpus: int, length: float, not_before: float, *,
              force: Collection[str] = (), exclude_allocation: str | None = None
              ) -> Iterator[Timeline]:
    """The pool's nodes in ascending lower bound for a request of ``gpus`` x ``length``.

    ``force``: nodes read first with the bound ``not_before`` whatever their blocks say (the
    node of a booking the caller pretends away with ``exclude_allocation``).
    """
    rung = rung_for(length)
    with sql.transaction(commit=False) as cursor:
        seen: set[str] = set()
        first = [(node_id, not_before) for node_id in sorted(force)]
        if rung is None:  # shorter than every rung: no bound, every node may fit at t0
            sql.execute(cursor, "SELECT node_id FROM bc_fg_node WHERE pool_id = ? "
                        "AND schedulable = 1 ORDER BY node_id", (pool_id,))
            first += [(str(r["node_id"]), not_before) for r in cursor.fetchall()]
        else:
            sql.execute(
                cursor,
                "SELECT node_id FROM bc_fg_block WHERE pool_id = ? AND rung = ? AND k = ? "
                "AND from_at >= ? UNION SELECT node_id FROM bc_fg_block WHERE pool_id = ? "
                "AND rung = ? AND k = ? AND until_at <= ?",
                (pool_id, rung, gpus, not_before, pool_id, rung, gpus, not_before),
            )
            first += sorted((str(r["node_id"]), not_before) for r in cursor.fetchall())
        for start in range(0, len(first), MAX_BATCH):
            for timeline in _load(sql, cursor, _unseen(first[start:start + MAX_BATCH], seen),
                                  exclude_allocation):
                yield timeline
        if rung is None:
            return
        last: tuple[float, str] = (not_before, "")
        size = FIRST_BATCH
        while True:
            sql.execute(
                cursor,
                "SELECT node_id, until_at FROM bc_fg_block WHERE pool_id = ? AND rung = ? "
                "AND k = ? AND until_at < ? AND from_at < ? "
                "AND (until_at > ? OR (until_at = ? AND node_id > ?)) "
                f"ORDER BY until_at, node_id LIMIT {int(size)}",
                (pool_id, rung, gpus, NEVER, not_before, last[0], last[0], last[1]),
            )
            rows = [(str(r["node_id"]), float(r["until_at"])) for r in cursor.fetchall()]
            if not rows:
                return
            last = (rows[-1][1], rows[-1][0])
            for timeline in _load(sql, cursor, _unseen(rows, seen), exclude_allocation):
                yield timeline
            size = min(size * 2, MAX_BATCH)


def _unseen(bounds: list[tuple[str, float]], seen: set[str]) -> list[tuple[str, float]]:
    out = [(n, b) for n, b in bounds if n not in seen]
    seen.update(n for n, _ in out)
    return out

