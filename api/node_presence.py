"""When each node was last heard from: heartbeats, kept beside the events, not as events.

Heartbeats arrive every few seconds from every node; recording each as an
event would flood the log. The gateway keeps the newest heartbeat time of
each session in memory and writes them in one batch per second to
``bc_node_presence`` (one row per node: the session epoch and the time, as
seconds since the epoch, by the gateway's clock). The NodeLifecycle
controller reads the rows to mark silent nodes unreachable. A row of an
older epoch than the node's current session does not count.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from better_compute.api.store import SqlRunner

TABLE = (
    "CREATE TABLE IF NOT EXISTS bc_node_presence (uuid TEXT PRIMARY KEY, "
    "epoch BIGINT NOT NULL, last_seen DOUBLE PRECISION NOT NULL)"
)


class Presence:
    def __init__(self, sql: SqlRunner) -> None:
        self.sql = sql
        sql.create_tables([TABLE])

    def record(self, beats: Iterable[tuple[str, int, datetime]]) -> int:
        """Write (node uuid hex, epoch, time) rows; a newer epoch or time wins."""
        rows = [(uuid, epoch, at.timestamp()) for uuid, epoch, at in beats]
        if not rows:
            return 0
        with self.sql.transaction(commit=True) as cursor:
            for row in rows:
                self.sql.execute(
                    cursor,
                    "INSERT INTO bc_node_presence (uuid, epoch, last_seen) VALUES (?, ?, ?) "
                    "ON CONFLICT (uuid) DO UPDATE SET epoch = excluded.epoch, "
                    "last_seen = excluded.last_seen WHERE excluded.epoch > bc_node_presence.epoch "
                    "OR (excluded.epoch = bc_node_presence.epoch "
                    "AND excluded.last_seen > bc_node_presence.last_seen)",
                    row,
                )
        return len(rows)

    def last_seen(self) -> dict[str, tuple[int, datetime]]:
        """Every node's newest heartbeat: uuid hex -> (epoch, time)."""
        with self.sql.transaction(commit=False) as cursor:
            self.sql.execute(cursor, "SELECT uuid, epoch, last_seen FROM bc_node_presence")
            rows: list[Any] = cursor.fetchall()
        return {str(r["uuid"]): (int(r["epoch"]), datetime.fromtimestamp(float(r["last_seen"]), UTC))
                for r in rows}
