"""The NodeLifecycle controller: level-triggered, one pass at a time.

Each pass (``reconcile``) catches the capacity projection up (it holds the
node states this controller reads), then for every node with a session:

* connected, adopting, acceptance never started: start attempt 1 with the
  pool's checks (``node.acceptance.started``); the gateway sends them;
* connected or disconnected, and nothing heard for ``unreachable_after``
  (default 30 s; the newest heartbeat of its current epoch, else the
  session's last change): ``node.unreachable``;
* an acceptance attempt running for ``acceptance_timeout`` (default 10
  minutes) without a verdict: ``node.acceptance.failed`` with reason
  ``timeout`` (sticky like any failure: nodes.adopt starts the next attempt).

A pass that fails (the store away), leadership lost (its lock lives on a
PostgreSQL connection), or a store that refuses writes while reads work (SQLite
on a full disk) makes the controller blind: the gateways may not have written
heartbeats meanwhile, so silence before the next pass that succeeds (with
writes going through) does not count, and no node is marked unreachable until
``unreachable_after`` has passed since then.

The verdict on an attempt comes from the node's signed journal through the
gateway, not from here; a failed attempt stays failed until nodes.adopt.
A pass is idempotent: running it twice, or on two processes at once, records
nothing twice (each change re-checks the node inside its own save). The
clock is the service's, so tests move time instead of sleeping.

A pass costs what it has to do, not the fleet's size: it reads only the node rows that need
something (adopting with no attempt; running attempts; sessions with no heartbeat written
since ``unreachable_after``, which the database picks from the capacity rows and
``bc_node_presence`` together), and the nodes it changes in one kind of step are saved in
one write (``NodeService.change_each``): 10,000 nodes connecting at once start their
acceptance in a few saves, not 10,000 (docs/performance.md, "A fleet on one server").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

from better_compute.api.services.nodes import NodeService
from better_compute.api.store.actor import CONTROLLER_NODES
from better_compute.api.store.node_presence import PRESENCE_TABLE, Presence
from better_compute.domain.node_rules import (
    ACCEPTANCE_PENDING,
    ACCEPTANCE_RUNNING,
    PROVISION_ADOPTING,
    SESSION_CONNECTED,
    SESSION_DISCONNECTED,
)
from better_compute.projections.capacity import NODE_TABLE

UNREACHABLE_AFTER = timedelta(seconds=30)
ACCEPTANCE_TIMEOUT = timedelta(minutes=10)


@dataclass
class PassReport:
    """What one pass did, by node id (for logs and tests)."""

    acceptance_started: list[str] = field(default_factory=list)
    unreachable: list[str] = field(default_factory=list)
    acceptance_timed_out: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.acceptance_started or self.unreachable or self.acceptance_timed_out)


class NodeLifecycle:
    """The NodeLifecycle controller's passes; what they save, ``controller:nodes`` did."""

    actor = CONTROLLER_NODES

    def __init__(self, nodes: NodeService, presence: Presence,
                 unreachable_after: timedelta = UNREACHABLE_AFTER,
                 acceptance_timeout: timedelta = ACCEPTANCE_TIMEOUT) -> None:
        self.nodes = nodes
        self.presence = presence
        self.unreachable_after = unreachable_after
        self.acceptance_timeout = acceptance_timeout
        # (node uuid, attempt) -> when that attempt started; read once from the aggregate.
        self._attempt_started: dict[tuple[str, int], datetime | None] = {}
        self._blind = False  # the last pass failed
        self._sight_since: datetime | None = None  # silence before this does not count

    def reconcile(self) -> PassReport:
        try:
            return self._reconcile()
        except Exception:
            self.lost_sight()
            raise

    def lost_sight(self) -> None:
        """Passes stopped (a failure, the leadership lost): silence until the next pass
        that succeeds does not count."""
        self._blind = True

    def _reconcile(self) -> PassReport:
        report = PassReport()
        service = self.nodes.service
        if service.store.guard.write_failure is not None:
            # Reads work, writes fail (SQLite on a full disk): the gateway's heartbeats are
            # not written either. Blind until a write goes through again.
            self.lost_sight()
            service.sql.probe_write()
        service.projections.followed("capacity")
        self._time_out_attempts(report)
        errors = self._start_acceptance(report)
        now = service.clock()
        if self._blind:
            self._blind, self._sight_since = False, now
        marks: list[tuple[str, UUID, int, datetime | None]] = []
        for node_id, uuid, epoch, since, beat in _silent(self.presence.sql,
                                                          now - self.unreachable_after):
            last = _last_heard(since, beat, epoch)
            counted = last if last is None or self._sight_since is None \
                else max(last, self._sight_since)
            if counted is not None and now - counted > self.unreachable_after:
                marks.append((node_id, UUID(uuid), epoch, last))
        if marks:
            done = self.nodes.change_each([(uuid, self.nodes.unreachable(epoch, last), self.actor)
                                           for _, uuid, epoch, last in marks])
            for (node_id, *_), result in zip(marks, done, strict=True):
                if isinstance(result, Exception):
                    errors.append(result)
                elif result:
                    report.unreachable.append(node_id)
        if errors:  # the others are done; the pass fails (and is retried) for these
            raise errors[0]
        return report

    def _start_acceptance(self, report: PassReport) -> list[Exception]:
        """Attempt 1 for every connected node that is adopting and never ran acceptance, in
        one write; the errors of those it could not start."""
        rows = _rows(self.nodes.service.sql, "id, uuid",
                     "session = ? AND provision_state = ? AND acceptance_state = ?",
                     (SESSION_CONNECTED, PROVISION_ADOPTING, ACCEPTANCE_PENDING))
        if not rows:
            return []
        results = self.nodes.start_first_acceptances([UUID(str(r["uuid"])) for r in rows],
                                                     actor=self.actor)
        started = self.nodes.clock()  # no earlier than each start: never times out early
        errors: list[Exception] = []
        for row, result in zip(rows, results, strict=True):
            if isinstance(result, Exception):
                errors.append(result)
            elif result is not None:
                report.acceptance_started.append(str(row["id"]))
                self._attempt_started[(str(row["uuid"]), int(result))] = started
        return errors

    def _time_out_attempts(self, report: PassReport) -> None:
        """Fail every attempt that has run for ``acceptance_timeout`` without a verdict."""
        running = _rows(self.nodes.service.sql, "id, uuid, acceptance_attempt",
                        "acceptance_state = ?", (ACCEPTANCE_RUNNING,))
        keys = {(str(r["uuid"]), int(r["acceptance_attempt"])) for r in running}
        self._attempt_started = {k: v for k, v in self._attempt_started.items() if k in keys}
        if not running:
            return
        now = self.nodes.clock()
        for row in running:
            key = (str(row["uuid"]), int(row["acceptance_attempt"]))
            if key not in self._attempt_started:  # started elsewhere: read once
                node = self.nodes.load(UUID(key[0]))
                same = node is not None and node.acceptance_attempt == key[1]
                self._attempt_started[key] = node.acceptance_since if same and node else None
            since = self._attempt_started[key]
            if since is None or now - since < self.acceptance_timeout:
                continue
            if self.nodes.time_out_acceptance(UUID(key[0]), key[1], self.acceptance_timeout,
                                              actor=self.actor):
                report.acceptance_timed_out.append(str(row["id"]))


def _rows(sql: Any, columns: str, where: str, params: tuple[Any, ...],
          source: str = NODE_TABLE) -> list[Any]:
    """Columns of the capacity projection's node rows (what the controller reads of them),
    in the order of their uuid."""
    order = "n.uuid" if " n " in f"{source} " else "uuid"
    with sql.transaction(commit=False) as cursor:
        sql.execute(cursor, f"SELECT {columns} FROM {source} WHERE {where} ORDER BY {order}",
                    params)
        return list(cursor.fetchall())


def _silent(sql: Any, cutoff: datetime
            ) -> list[tuple[str, str, int, str | None, tuple[int, datetime] | None]]:
    """Each node with a session (connected or disconnected) whose session has no heartbeat
    written after ``cutoff``: (id, uuid, epoch, session since, its newest heartbeat). The
    database leaves out every node heard since: a pass over a fleet that heartbeats reads
    none of it."""
    rows = _rows(sql, "n.id AS id, n.uuid AS uuid, n.session_epoch AS epoch, "
                 "n.session_since AS since, p.epoch AS beat_epoch, p.last_seen AS beat_at",
                 "n.session IN (?, ?) AND NOT (p.epoch IS NOT NULL AND p.epoch = n.session_epoch "
                 "AND p.last_seen > ?)",
                 (SESSION_CONNECTED, SESSION_DISCONNECTED, cutoff.timestamp()),
                 f"{NODE_TABLE} n LEFT JOIN {PRESENCE_TABLE} p ON p.uuid = n.uuid")
    return [(str(r["id"]), str(r["uuid"]), int(r["epoch"]), r["since"],
             None if r["beat_epoch"] is None
             else (int(r["beat_epoch"]), datetime.fromtimestamp(float(r["beat_at"]), UTC)))
            for r in rows]


def _last_heard(session_since: str | None, beat: tuple[int, datetime] | None,
                epoch: int) -> datetime | None:
    since = datetime.fromisoformat(session_since) if session_since else None
    if beat is not None and beat[0] == epoch and (since is None or beat[1] > since):
        return beat[1]
    return since
