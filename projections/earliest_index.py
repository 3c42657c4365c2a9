"""The index the earliest-start search reads: per node and GPU count, its block and windows.

Part of the free-GPU projection (``projections/free_gpus.py`` calls it once per node a batch
changed, in the batch's transaction), three tables, from ``domain/earliest.py``'s
``node_index``:

* ``bc_fg_block``: per node and GPU count k, the node's first block [from, until): the first
  interval in which fewer than k of its usable GPUs are free. A node whose first block holds
  ``t0`` cannot start a request of k GPUs before ``until``; any other node may fit at ``t0``.
* ``bc_fg_end``: per node and k, the ends of its bookings after which at least k GPUs are
  free, each with ``free_for``, how long the k-th longest-free of them stays free, and a
  length class (log2 of ``free_for`` in minutes). A node blocked at ``t0`` cannot start a
  request of k GPUs for L before its first end after ``t0`` with ``free_for >= L``: that is
  its lower bound, exact for the GPUs (selectors, NVLink and host share only make it later).
* ``bc_fg_change``: per pool, the sequence of the last event that may have freed capacity
  in it (a booking ended, a node changed, the pool's quotas changed): what wakes the queue
  dispatcher (``api/controllers/queue.py``) for that pool only.
* ``bc_fg_stale``: the nodes whose bookings or row changed since their blocks and ends were
  last computed. A batch only marks a node here; its blocks are recomputed when the index is
  settled (``settle``: by the queue dispatcher's pass, at least every tick, and before every
  search), once per node however many of the node's events came in between: a node
  fills up one create at a time (the placer packs the fullest nodes first), and creates
  that start now never read the blocks.

Reading (``timelines``): first the stale nodes of the pool (a batch committed after the
search settled the index), with the lowest bound, ``t0``, which is always right for them;
then the nodes that may fit at ``t0`` (not blocked there: two index
range scans, empty when the pool is full), then the blocked nodes in ascending bound, merged
from one index range scan per length class that can hold the request, a few at a time; each
node is read with its own bookings only. The search stops reading at the first bound later
than the best start found.
"""

from __future__ import annotations

import heapq
from collections.abc import Collection, Generator, Iterator
from typing import Any

from better_compute.domain.earliest import NEVER, Booking, Timeline, node_index
from better_compute.projections.framework import Sql
from better_compute.projections.gpu_columns import parsed_booking_gpus, parsed_node_gpus

TABLES = [
    "CREATE TABLE IF NOT EXISTS bc_fg_block ("
    "node_id TEXT NOT NULL, pool_id TEXT NOT NULL, k INTEGER NOT NULL, "
    "from_at DOUBLE PRECISION NOT NULL, until_at DOUBLE PRECISION NOT NULL, "
    "PRIMARY KEY (node_id, k))",
    "CREATE INDEX IF NOT EXISTS bc_fg_block_from ON bc_fg_block (pool_id, k, from_at)",
    "CREATE INDEX IF NOT EXISTS bc_fg_block_until ON bc_fg_block (pool_id, k, until_at)",
    "CREATE TABLE IF NOT EXISTS bc_fg_end ("
    "node_id TEXT NOT NULL, pool_id TEXT NOT NULL, k INTEGER NOT NULL, "
    "at DOUBLE PRECISION NOT NULL, free_for DOUBLE PRECISION NOT NULL, "
    "class INTEGER NOT NULL, PRIMARY KEY (node_id, k, at))",
    "CREATE INDEX IF NOT EXISTS bc_fg_end_walk ON bc_fg_end (pool_id, k, class, at, node_id)",
    "CREATE TABLE IF NOT EXISTS bc_fg_change (pool_id TEXT PRIMARY KEY, seq BIGINT NOT NULL)",
    "CREATE INDEX IF NOT EXISTS bc_fg_change_seq ON bc_fg_change (seq)",
    "CREATE TABLE IF NOT EXISTS bc_fg_stale (node_id TEXT PRIMARY KEY, pool_id TEXT NOT NULL)",
]
TABLE_NAMES = ["bc_fg_block", "bc_fg_end", "bc_fg_change", "bc_fg_stale"]
FIRST_BATCH = 1
MAX_BATCH = 64
LONGEST = 24  # the class of every length of 2^23 minutes (16 years) or longer
ENDLESS = 99  # the class of "free for ever"


def length_class(length: float) -> int:
    """log2 of a length in whole minutes, +1 (0: under a minute); ENDLESS for NEVER."""
    if length >= NEVER / 2:
        return ENDLESS
    return min(int(length // 60).bit_length(), LONGEST)


def _bookings(rows: list[Any]) -> tuple[Booking, ...]:
    return tuple(
        Booking(str(b["allocation_id"]), parsed_booking_gpus(b["gpus"]), float(b["start_at"]),
                float(b["end_at"]), int(b["cpus"]), int(b["memory_gib"]))
        for b in rows
    )


MARK_STALE = "INSERT INTO bc_fg_stale (node_id, pool_id)"
MARKED_AGAIN = "ON CONFLICT (node_id) DO UPDATE SET pool_id = excluded.pool_id"


def mark_stale(sql: Sql, cursor: Any, node_ids: list[str]) -> None:
    """``node_ids``' blocks and ends no longer agree with their rows or bookings (those with a
    row in the index), in one statement."""
    marks = ", ".join("?" for _ in node_ids)
    sql.execute(cursor, f"{MARK_STALE} SELECT node_id, pool_id FROM bc_fg_node "
                f"WHERE node_id IN ({marks}) {MARKED_AGAIN}", node_ids)


def unsettled(sql: Sql, cursor: Any) -> bool:
    """Whether some node's blocks wait to be recomputed."""
    sql.execute(cursor, "SELECT 1 AS one FROM bc_fg_stale LIMIT 1")
    return cursor.fetchone() is not None


def settle(sql: Sql, cursor: Any) -> int:
    """Recompute the blocks and ends of every stale node; how many nodes. Runs under the
    free-GPU projection's lock (``ReadModels.settle``)."""
    # The marks read are locked (PostgreSQL): a save that marks one of these nodes again
    # meanwhile (the index is kept inline, in saves that take no lock of this read model)
    # waits, and marks it afresh after this commits; one that marks another node is left.
    sql.execute(cursor, "SELECT node_id FROM bc_fg_stale ORDER BY node_id"
                + (" FOR UPDATE" if sql.postgres else ""))
    stale = [str(row["node_id"]) for row in cursor.fetchall()]
    for node_id in stale:
        refresh_blocks(sql, cursor, node_id)
    if stale:
        marks = ", ".join("?" for _ in stale)
        sql.execute(cursor, f"DELETE FROM bc_fg_stale WHERE node_id IN ({marks})", stale)
    return len(stale)


def refresh_blocks(sql: Sql, cursor: Any, node_id: str) -> None:
    """Recompute a node's blocks from its row and its live bookings (when settling).

    Only the rows that changed are written: a booking changes a few of a node's ~45 rows
    (the blocks of the GPU counts it fills, the ends it shortens, its own end's), so a
    create writes ~16 rows instead of deleting and inserting them all, in at most four
    statements.
    """
    sql.execute(cursor, "SELECT pool_id, schedulable, gpus, cpus_per_gpu, memory_gib_per_gpu "
                "FROM bc_fg_node WHERE node_id = ?", (node_id,))
    node = cursor.fetchone()
    if node is None:
        sql.execute(cursor, "DELETE FROM bc_fg_block WHERE node_id = ?", (node_id,))
        sql.execute(cursor, "DELETE FROM bc_fg_end WHERE node_id = ?", (node_id,))
        return
    gpus = parsed_node_gpus(node["gpus"])
    usable = gpus.healthy_uuids
    sql.execute(cursor, "SELECT allocation_id, gpus, start_at, end_at, cpus, memory_gib "
                "FROM bc_fg_booking WHERE node_id = ?", (node_id,))
    bookings = _bookings(list(cursor.fetchall()))
    pool_id = str(node["pool_id"])
    blocks, ends = node_index(usable, gpus.count, bookings, bool(node["schedulable"]),
                              int(node["cpus_per_gpu"]), int(node["memory_gib_per_gpu"]))
    new_blocks = {k: (a, b) for k, a, b in blocks}
    new_ends = {(k, at): free_for for k, at, free_for in ends}
    sql.execute(cursor, "SELECT pool_id, k, from_at, until_at FROM bc_fg_block "
                "WHERE node_id = ?", (node_id,))
    rows = cursor.fetchall()
    old_blocks = {int(r["k"]): (float(r["from_at"]), float(r["until_at"])) for r in rows}
    moved = any(str(r["pool_id"]) != pool_id for r in rows)
    sql.execute(cursor, "SELECT pool_id, k, at, free_for FROM bc_fg_end WHERE node_id = ?",
                (node_id,))
    rows = cursor.fetchall()
    old_ends = {(int(r["k"]), float(r["at"])): float(r["free_for"]) for r in rows}
    if moved or any(str(r["pool_id"]) != pool_id for r in rows):  # every row names the pool
        old_blocks, old_ends = {}, {}
        sql.execute(cursor, "DELETE FROM bc_fg_block WHERE node_id = ?", (node_id,))
        sql.execute(cursor, "DELETE FROM bc_fg_end WHERE node_id = ?", (node_id,))
    _write_changes(sql, cursor, node_id, pool_id, old_blocks, new_blocks, old_ends, new_ends)


def _write_changes(sql: Sql, cursor: Any, node_id: str, pool_id: str,
                   old_blocks: dict[int, tuple[float, float]],
                   new_blocks: dict[int, tuple[float, float]],
                   old_ends: dict[tuple[int, float], float],
                   new_ends: dict[tuple[int, float], float]) -> None:
    """The rows of ``node_id`` that changed, a statement per kind of change (not per row)."""
    gone = [k for k in old_blocks if k not in new_blocks]
    if gone:
        sql.execute(cursor, f"DELETE FROM bc_fg_block WHERE node_id = ? AND k IN "
                    f"({', '.join('?' for _ in gone)})", [node_id, *gone])
    changed = [(node_id, pool_id, k, a, b) for k, (a, b) in new_blocks.items()
               if old_blocks.get(k) != (a, b)]
    if changed:
        sql.execute(cursor, "INSERT INTO bc_fg_block (node_id, pool_id, k, from_at, until_at) "
                    f"VALUES {', '.join('(?, ?, ?, ?, ?)' for _ in changed)} "
                    "ON CONFLICT (node_id, k) DO UPDATE SET "
                    "from_at = excluded.from_at, until_at = excluded.until_at",
                    [value for row in changed for value in row])
    ended = [(k, at) for k, at in old_ends if (k, at) not in new_ends]
    if ended:
        sql.execute(cursor, "DELETE FROM bc_fg_end WHERE node_id = ? AND (k, at) IN "
                    f"(VALUES {', '.join('(?, ?)' for _ in ended)})",
                    [node_id, *(value for row in ended for value in row)])
    changed_ends = [(node_id, pool_id, k, at, free_for, length_class(free_for))
                    for (k, at), free_for in new_ends.items() if old_ends.get((k, at)) != free_for]
    if changed_ends:
        sql.execute(cursor, "INSERT INTO bc_fg_end (node_id, pool_id, k, at, free_for, class) "
                    f"VALUES {', '.join('(?, ?, ?, ?, ?, ?)' for _ in changed_ends)} "
                    "ON CONFLICT (node_id, k, at) DO UPDATE SET "
                    "free_for = excluded.free_for, class = excluded.class",
                    [value for row in changed_ends for value in row])


def mark_changed(sql: Sql, cursor: Any, pool_id: str, sequence: int) -> None:
    """Capacity in ``pool_id`` may have grown at ``sequence``: the dispatcher looks again."""
    if not pool_id:
        return
    sql.execute(cursor, "INSERT INTO bc_fg_change (pool_id, seq) VALUES (?, ?) "
                "ON CONFLICT (pool_id) DO UPDATE SET seq = excluded.seq", (pool_id, sequence))


def mark_node_changed(sql: Sql, cursor: Any, node_id: str, sequence: int) -> None:
    """``mark_changed`` for the pool of ``node_id``'s index row, without reading it first."""
    sql.execute(cursor, "INSERT INTO bc_fg_change (pool_id, seq) SELECT pool_id, ? "
                "FROM bc_fg_node WHERE node_id = ? AND pool_id <> '' "
                "ON CONFLICT (pool_id) DO UPDATE SET seq = excluded.seq", (sequence, node_id))


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
        gpus = parsed_node_gpus(row["gpus"])
        out.append(Timeline(node_id, gpus.healthy, gpus.count, int(row["cpus_per_gpu"]),
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
              ) -> Generator[Timeline, None, None]:
    """The pool's nodes in ascending lower bound for a request of ``gpus`` x ``length``.

    ``force``: nodes read first with the bound ``not_before`` whatever the index says (the
    node of a booking the caller pretends away with ``exclude_allocation``). The pool's stale
    nodes (``bc_fg_stale``: changed after the caller settled the index) are read first too:
    their blocks may be out of date, and ``not_before`` is a lower bound for any node.
    """
    with sql.transaction(commit=False) as cursor:
        seen: set[str] = set()
        sql.execute(cursor, "SELECT node_id FROM bc_fg_stale WHERE pool_id = ?", (pool_id,))
        force = {*force, *(str(r["node_id"]) for r in cursor.fetchall())}
        sql.execute(
            cursor,
            "SELECT node_id FROM bc_fg_block WHERE pool_id = ? AND k = ? AND from_at > ? "
            "UNION SELECT node_id FROM bc_fg_block WHERE pool_id = ? AND k = ? AND until_at <= ?",
            (pool_id, gpus, not_before, pool_id, gpus, not_before),
        )
        first = list(dict.fromkeys(
            [*sorted(force), *sorted(str(r["node_id"]) for r in cursor.fetchall())]))
        free_now = [(node_id, not_before) for node_id in first]
        for start in range(0, len(free_now), MAX_BATCH):
            yield from _load(sql, cursor, _unseen(free_now[start:start + MAX_BATCH], seen),
                             exclude_allocation)
        batch: list[tuple[str, float]] = []
        size = FIRST_BATCH
        for at, node_id in _ends(sql, cursor, pool_id, gpus, length, not_before):
            if node_id in seen or any(n == node_id for n, _ in batch):
                continue
            batch.append((node_id, at))
            if len(batch) >= size:
                yield from _load(sql, cursor, _unseen(batch, seen), exclude_allocation)
                batch, size = [], min(size * 2, MAX_BATCH)
        yield from _load(sql, cursor, _unseen(batch, seen), exclude_allocation)


_END_SCAN = (
    "SELECT * FROM (SELECT at, node_id, class FROM bc_fg_end WHERE pool_id = ? AND k = ? "
    "AND class = ? AND (at > ? OR (at = ? AND node_id > ?)) AND at > ? AND free_for >= ? "
    "ORDER BY at, node_id LIMIT {size}) AS e{n}"
)


def _ends(sql: Sql, cursor: Any, pool_id: str, gpus: int, length: float, not_before: float
          ) -> Iterator[tuple[float, str]]:
    """(at, node) of the booking ends after ``not_before`` that leave ``gpus`` GPUs free for
    ``length``, ascending: one index range scan per length class that can hold ``length`` (a
    few rows at a time, the first rows of every class in one statement), merged."""
    least = length_class(length)
    keys = {cls: (not_before, "") for cls in [*range(least, LONGEST + 1), ENDLESS]}
    buffers: dict[int, list[tuple[float, str]]] = {}
    size = FIRST_BATCH

    def fetch(classes: list[int]) -> None:
        statement, params = [], []
        for n, cls in enumerate(classes):
            statement.append(_END_SCAN.format(size=size, n=n))
            start, node = keys[cls]
            params += [pool_id, gpus, cls, start, start, node, not_before,
                       length if cls == least else 0.0]
        sql.execute(cursor, " UNION ALL ".join(statement), params)
        got: dict[int, list[tuple[float, str]]] = {cls: [] for cls in classes}
        for row in cursor.fetchall():
            got[int(row["class"])].append((float(row["at"]), str(row["node_id"])))
        for cls, rows in got.items():
            rows.sort()
            if len(rows) < size:
                keys.pop(cls)  # this class has no more windows
            else:
                keys[cls] = rows[-1]
            buffers[cls] = rows

    fetch(list(keys))
    heads = [(rows[0], cls) for cls, rows in buffers.items() if rows]
    heapq.heapify(heads)
    while heads:
        item, cls = heapq.heappop(heads)
        yield item
        rows = buffers[cls]
        rows.pop(0)
        if not rows and cls in keys:
            size = min(size * 2, MAX_BATCH)
            fetch([cls])
            rows = buffers[cls]
        if rows:
            heapq.heappush(heads, (rows[0], cls))


def _unseen(bounds: list[tuple[str, float]], seen: set[str]) -> list[tuple[str, float]]:
    out = [(n, b) for n, b in bounds if n not in seen]
    seen.update(n for n, _ in out)
    return out

