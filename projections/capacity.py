"""The capacity rollup: per pool and resource (gpu, cpu, memory), exact definitions in docs/capacity.md.

Two tables, changed together in the projection's batch transaction:

* ``bc_node_state``: one row per node with what capacity and the
  NodeLifecycle controller need (provision state, session, acceptance,
  maintenance, GPUs with their health, CPUs and memory) and the node's
  current contribution to its pool (``domain.node_rules.node_capacity``);
* ``bc_capacity``: one row per pool and resource holding the sums of the
  contributions, kept by adding the difference between a node's new and old
  contribution on each event. ``capacity.get`` reads these rows only, so its
  cost does not grow with the number of nodes.

``allocated`` comes from the node's device assignments (holds, events
``node.devices.assigned`` / ``node.devices.unassigned``); ``reserved``
(booked, not yet held) stays 0 until the bookings feed it.
"""

from __future__ import annotations

import json
from typing import Any

from better_compute.domain.ids import public_id
from better_compute.domain.node_rules import (
    ACCEPTANCE_FAILED,
    ACCEPTANCE_PASSED,
    ACCEPTANCE_PENDING,
    ACCEPTANCE_RUNNING,
    GPU_FIELDS,
    RESOURCES,
    SESSION_CONNECTED,
    SESSION_DISCONNECTED,
    SESSION_NEVER,
    SESSION_UNREACHABLE,
    node_capacity,
)
from better_compute.projections.framework import Projection, Sql

_COLUMNS = GPU_FIELDS  # cpu and memory rows leave the GPU-only columns at 0


def _num(value: Any) -> float:
    try:
        return float(value or 0)
    except (TypeError, ValueError):
        return 0.0


class NodeState:
    """The projection's copy of one node, as the columns of ``bc_node_state`` hold it."""

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
        self.gpus: list[dict[str, Any]] = json.loads(row["gpus"])
        self.cpus = _num(row["cpus"])
        self.memory_gib = _num(row["memory_gib"])
        self.holds: list[dict[str, Any]] = json.loads(row.get("holds") or "[]")

    def contribution(self) -> dict[str, dict[str, float]]:
        return node_capacity(self.provision_state, self.session, self.cordoned, self.gpus,
                             self.cpus, self.memory_gib, self.holds)

    def params(self) -> tuple[Any, ...]:
        return (self.id, self.tenant_id, self.pool_id, self.provision_state, self.session,
                self.session_epoch, self.session_since, self.acceptance_state,
                self.acceptance_attempt, int(self.cordoned), json.dumps(self.gpus), self.cpus,
                self.memory_gib, json.dumps(self.holds), json.dumps(self.contribution()),
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
        state.gpus = [{**g, "healthy": healthy, "healthReasons": reasons}
                      if g.get("uuid") == event.uuid else g for g in state.gpus]
    elif kind == "node.cordoned":
        state.cordoned = True
    elif kind == "node.uncordoned":
        state.cordoned = False
    elif kind == "node.devices.assigned":
        allocation = event.assignment.get("allocationId")
        state.holds = [h for h in state.holds if h.get("allocationId") != allocation]
        state.holds.append(dict(event.assignment))
    elif kind == "node.devices.unassigned":
        state.holds = [h for h in state.holds if h.get("allocationId") != event.allocation_id]


class Capacity(Projection):
    name = "capacity"

    def table_names(self) -> list[str]:
        return ["bc_node_state", "bc_capacity"]

    def tables(self) -> list[str]:
        sums = ", ".join(f"{c} DOUBLE PRECISION NOT NULL DEFAULT 0" for c in _COLUMNS)
        return [
            "CREATE TABLE IF NOT EXISTS bc_node_state ("
            "uuid TEXT PRIMARY KEY, id TEXT NOT NULL, tenant_id TEXT NOT NULL, "
            "pool_id TEXT NOT NULL, provision_state TEXT NOT NULL, session TEXT NOT NULL, "
            "session_epoch BIGINT NOT NULL, session_since TEXT, acceptance_state TEXT NOT NULL, "
            "acceptance_attempt BIGINT NOT NULL, cordoned INTEGER NOT NULL, gpus TEXT NOT NULL, "
            "cpus DOUBLE PRECISION NOT NULL, memory_gib DOUBLE PRECISION NOT NULL, "
            "holds TEXT NOT NULL, contribution TEXT NOT NULL)",
            "CREATE INDEX IF NOT EXISTS bc_node_state_pool ON bc_node_state (pool_id)",
            "CREATE INDEX IF NOT EXISTS bc_node_state_session ON bc_node_state (session)",
            f"CREATE TABLE IF NOT EXISTS bc_capacity (pool_id TEXT NOT NULL, "
            f"resource TEXT NOT NULL, {sums}, PRIMARY KEY (pool_id, resource))",
        ]

    def apply(self, sql: Sql, cursor: Any, sequence: int, event: Any) -> None:
        kind = str(type(event).TOPIC)
        if not kind.startswith("node."):
            return
        uuid = str(event.originator_id)
        if kind == "node.joined":
            hardware = dict(event.hardware or {})
            state = NodeState({
                "uuid": uuid, "id": public_id("node", event.originator_id),
                "tenant_id": event.tenant_id, "pool_id": event.pool_id,
                "provision_state": "adopting", "session": SESSION_NEVER, "session_epoch": 0,
                "session_since": None, "acceptance_state": ACCEPTANCE_PENDING,
                "acceptance_attempt": 0, "cordoned": 0,
                "gpus": json.dumps([dict(g) for g in event.gpus]),
                "cpus": hardware.get("cpus"), "memory_gib": hardware.get("memoryGib"),
            })
            before: dict[str, dict[str, float]] | None = None
            sql.execute(
                cursor,
                "INSERT INTO bc_node_state (id, tenant_id, pool_id, provision_state, session, "
                "session_epoch, session_since, acceptance_state, acceptance_attempt, cordoned, "
                "gpus, cpus, memory_gib, holds, contribution, uuid) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                state.params(),
            )
        else:
            sql.execute(cursor, "SELECT * FROM bc_node_state WHERE uuid = ?", (uuid,))
            row = cursor.fetchone()
            if row is None:
                return
            state = NodeState(dict(row))
            before = json.loads(row["contribution"])
            _apply_to_state(state, event, kind)
            sql.execute(
                cursor,
                "UPDATE bc_node_state SET id = ?, tenant_id = ?, pool_id = ?, "
                "provision_state = ?, session = ?, session_epoch = ?, session_since = ?, "
                "acceptance_state = ?, acceptance_attempt = ?, cordoned = ?, gpus = ?, cpus = ?, "
                "memory_gib = ?, holds = ?, contribution = ? WHERE uuid = ?",
                state.params(),
            )
        self._add(sql, cursor, state.pool_id, before, state.contribution())

    def _add(self, sql: Sql, cursor: Any, pool_id: str,
             before: dict[str, dict[str, float]] | None, after: dict[str, dict[str, float]]
             ) -> None:
        for resource in RESOURCES:
            old = (before or {}).get(resource, {})
            new = after.get(resource, {})
            delta = [new.get(c, 0.0) - old.get(c, 0.0) for c in _COLUMNS]
            if before is not None and not any(delta):
                continue
            names = ", ".join(_COLUMNS)
            marks = ", ".join("?" for _ in _COLUMNS)
            updates = ", ".join(f"{c} = bc_capacity.{c} + excluded.{c}" for c in _COLUMNS)
            sql.execute(
                cursor,
                f"INSERT INTO bc_capacity (pool_id, resource, {names}) VALUES (?, ?, {marks}) "
                f"ON CONFLICT (pool_id, resource) DO UPDATE SET {updates}",
                (pool_id, resource, *delta),
            )


def read_capacity(sql: Sql, pool_id: str) -> dict[str, dict[str, float]]:
    """The rollup rows of one pool, by resource (zeros for a pool with no node yet)."""
    out = {r: dict.fromkeys(_COLUMNS, 0.0) for r in RESOURCES}
    with sql.transaction(commit=False) as cursor:
        sql.execute(cursor, f"SELECT resource, {', '.join(_COLUMNS)} FROM bc_capacity "
                    "WHERE pool_id = ?", (pool_id,))
        for row in cursor.fetchall():
            out[str(row["resource"])] = {c: float(row[c]) for c in _COLUMNS}
    return out


def read_node_states(sql: Sql, *, where: str = "", params: tuple[Any, ...] = ()
                     ) -> list[NodeState]:
    """Rows of ``bc_node_state`` (the controller's worklist), oldest first."""
    clause = f" WHERE {where}" if where else ""
    with sql.transaction(commit=False) as cursor:
        sql.execute(cursor, f"SELECT * FROM bc_node_state{clause} ORDER BY uuid", params)
        return [NodeState(dict(row)) for row in cursor.fetchall()]


def count_nodes(sql: Sql, pool_id: str) -> dict[str, int]:
    with sql.transaction(commit=False) as cursor:
        sql.execute(cursor, "SELECT provision_state, session, COUNT(*) AS n FROM bc_node_state "
                    "WHERE pool_id = ? GROUP BY provision_state, session", (pool_id,))
        rows = cursor.fetchall()
    counts = {"total": 0, "adopting": 0, "adopted": 0, "connected": 0, "unreachable": 0}
    for row in rows:
        n = int(row["n"])
        counts["total"] += n
        counts[str(row["provision_state"])] = counts.get(str(row["provision_state"]), 0) + n
        if row["session"] == SESSION_CONNECTED:
            counts["connected"] += n
        if row["session"] == SESSION_UNREACHABLE:
            counts["unreachable"] += n
    return counts
