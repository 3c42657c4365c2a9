"""The free-GPU index: what the placer reads instead of loading nodes.

Two tables, changed together in the projection's batch transaction:

* ``bc_fg_node``: one row per node: its pool, whether the placer may use it
  (``Node.schedulable``, i.e. ``placement_eligible`` in domain/node_rules.py: adopted,
  reachable, not cordoned or draining, some GPU healthy),
  its GPUs with the attributes selectors see and their health, the per-GPU
  share of host CPUs and memory (domain/host_share.py), and ``free_now``:
  healthy GPUs that no live booking holds at any time. The row keeps a
  snapshot of the Node aggregate, so every ``node.*`` event is applied by the
  aggregate's own code and the index always agrees with ``Node.schedulable`` (except the
  holds, ``node.devices.*``, which change nothing kept here and are not applied).
* ``bc_fg_booking``: one row per live booking (``bookings.*`` events): node,
  GPUs, host resources and the interval [start, end) in epoch seconds.

``projections/earliest_index.py`` keeps, in the same batches, the pools whose capacity may
have grown (what wakes the queue dispatcher) and which nodes changed; each node's first
blocks (what the earliest-start search reads) are recomputed from these tables when the index
is settled (``settle``), not in every batch. Version 2 added those tables (rebuilt from
sequence 0); version 4 the stale nodes.

``candidates(pool, start, end, need)`` first reads the few schedulable nodes
with the fewest ``free_now`` GPUs that still have ``need`` (an index range
scan: its cost does not grow with the fleet), then only the bookings of those
nodes that overlap the interval. Only when none of them fits (filters, future
bookings) does ``all_candidates`` read every schedulable node of the pool.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from better_compute.domain.host_share import host_share
from better_compute.domain.ids import public_id
from better_compute.domain.placement import Candidate, gpu_attributes
from better_compute.projections import earliest_index, jsontext
from better_compute.projections.framework import ReadModel, SnapshotCodec, Sql, after_event
from better_compute.projections.gpu_columns import parsed_booking_gpus, parsed_node_gpus

FAST_PATH_NODES = 16
# A node's device holds (``node.devices.*``, written by every binding and release) change
# nothing the index keeps (GPUs, host, schedulability; what is free comes from bookings): they
# are not applied, so the row's snapshot is the node as of its last other event, which no
# other node event's code reads (version 3).
_HOLDS = "node.devices."


def epoch(value: datetime) -> float:
    return value.timestamp()


def _hardware_number(hardware: dict[str, Any], *names: str) -> float | None:
    for name in names:
        value = hardware.get(name)
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
    return None


def node_gpus(gpus: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The node's GPUs as the index keeps them: uuid, index and selector attributes."""
    out = []
    for position, gpu in enumerate(gpus):
        doc = dict(gpu)
        if "memoryMiB" not in doc and "memoryMib" in doc:
            doc["memoryMiB"] = doc["memoryMib"]
        doc.setdefault("index", position)
        out.append({"uuid": str(doc.get("uuid")), "index": int(doc["index"]),
                    "attributes": gpu_attributes(doc)})
    return out


class FreeGpus(ReadModel):
    name = "free_gpus"
    # 2: the earliest-start index (earliest_index.py); 3: holds not applied; 4: blocks settled;
    # 5: kept inline, in the transaction of every save (projections/framework.py)
    version = 5

    def __init__(self, codec: SnapshotCodec) -> None:
        self.codec = codec
        # Nodes whose free_now and blocks are recomputed once, at the end of the batch (a
        # batch holds the projection's lock, so one batch at a time writes this).
        self._touched: dict[str, None] = {}
        # Each node's pool as the batch read or wrote it (node events: read once per batch).
        self._rows: dict[str, str] = {}

    def begin_batch(self) -> None:
        self._touched, self._rows = {}, {}

    def table_names(self) -> list[str]:
        return ["bc_fg_node", "bc_fg_booking", *earliest_index.TABLE_NAMES]

    def tables(self) -> list[str]:
        return [
            "CREATE TABLE IF NOT EXISTS bc_fg_node ("
            "node_id TEXT PRIMARY KEY, uuid TEXT NOT NULL, pool_id TEXT NOT NULL, "
            "tenant_id TEXT NOT NULL, schedulable INTEGER NOT NULL, gpus TEXT NOT NULL, "
            "healthy_gpus INTEGER NOT NULL, free_now INTEGER NOT NULL, "
            "cpus_per_gpu INTEGER NOT NULL, memory_gib_per_gpu INTEGER NOT NULL, "
            "version BIGINT NOT NULL, snapshot_topic TEXT NOT NULL, snapshot TEXT NOT NULL)",
            "CREATE INDEX IF NOT EXISTS bc_fg_node_pick ON bc_fg_node "
            "(pool_id, schedulable, free_now, node_id)",
            "CREATE TABLE IF NOT EXISTS bc_fg_booking ("
            "allocation_id TEXT PRIMARY KEY, node_id TEXT NOT NULL, pool_id TEXT NOT NULL, "
            "holder TEXT NOT NULL, reservation_id TEXT NOT NULL, gpus TEXT NOT NULL, "
            "cpus INTEGER NOT NULL, memory_gib INTEGER NOT NULL, "
            "start_at DOUBLE PRECISION NOT NULL, end_at DOUBLE PRECISION NOT NULL)",
            "CREATE INDEX IF NOT EXISTS bc_fg_booking_node ON bc_fg_booking (node_id)",
            *earliest_index.TABLES,
        ]

    def wants(self, event_type: type[Any]) -> bool:
        kind = str(event_type.TOPIC)
        return not kind.startswith(_HOLDS) and kind.startswith(("node.", "bookings.",
                                                                "pool.offered"))

    def apply(self, sql: Sql, cursor: Any, sequence: int, event: Any) -> None:
        """Booking events are written without a read (the node's pool comes from its row in
        the statement): applied inside a save's own transaction (inline), they cost the save
        no round trip to the database."""
        kind = str(type(event).TOPIC)
        if kind.startswith(_HOLDS):
            return  # every binding and release: nothing this index keeps changes
        if kind.startswith("node."):
            self._node_event(sql, cursor, event)
            node_id = public_id("node", event.originator_id)
            earliest_index.mark_changed(sql, cursor, self._pool_of(sql, cursor, node_id), sequence)
        elif kind == "bookings.booked":
            node_id = str(event.node_id)
            sql.execute(
                cursor,
                "INSERT INTO bc_fg_booking (allocation_id, node_id, pool_id, holder, "
                "reservation_id, gpus, cpus, memory_gib, start_at, end_at) "
                "VALUES (?, ?, COALESCE((SELECT pool_id FROM bc_fg_node WHERE node_id = ?), ''), "
                "?, ?, ?, ?, ?, ?, ?)",
                (event.allocation_id, node_id, node_id, event.holder,
                 event.reservation_id, jsontext.dumps(list(event.gpus)), int(event.cpus),
                 int(event.memory_gib), epoch(event.start), epoch(event.end)),
            )
            self._touched[node_id] = None
        elif kind == "bookings.extended":
            sql.execute(cursor, "UPDATE bc_fg_booking SET end_at = ? WHERE allocation_id = ?",
                        (epoch(event.end), event.allocation_id))
            self._touched[str(event.node_id)] = None
        elif kind == "bookings.ended":
            node_id = str(event.node_id)
            sql.execute(cursor, "DELETE FROM bc_fg_booking WHERE allocation_id = ?",
                        (event.allocation_id,))
            self._touched[node_id] = None
            earliest_index.mark_node_changed(sql, cursor, node_id, sequence)
        elif kind == "pool.offered":  # a quota changed: queued reservations may fit
            earliest_index.mark_changed(sql, cursor, public_id("pool", event.originator_id),
                                        sequence)

    def _pool_of(self, sql: Sql, cursor: Any, node_id: str) -> str:
        """The node's pool as its index row says (read once per batch); "" without a row."""
        kept = self._rows.get(node_id)
        if kept is None:
            sql.execute(cursor, "SELECT pool_id FROM bc_fg_node WHERE node_id = ?", (node_id,))
            row = cursor.fetchone()
            kept = self._rows[node_id] = str(row["pool_id"]) if row else ""
        return kept

    def _node_event(self, sql: Sql, cursor: Any, event: Any) -> None:
        node_id = public_id("node", event.originator_id)
        if event.originator_version == 1:
            node = event.mutate(None)
            exists = False
        else:
            sql.execute(cursor, "SELECT snapshot_topic, snapshot FROM bc_fg_node WHERE node_id = ?",
                        (node_id,))
            row = cursor.fetchone()
            if row is None:
                return
            node = after_event(self.codec, row, event)
            exists = True
        gpus = node_gpus(list(node.gpus))
        hardware = dict(getattr(node, "hardware", {}) or {})
        share = host_share(
            int(_hardware_number(hardware, "cpus") or 0),
            _hardware_number(hardware, "memoryGiB", "memoryGib"), len(gpus),
        )
        healthy = sum(1 for g in gpus if g["attributes"].get("healthy"))
        schedulable = node.schedulable
        topic, state = self.codec.snapshot(node)
        gpus_text = jsontext.dumps(gpus)
        params = (str(event.originator_id), node.pool_id, node.tenant_id, int(schedulable),
                  gpus_text, healthy, share.cpus_per_gpu, share.memory_gib_per_gpu,
                  node.version, topic, state, node_id)
        if exists:
            sql.execute(
                cursor,
                "UPDATE bc_fg_node SET uuid = ?, pool_id = ?, tenant_id = ?, schedulable = ?, "
                "gpus = ?, healthy_gpus = ?, cpus_per_gpu = ?, memory_gib_per_gpu = ?, "
                "version = ?, snapshot_topic = ?, snapshot = ? WHERE node_id = ?",
                params,
            )
        else:
            sql.execute(
                cursor,
                "INSERT INTO bc_fg_node (uuid, pool_id, tenant_id, schedulable, gpus, "
                "healthy_gpus, cpus_per_gpu, memory_gib_per_gpu, version, snapshot_topic, "
                "snapshot, node_id, free_now) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 0)",
                params,
            )
        self._rows[node_id] = node.pool_id  # as written
        self._touched[node_id] = None

    def end_batch(self, sql: Sql, cursor: Any) -> None:
        touched, self._touched = list(self._touched), {}
        self._rows = {}
        if touched:
            refresh_free(sql, cursor, touched)

    def unsettled(self, sql: Sql, cursor: Any) -> bool:
        return earliest_index.unsettled(sql, cursor)

    def settle(self, sql: Sql, cursor: Any) -> int:
        """The earliest-start index's blocks of the nodes changed since it was last settled."""
        return earliest_index.settle(sql, cursor)


# ``free_now`` of a node: its healthy GPUs that no live booking holds, counted in SQL from the
# JSON columns (``gpus`` of the node: [{"uuid", "attributes": {"healthy"}}]; of a booking:
# the UUIDs it holds), so that a batch, or a save that applies the index inline, writes it
# without reading the node's rows first.
_FREE_NOW = {
    "sqlite": "SELECT COUNT(*) FROM json_each(bc_fg_node.gpus) AS g "
              "WHERE json_extract(g.value, '$.attributes.healthy') "
              "AND json_extract(g.value, '$.uuid') NOT IN (SELECT h.value FROM bc_fg_booking "
              "AS b, json_each(b.gpus) AS h WHERE b.node_id = bc_fg_node.node_id)",
    "postgres": "SELECT COUNT(*) FROM jsonb_array_elements(bc_fg_node.gpus::jsonb) AS g(v) "
                "WHERE COALESCE((g.v -> 'attributes' ->> 'healthy')::boolean, false) "
                "AND (g.v ->> 'uuid') NOT IN (SELECT jsonb_array_elements_text(b.gpus::jsonb) "
                "FROM bc_fg_booking AS b WHERE b.node_id = bc_fg_node.node_id)",
}


def refresh_free(sql: Sql, cursor: Any, node_ids: list[str]) -> None:
    """``free_now`` of ``node_ids`` recomputed, and their earliest-start blocks marked stale:
    one statement on PostgreSQL (a round trip's worth), two on SQLite (which has no
    writing CTE), whatever the count."""
    marks = ", ".join("?" for _ in node_ids)
    update = (f"UPDATE bc_fg_node SET free_now = "
              f"({_FREE_NOW['postgres' if sql.postgres else 'sqlite']}) "
              f"WHERE node_id IN ({marks})")
    if sql.postgres:
        sql.execute(cursor, f"WITH touched AS ({update} RETURNING node_id, pool_id) "
                    f"{earliest_index.MARK_STALE} SELECT node_id, pool_id FROM touched "
                    f"WHERE true {earliest_index.MARKED_AGAIN}", node_ids)
        return
    sql.execute(cursor, update, node_ids)
    earliest_index.mark_stale(sql, cursor, node_ids)


def _candidates(sql: Sql, cursor: Any, rows: list[Any], start: datetime, end: datetime
                ) -> list[Candidate]:
    if not rows:
        return []
    ids = [str(r["node_id"]) for r in rows]
    marks = ", ".join("?" for _ in ids)
    sql.execute(
        cursor,
        f"SELECT node_id, gpus, cpus, memory_gib FROM bc_fg_booking WHERE node_id IN ({marks}) "
        "AND start_at < ? AND end_at > ?",
        (*ids, epoch(end), epoch(start)),
    )
    return _with_bookings(rows, cursor.fetchall())


def _with_bookings(rows: list[Any], bookings: list[Any]) -> list[Candidate]:
    """The candidates of node ``rows``, with what ``bookings`` (those overlapping the
    interval, of any of them) leave free."""
    taken: dict[str, set[str]] = {}
    host: dict[str, list[int]] = {}
    for b in bookings:
        taken.setdefault(str(b["node_id"]), set()).update(parsed_booking_gpus(b["gpus"]))
        used = host.setdefault(str(b["node_id"]), [0, 0])
        used[0] += int(b["cpus"])
        used[1] += int(b["memory_gib"])
    out = []
    for row in rows:
        node_id = str(row["node_id"])
        gpus = parsed_node_gpus(row["gpus"])
        busy = taken.get(node_id)
        free = tuple(g for g in gpus.healthy if g.uuid not in busy) if busy else gpus.healthy
        used_cpus, used_mem = host.get(node_id, [0, 0])
        cpus_per_gpu, mem_per_gpu = int(row["cpus_per_gpu"]), int(row["memory_gib_per_gpu"])
        out.append(Candidate(
            node_id=node_id, free_gpus=free, cpus_per_gpu=cpus_per_gpu,
            memory_gib_per_gpu=mem_per_gpu,
            free_cpus=cpus_per_gpu * gpus.count - used_cpus,
            free_memory_gib=mem_per_gpu * gpus.count - used_mem, gpu_count=gpus.count,
        ))
    return out


def fast_candidates(sql: Sql, pool_id: str, start: datetime, end: datetime, need: int,
                    limit: int = FAST_PATH_NODES) -> list[Candidate]:
    """The schedulable nodes with the fewest free GPUs that still have ``need`` free now,
    with their bookings that overlap [start, end): one statement."""
    with sql.transaction(commit=False) as cursor:
        sql.execute(
            cursor,
            "SELECT n.node_id, n.gpus, n.cpus_per_gpu, n.memory_gib_per_gpu, "
            "b.node_id AS booked, b.gpus AS booking_gpus, b.cpus, b.memory_gib "
            "FROM (SELECT node_id, gpus, cpus_per_gpu, memory_gib_per_gpu, free_now "
            "FROM bc_fg_node WHERE pool_id = ? AND schedulable = 1 AND free_now >= ? "
            f"ORDER BY free_now, node_id LIMIT {int(limit)}) AS n "
            "LEFT JOIN bc_fg_booking AS b ON b.node_id = n.node_id "
            "AND b.start_at < ? AND b.end_at > ? ORDER BY n.free_now, n.node_id",
            (pool_id, need, epoch(end), epoch(start)),
        )
        joined = cursor.fetchall()
    rows = list({str(r["node_id"]): r for r in joined}.values())  # in order, once each
    bookings = [{"node_id": r["booked"], "gpus": r["booking_gpus"], "cpus": r["cpus"],
                 "memory_gib": r["memory_gib"]} for r in joined if r["booked"] is not None]
    return _with_bookings(rows, bookings)


def all_candidates(sql: Sql, pool_id: str, start: datetime, end: datetime) -> list[Candidate]:
    """Every schedulable node of the pool, with what is free on it for [start, end)."""
    with sql.transaction(commit=False) as cursor:
        sql.execute(
            cursor,
            "SELECT node_id, gpus, cpus_per_gpu, memory_gib_per_gpu FROM bc_fg_node "
            "WHERE pool_id = ? AND schedulable = 1 ORDER BY node_id",
            (pool_id,),
        )
        return _candidates(sql, cursor, list(cursor.fetchall()), start, end)


def node_host_share(sql: Sql, node_id: str) -> tuple[int, int, int] | None:
    """(cpus per GPU, GiB per GPU, GPU count) of a node, or None when it is not indexed."""
    with sql.transaction(commit=False) as cursor:
        sql.execute(cursor, "SELECT gpus, cpus_per_gpu, memory_gib_per_gpu FROM bc_fg_node "
                    "WHERE node_id = ?", (node_id,))
        row = cursor.fetchone()
    if row is None:
        return None
    return (int(row["cpus_per_gpu"]), int(row["memory_gib_per_gpu"]),
            parsed_node_gpus(row["gpus"]).count)
