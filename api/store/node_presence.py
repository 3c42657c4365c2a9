"""What nodes last said, kept beside the events, not as events: heartbeats and reports.

Heartbeats arrive every few seconds from every node, and reports every few
heartbeats; recording each as an event would flood the log. The gateway
keeps the newest of each per session in memory and writes them in one batch
per second:

* ``bc_node_presence``: one row per node, the session epoch and the time of
  the newest heartbeat or report (seconds since the epoch, the gateway's
  clock). The NodeLifecycle controller reads the rows to mark silent nodes
  unreachable. A row of an older epoch than the node's current session does
  not count.
* ``bc_node_report``: one row per node, a summary of its newest Report (the
  applied and observed desired-state generation, each section's state, each
  GPU's health and telemetry), which ``nodes.get`` shows as ``report``.
"""

from __future__ import annotations

import json
import weakref
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

import msgspec

from better_compute.api.store.store import SqlRunner
from better_compute.api.wire.gateway import Report
from better_compute.api.wire.inventory import Telemetry
from better_compute.domain.base import iso
from better_compute.domain.gpus import Gpu

PRESENCE_TABLE = "bc_node_presence"
TABLE = (
    f"CREATE TABLE IF NOT EXISTS {PRESENCE_TABLE} (uuid TEXT PRIMARY KEY, "
    "epoch BIGINT NOT NULL, last_seen DOUBLE PRECISION NOT NULL)"
)
REPORT_TABLE = (
    "CREATE TABLE IF NOT EXISTS bc_node_report (uuid TEXT PRIMARY KEY, "
    "epoch BIGINT NOT NULL, reported_at DOUBLE PRECISION NOT NULL, doc TEXT NOT NULL)"
)
MAX_SECTION_MESSAGE = 2000  # a section's message is cut to this many characters
MAX_GPUS = 256
_TELEMETRY = ("utilizationPct", "temperatureC", "powerW", "memoryUsedMiB", "memoryMiB")
_ready: weakref.WeakSet[SqlRunner] = weakref.WeakSet()


def _tables(sql: SqlRunner) -> None:
    """Create both tables once per SqlRunner (reads may come before any gateway wrote)."""
    if sql not in _ready:
        sql.create_tables([TABLE, REPORT_TABLE])
        _ready.add(sql)


class Presence:
    def __init__(self, sql: SqlRunner) -> None:
        self.sql = sql
        _tables(sql)

    def record(self, beats: Iterable[tuple[str, int, datetime]]) -> int:
        """Write (node uuid, epoch, time) rows; a newer epoch or time wins."""
        return _write_rows(
            self.sql,
            "INSERT INTO bc_node_presence (uuid, epoch, last_seen) VALUES (?, ?, ?) "
            "ON CONFLICT (uuid) DO UPDATE SET epoch = excluded.epoch, "
            "last_seen = excluded.last_seen WHERE excluded.epoch > bc_node_presence.epoch "
            "OR (excluded.epoch = bc_node_presence.epoch "
            "AND excluded.last_seen > bc_node_presence.last_seen)",
            [(uuid, epoch, at.timestamp()) for uuid, epoch, at in beats],
        )

    def last_seen(self) -> dict[str, tuple[int, datetime]]:
        """Every node's newest heartbeat: uuid -> (epoch, time)."""
        with self.sql.transaction(commit=False) as cursor:
            self.sql.execute(cursor, "SELECT uuid, epoch, last_seen FROM bc_node_presence")
            rows: list[Any] = cursor.fetchall()
        return {str(r["uuid"]): (int(r["epoch"]), datetime.fromtimestamp(float(r["last_seen"]), UTC))
                for r in rows}


class Reports:
    """The newest report summary of each node (``bc_node_report``)."""

    def __init__(self, sql: SqlRunner) -> None:
        self.sql = sql
        _tables(sql)

    def record(self, reports: Iterable[tuple[str, int, datetime, dict[str, Any]]]) -> int:
        """Write (node uuid, epoch, time, summary) rows; a newer epoch or time wins."""
        return _write_rows(
            self.sql,
            "INSERT INTO bc_node_report (uuid, epoch, reported_at, doc) "
            "VALUES (?, ?, ?, ?) ON CONFLICT (uuid) DO UPDATE SET "
            "epoch = excluded.epoch, reported_at = excluded.reported_at, "
            "doc = excluded.doc WHERE excluded.epoch > bc_node_report.epoch "
            "OR (excluded.epoch = bc_node_report.epoch "
            "AND excluded.reported_at >= bc_node_report.reported_at)",
            [(uuid, epoch, at.timestamp(), json.dumps(doc, separators=(",", ":")))
             for uuid, epoch, at, doc in reports],
        )

    def latest(self, uuid: str) -> dict[str, Any] | None:
        """The node's newest report summary, or None when it never reported."""
        with self.sql.transaction(commit=False) as cursor:
            self.sql.execute(cursor, "SELECT doc FROM bc_node_report WHERE uuid = ?", (uuid,))
            row = cursor.fetchone()
        return json.loads(row["doc"]) if row is not None else None


def _write_rows(sql: SqlRunner, statement: str, rows: list[tuple[Any, ...]]) -> int:
    """Run ``statement`` for every row in one call (the driver's ``executemany``: SQLite's
    loop in C, psycopg's pipeline), in one transaction; returns how many rows. Not durable
    (the commit does not wait for the disk): a power cut may lose the last second of what
    nodes said, never an event, and the nodes say it again."""
    if rows:
        with sql.transaction(commit=True, durable=False) as cursor:
            cursor.executemany(sql.q(statement), rows)
    return len(rows)


def summarize_report(epoch: int, at: datetime, report: Report) -> dict[str, Any]:
    """What ``nodes.get`` shows of a Report (docs/nodes.md, "report"), bounded in size."""
    shown = {name[:64]: {**msgspec.to_builtins(section),
                         "message": section.message[:MAX_SECTION_MESSAGE]}
             for name, section in list(report.sections.items())[:32]}
    reasons = {g.uuid: list(g.health_reasons) for g in
               (report.inventory.gpus if report.inventory is not None else [])}
    telemetry = report.telemetry or Telemetry()
    gpus = []
    for gpu in telemetry.gpus[:MAX_GPUS]:
        value = Gpu(uuid=gpu.uuid, reported_healthy=gpu.healthy,
                    health_reasons=tuple(reasons.get(gpu.uuid, [])))
        readings = msgspec.to_builtins(gpu)
        gpus.append({"uuid": gpu.uuid, "healthy": value.healthy,
                     "healthReasons": list(value.health_reasons),
                     **{k: readings.get(k) for k in _TELEMETRY}})
    return {
        "epoch": epoch,
        "at": iso(at),
        "appliedGeneration": report.applied_generation,
        "observedGeneration": report.observed_generation,
        "sections": shown,
        "gpus": gpus,
        "telemetryTime": telemetry.time,
    }
