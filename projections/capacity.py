"""The capacity rollup: per pool and resource (gpu, cpu, memory), exact definitions in docs/capacity.md.

Two tables, changed together in the projection's batch transaction:

* ``bc_capacity_node``: one row per node with what capacity and the
  NodeLifecycle controller need (provision state, session, acceptance,
  maintenance, GPUs with their health, CPUs and memory, holds, live
  bookings) and the node's current contribution to its pool
  (:func:`node_contribution`);
* ``bc_capacity_pool``: one row per pool and resource holding the sums of
  the contributions, kept by adding the difference between a node's new and
  old contribution on each event. ``capacity.get`` reads these rows only, so
  its cost does not grow with the number of nodes.

``allocated`` comes from the node's device assignments (holds, events
``node.devices.assigned`` / ``node.devices.unassigned``); ``reserved`` from
its live bookings that no hold has yet (``bookings.booked`` until
``bookings.ended``). The rollup moves only on events: a future booking turns
from reserved into allocated when the reservations controller records its
binding at the start (``node.devices.assigned``), within one controller tick.
Version 2 added the bookings (new tables, rebuilt from sequence 0); version 3 the pools'
history in 5-minute buckets (``bc_capacity_history``, projections/capacity_history.py), written
whenever the next event falls in another bucket and at a batch's end.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from better_compute.domain.errors import BetterComputeError
from better_compute.domain.gpus import gpu_is_healthy, with_health
from better_compute.domain.ids import parse_id, public_id
from better_compute.domain.node_rules import (
    ACCEPTANCE_FAILED,
    ACCEPTANCE_PASSED,
    ACCEPTANCE_PENDING,
    ACCEPTANCE_RUNNING,
    GPU_FIELDS,
    HOST_FIELDS,
    RESOURCES,
    SESSION_CONNECTED,
    SESSION_DISCONNECTED,
    SESSION_NEVER,
    SESSION_UNREACHABLE,
    node_capacity,
)
from better_compute.projections import capacity_history, jsontext
from better_compute.projections.framework import ReadModel, Sql

_COLUMNS = GPU_FIELDS  # cpu and memory rows leave the GPU-only columns at 0
NODE_TABLE = "bc_capacity_node"
POOL_TABLE = "bc_capacity_pool"


def _num(value: Any) -> float:
    try:
        return float(value or 0)
    except (TypeError, ValueError):
        return 0.0


def node_contribution(provision_state: str, session: str, cordoned: bool,
                      gpus: list[dict[str, Any]], cpus: float, memory_gib: float,
                      holds: Sequence[dict[str, Any]] = (),
                      bookings: Sequence[dict[str, Any]] = ()) -> dict[str, dict[str, float]]:
    """What one node adds to its pool's rollup (docs/capacity.md, "Definitions").

    ``node_capacity`` (domain/node_rules.py) counts the GPUs by state and the
    holds as ``allocated``. This adds ``reserved``: GPUs of the node's live
    bookings (``allocationId``, ``gpus``, ``cpus``, ``memoryGiB``) whose
    allocation has no hold yet and that no hold has now, each GPU once (a GPU
    booked for two later intervals is one reserved GPU), with the per-GPU
    share of CPUs and memory its first booking (by allocation id) carries.
    ``available`` is then the allocatable GPUs neither allocated nor
    reserved: exactly the placer's ``free_now`` (projections/free_gpus.py),
    healthy GPUs of a usable node that no live booking holds at any time.
    """
    part = node_capacity(provision_state, session, cordoned, gpus, cpus, memory_gib,
                         tuple(holds))
    known = {str(g.get("uuid")): g for g in gpus}
    held_allocations = {str(h.get("allocationId")) for h in holds}
    held = {str(u) for h in holds for u in h.get("gpus") or []}
    later: dict[str, tuple[float, float]] = {}
    for booking in sorted(bookings, key=lambda b: str(b.get("allocationId"))):
        if str(booking.get("allocationId")) in held_allocations:
            continue
        booked = [str(u) for u in booking.get("gpus") or []]
        share = (_num(booking.get("cpus")) / max(1, len(booked)),
                 _num(booking.get("memoryGiB")) / max(1, len(booked)))
        for uuid in booked:
            if uuid in known and uuid not in held and uuid not in later:
                later[uuid] = share
    if not later:
        return part
    usable = (provision_state == "adopted" and session != SESSION_UNREACHABLE
              and not cordoned)
    gpu, cpu, memory = part["gpu"], part["cpu"], part["memory"]
    gpu["reserved"] = float(len(later))
    if usable:
        gpu["available"] -= sum(1 for u in later if gpu_is_healthy(known[u]))
    cpu["reserved"] = float(sum(c for c, _ in later.values()))
    memory["reserved"] = float(sum(m for _, m in later.values()))
    if usable:
        cpu["available"] = max(0.0, cpu["allocatable"] - cpu["allocated"] - cpu["reserved"])
        memory["available"] = max(0.0, memory["allocatable"] - memory["allocated"]
                                  - memory["reserved"])
    return part


class NodeState:
    """The projection's copy of one node, as the columns of ``bc_capacity_node`` hold it."""

    def __init__(self, row: dict[str, Any]) -> None:
        self.uuid = str(row["uuid"])
        self.id = str(row["id"])
        self.tenant_id = str(row["tenant_id"])
        self.pool_id = str(row["pool_id"])
        self.provision_state = str(row["provision_state"])
        self.session = str(row["session"])
        self.session_epoch = int(row["session_epoch"])
        self.session_since = row["session_since"]
        self.acceptance_state = str(row["acceptance_state"])
        self.acceptance_attempt = int(row["acceptance_attempt"])
        self.cordoned = bool(row["cordoned"])
        self.gpus: list[dict[str, Any]] = jsontext.loads(row["gpus"])
        self.cpus = _num(row["cpus"])
        self.memory_gib = _num(row["memory_gib"])
        self.holds: list[dict[str, Any]] = jsontext.loads(row.get("holds") or "[]")
        self.bookings: list[dict[str, Any]] = jsontext.loads(row.get("bookings") or "[]")

    def contribution(self) -> dict[str, dict[str, float]]:
        return node_contribution(self.provision_state, self.session, self.cordoned, self.gpus,
                                 self.cpus, self.memory_gib, self.holds, self.bookings)

    def params(self, contribution: dict[str, dict[str, float]] | None = None
               ) -> tuple[Any, ...]:
        return (self.id, self.tenant_id, self.pool_id, self.provision_state, self.session,
                self.session_epoch, self.session_since, self.acceptance_state,
                self.acceptance_attempt, int(self.cordoned), jsontext.dumps(self.gpus), self.cpus,
                self.memory_gib, jsontext.dumps(self.holds), jsontext.dumps(self.bookings),
                jsontext.dumps(contribution if contribution is not None else self.contribution()),
                self.uuid)


def _at(event: Any) -> str | None:
    at = getattr(event, "at", None)
    return at.isoformat() if at is not None else None


def _apply_to_state(state: NodeState, event: Any, kind: str) -> None:
    if kind == "node.connected":
        state.session, state.session_epoch = SESSION_CONNECTED, int(event.epoch)
        state.session_since = _at(event)
    elif kind == "node.disconnected":
        state.session, state.session_since = SESSION_DISCONNECTED, _at(event)
    elif kind == "node.unreachable":
        state.session, state.session_since = SESSION_UNREACHABLE, _at(event)
    elif kind == "node.acceptance.started":
        state.acceptance_state, state.acceptance_attempt = ACCEPTANCE_RUNNING, int(event.attempt)
    elif kind == "node.acceptance.failed":
        state.acceptance_state = ACCEPTANCE_FAILED
    elif kind == "node.adopted":
        state.provision_state, state.acceptance_state = "adopted", ACCEPTANCE_PASSED
        state.gpus = [dict(g) for g in event.gpus]
    elif kind in ("node.gpu.unhealthy", "node.gpu.healthy"):
        healthy = kind == "node.gpu.healthy"
        reasons = [] if healthy else list(event.reasons)
        state.gpus = [with_health(g, healthy, reasons) if g.get("uuid") == event.uuid else g
                      for g in state.gpus]
    elif kind == "node.inventory.accepted":  # an operator took the node's changed GPUs
        state.gpus = [dict(g) for g in event.gpus]
    elif kind in ("node.cordoned", "node.draining"):  # a drain is a cordon (domain/node.py)
        state.cordoned = True
    elif kind == "node.uncordoned":
        state.cordoned = False
    elif kind == "node.removed":
        # Out of the pool: it adds nothing, and nothing is left for the controller to watch.
        state.provision_state, state.cordoned, state.holds = "removed", False, []
        state.session, state.acceptance_state = SESSION_NEVER, ACCEPTANCE_PENDING
    elif kind == "node.rejoined":
        hardware = dict(event.hardware or {})
        state.pool_id, state.provision_state = str(event.pool_id), "adopting"
        state.session, state.session_since = SESSION_NEVER, _at(event)
        state.acceptance_state, state.cordoned = ACCEPTANCE_PENDING, False
        state.gpus = [dict(g) for g in event.gpus]
        state.cpus = _num(hardware.get("cpus"))
        state.memory_gib = _num(hardware.get("memoryGib"))
    elif kind == "node.devices.assigned":
        allocation = event.assignment.get("allocationId")
        state.holds = [h for h in state.holds if h.get("allocationId") != allocation]
        state.holds.append(dict(event.assignment))
    elif kind == "node.devices.unassigned":
        state.holds = [h for h in state.holds if h.get("allocationId") != event.allocation_id]
    elif kind == "bookings.booked":
        state.bookings = [b for b in state.bookings if b.get("allocationId") != event.allocation_id]
        state.bookings.append({"allocationId": event.allocation_id, "gpus": list(event.gpus),
                               "cpus": int(event.cpus), "memoryGiB": int(event.memory_gib)})
    elif kind == "bookings.ended":
        state.bookings = [b for b in state.bookings if b.get("allocationId") != event.allocation_id]


_BOOKING_EVENTS = ("bookings.booked", "bookings.ended")
# Applied and written at once, each on its own (the pool's sums move between pools).
_WRITTEN_AT_ONCE = ("node.joined", "node.rejoined", "node.removed")
_UPDATE_NODE = (
    f"UPDATE {NODE_TABLE} SET id = ?, tenant_id = ?, pool_id = ?, "
    "provision_state = ?, session = ?, session_epoch = ?, session_since = ?, "
    "acceptance_state = ?, acceptance_attempt = ?, cordoned = ?, gpus = ?, cpus = ?, "
    "memory_gib = ?, holds = ?, bookings = ?, contribution = ? WHERE uuid = ?"
)


class Capacity(ReadModel):
    name = "capacity"
    version = 3  # 2: live bookings feed ``reserved`` (new tables); 3: the pools' history

    def table_names(self) -> list[str]:
        return [NODE_TABLE, POOL_TABLE, capacity_history.TABLE]

    def tables(self) -> list[str]:
        sums = ", ".join(f"{c} DOUBLE PRECISION NOT NULL DEFAULT 0" for c in _COLUMNS)
        return [
            f"CREATE TABLE IF NOT EXISTS {NODE_TABLE} ("
            "uuid TEXT PRIMARY KEY, id TEXT NOT NULL, tenant_id TEXT NOT NULL, "
            "pool_id TEXT NOT NULL, provision_state TEXT NOT NULL, session TEXT NOT NULL, "
            "session_epoch BIGINT NOT NULL, session_since TEXT, acceptance_state TEXT NOT NULL, "
            "acceptance_attempt BIGINT NOT NULL, cordoned INTEGER NOT NULL, gpus TEXT NOT NULL, "
            "cpus DOUBLE PRECISION NOT NULL, memory_gib DOUBLE PRECISION NOT NULL, "
            "holds TEXT NOT NULL, bookings TEXT NOT NULL, contribution TEXT NOT NULL)",
            f"CREATE INDEX IF NOT EXISTS {NODE_TABLE}_pool ON {NODE_TABLE} (pool_id)",
            f"CREATE INDEX IF NOT EXISTS {NODE_TABLE}_session ON {NODE_TABLE} (session)",
            f"CREATE INDEX IF NOT EXISTS {NODE_TABLE}_acceptance ON {NODE_TABLE} "
            "(acceptance_state)",
            f"CREATE TABLE IF NOT EXISTS {POOL_TABLE} (pool_id TEXT NOT NULL, "
            f"resource TEXT NOT NULL, {sums}, PRIMARY KEY (pool_id, resource))",
            *capacity_history.tables(),
        ]

    def __init__(self) -> None:
        # Nodes changed in this batch, written once at its end (a stream of creates books
        # and binds on the same few nodes): uuid -> (state, contribution before the batch).
        self._pending: dict[str, tuple[NodeState, dict[str, dict[str, float]]]] = {}
        # The history bucket of the events applied since the last write of the history, and
        # the pools they touched.
        self._bucket: int | None = None
        self._touched: set[str] = set()

    def begin_batch(self) -> None:
        self._pending = {}
        self._bucket, self._touched = None, set()

    def wants(self, event_type: type[Any]) -> bool:
        kind = str(event_type.TOPIC)
        return kind in _BOOKING_EVENTS or kind.startswith("node.")

    def apply(self, sql: Sql, cursor: Any, sequence: int, event: Any) -> None:
        kind = str(type(event).TOPIC)
        if kind in _BOOKING_EVENTS:
            try:
                uuid = str(parse_id("node", str(event.node_id)))
            except BetterComputeError:
                return
        elif kind.startswith("node."):
            uuid = str(event.originator_id)
        else:
            return
        bucket = capacity_history.bucket_of(event.timestamp)
        if bucket != self._bucket:  # the rows of the bucket before are complete
            self._write(sql, cursor)
            self._bucket = bucket
        if kind in _WRITTEN_AT_ONCE:  # a node enters, leaves or moves pools: no coalescing
            self._flush(sql, cursor, uuid)
            self._apply_now(sql, cursor, uuid, event, kind)
            return
        pending = self._pending.get(uuid)
        if pending is None:
            sql.execute(cursor, f"SELECT * FROM {NODE_TABLE} WHERE uuid = ?", (uuid,))
            row = cursor.fetchone()
            if row is None:
                return
            pending = self._pending[uuid] = (NodeState(dict(row)), jsontext.loads(row["contribution"]))
        _apply_to_state(pending[0], event, kind)

    def end_batch(self, sql: Sql, cursor: Any) -> None:
        self._write(sql, cursor)

    def _write(self, sql: Sql, cursor: Any) -> None:
        """The nodes changed since the last write, their pools' sums, and those pools' history
        rows for the bucket of the events applied meanwhile."""
        for uuid in list(self._pending):
            self._flush(sql, cursor, uuid)
        if self._touched and self._bucket is not None:
            capacity_history.record(sql, cursor, sorted(self._touched), self._bucket,
                                    POOL_TABLE)
        self._touched = set()

    def _flush(self, sql: Sql, cursor: Any, uuid: str) -> None:
        pending = self._pending.pop(uuid, None)
        if pending is None:
            return
        state, before = pending
        after = state.contribution()
        sql.execute(cursor, _UPDATE_NODE, state.params(after))
        self._add(sql, cursor, state.pool_id, before, after)

    def _apply_now(self, sql: Sql, cursor: Any, uuid: str, event: Any, kind: str) -> None:
        if kind == "node.joined":
            hardware = dict(event.hardware or {})
            state = NodeState({
                "uuid": uuid, "id": public_id("node", event.originator_id),
                "tenant_id": event.tenant_id, "pool_id": event.pool_id,
                "provision_state": "adopting", "session": SESSION_NEVER, "session_epoch": 0,
                "session_since": None, "acceptance_state": ACCEPTANCE_PENDING,
                "acceptance_attempt": 0, "cordoned": 0,
                "gpus": jsontext.dumps([dict(g) for g in event.gpus]),
                "cpus": hardware.get("cpus"), "memory_gib": hardware.get("memoryGiB", hardware.get("memoryGib")),
            })
            before: dict[str, dict[str, float]] | None = None
            after = state.contribution()
            sql.execute(
                cursor,
                f"INSERT INTO {NODE_TABLE} (id, tenant_id, pool_id, provision_state, session, "
                "session_epoch, session_since, acceptance_state, acceptance_attempt, cordoned, "
                "gpus, cpus, memory_gib, holds, bookings, contribution, uuid) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                state.params(after),
            )
        else:
            sql.execute(cursor, f"SELECT * FROM {NODE_TABLE} WHERE uuid = ?", (uuid,))
            row = cursor.fetchone()
            if row is None:
                return
            state = NodeState(dict(row))
            before = jsontext.loads(row["contribution"])
            _apply_to_state(state, event, kind)
            after = state.contribution()
            sql.execute(cursor, _UPDATE_NODE, state.params(after))
        self._add(sql, cursor, state.pool_id, before, after)

    def _add(self, sql: Sql, cursor: Any, pool_id: str,
             before: dict[str, dict[str, float]] | None, after: dict[str, dict[str, float]]
             ) -> None:
        self._touched.add(pool_id)  # a history row even when the sums did not move
        for resource in RESOURCES:
            old = (before or {}).get(resource, {})
            new = after.get(resource, {})
            delta = [new.get(c, 0.0) - old.get(c, 0.0) for c in _COLUMNS]
            if before is not None and not any(delta):
                continue
            names = ", ".join(_COLUMNS)
            marks = ", ".join("?" for _ in _COLUMNS)
            updates = ", ".join(f"{c} = {POOL_TABLE}.{c} + excluded.{c}" for c in _COLUMNS)
            sql.execute(
                cursor,
                f"INSERT INTO {POOL_TABLE} (pool_id, resource, {names}) VALUES (?, ?, {marks}) "
                f"ON CONFLICT (pool_id, resource) DO UPDATE SET {updates}",
                (pool_id, resource, *delta),
            )


def read_capacity(sql: Sql, pool_id: str) -> dict[str, dict[str, float]]:
    """The rollup rows of one pool, by resource (zeros for a pool with no node yet)."""
    out = {r: dict.fromkeys(_COLUMNS, 0.0) for r in RESOURCES}
    with sql.transaction(commit=False) as cursor:
        sql.execute(cursor, f"SELECT resource, {', '.join(_COLUMNS)} FROM {POOL_TABLE} "
                    "WHERE pool_id = ?", (pool_id,))
        for row in cursor.fetchall():
            out[str(row["resource"])] = {c: float(row[c]) for c in _COLUMNS}
    return out


def read_node_states(sql: Sql, *, where: str = "", params: tuple[Any, ...] = ()
                     ) -> list[NodeState]:
    """Rows of the node table (the controller's worklist), oldest first."""
    clause = f" WHERE {where}" if where else ""
    with sql.transaction(commit=False) as cursor:
        sql.execute(cursor, f"SELECT * FROM {NODE_TABLE}{clause} ORDER BY uuid", params)
        return [NodeState(dict(row)) for row in cursor.fetchall()]


def count_nodes(sql: Sql, pool_id: str) -> dict[str, int]:
    with sql.transaction(commit=False) as cursor:
        sql.execute(cursor, "SELECT provision_state, session, COUNT(*) AS n FROM "
                    f"{NODE_TABLE} "
                    "WHERE pool_id = ? GROUP BY provision_state, session", (pool_id,))
        rows = cursor.fetchall()
    return _tally(rows)


def _tally(rows: Sequence[Any]) -> dict[str, int]:
    counts = {"total": 0, "adopting": 0, "adopted": 0, "connected": 0, "unreachable": 0}
    for row in rows:
        if row["provision_state"] == "removed":
            continue  # removed nodes left the pool
        n = int(row["n"])
        counts["total"] += n
        counts[str(row["provision_state"])] = counts.get(str(row["provision_state"]), 0) + n
        if row["session"] == SESSION_CONNECTED:
            counts["connected"] += n
        if row["session"] == SESSION_UNREACHABLE:
            counts["unreachable"] += n
    return counts


def capacity_resources(sums: dict[str, dict[str, float]]) -> dict[str, dict[str, Any]]:
    """``capacity.get``'s ``resources``: GPU fields for gpu, host fields for cpu and memory,
    whole numbers except memory (GiB, 3 decimals)."""
    resources: dict[str, dict[str, Any]] = {}
    for resource, row in sums.items():
        fields = row if resource == "gpu" else {k: row[k] for k in HOST_FIELDS}
        as_int = resource != "memory"
        resources[resource] = {k: round(v) if as_int else round(v, 3) for k, v in fields.items()}
    resources["memory"]["unit"] = "GiB"
    return resources


def read_all_capacity(sql: Sql, pool_ids: Sequence[str]
                      ) -> tuple[dict[str, dict[str, dict[str, float]]], dict[str, dict[str, int]]]:
    """Every pool's rollup rows (zeros for ``pool_ids`` with no node yet) and node counts,
    as ``read_capacity`` and ``count_nodes`` give them for one pool, in two queries."""
    sums = {p: {r: dict.fromkeys(_COLUMNS, 0.0) for r in RESOURCES} for p in pool_ids}
    with sql.transaction(commit=False) as cursor:
        sql.execute(cursor, f"SELECT pool_id, resource, {', '.join(_COLUMNS)} FROM {POOL_TABLE}")
        for row in cursor.fetchall():
            pool = sums.setdefault(str(row["pool_id"]),
                                   {r: dict.fromkeys(_COLUMNS, 0.0) for r in RESOURCES})
            pool[str(row["resource"])] = {c: float(row[c]) for c in _COLUMNS}
        sql.execute(cursor, "SELECT pool_id, provision_state, session, COUNT(*) AS n FROM "
                    f"{NODE_TABLE} GROUP BY pool_id, provision_state, session")
        by_pool: dict[str, list[Any]] = {p: [] for p in sums}
        for row in cursor.fetchall():
            by_pool.setdefault(str(row["pool_id"]), []).append(row)
    return sums, {pool: _tally(rows) for pool, rows in by_pool.items()}


def nodes_not_ready(sql: Sql) -> list[tuple[str, str, str]]:
    """(node, pool, reason) for every node of a pool that cannot take work, once per reason:
    its provision state when not adopted, its session when not connected, ``cordoned``
    (also while draining). The cost follows these nodes, not the fleet."""
    with sql.transaction(commit=False) as cursor:
        sql.execute(cursor, f"SELECT id, pool_id, provision_state, session, cordoned FROM "
                    f"{NODE_TABLE} WHERE provision_state <> 'removed' AND (provision_state "
                    "<> 'adopted' OR session <> ? OR cordoned <> 0) ORDER BY id",
                    (SESSION_CONNECTED,))
        out = []
        for r in cursor.fetchall():
            node, pool = str(r["id"]), str(r["pool_id"])
            if r["provision_state"] != "adopted":
                out.append((node, pool, str(r["provision_state"])))
            if r["session"] != SESSION_CONNECTED:
                out.append((node, pool, str(r["session"])))
            if r["cordoned"]:
                out.append((node, pool, "cordoned"))
        return out
