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
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from uuid import UUID

from better_compute.api.services.nodes import NodeService
from better_compute.api.store.node_presence import Presence
from better_compute.domain.node_rules import (
    ACCEPTANCE_PENDING,
    ACCEPTANCE_RUNNING,
    SESSION_CONNECTED,
    SESSION_DISCONNECTED,
)
from better_compute.projections.capacity import read_node_states

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
        states = read_node_states(
            service.sql, where="session IN (?, ?)",
            params=(SESSION_CONNECTED, SESSION_DISCONNECTED),
        )
        if not states:
            return report
        heard = self.presence.last_seen()
        now = service.clock()
        if self._blind:
            self._blind, self._sight_since = False, now
        for state in states:
            uuid = UUID(state.uuid)
            if (state.session == SESSION_CONNECTED and state.provision_state == "adopting"
                    and state.acceptance_state == ACCEPTANCE_PENDING
                    and self.nodes.start_first_acceptance(uuid) is not None):
                report.acceptance_started.append(state.id)
            last = _last_heard(state.session_since, heard.get(state.uuid), state.session_epoch)
            counted = last if last is None or self._sight_since is None \
                else max(last, self._sight_since)
            if counted is not None and now - counted > self.unreachable_after \
                    and self.nodes.mark_unreachable(uuid, state.session_epoch, last):
                report.unreachable.append(state.id)
        return report

    def _time_out_attempts(self, report: PassReport) -> None:
        """Fail every attempt that has run for ``acceptance_timeout`` without a verdict."""
        running = read_node_states(self.nodes.service.sql, where="acceptance_state = ?",
                                   params=(ACCEPTANCE_RUNNING,))
        keys = {(state.uuid, state.acceptance_attempt) for state in running}
        self._attempt_started = {k: v for k, v in self._attempt_started.items() if k in keys}
        if not running:
            return
        now = self.nodes.clock()
        for state in running:
            key = (state.uuid, state.acceptance_attempt)
            if key not in self._attempt_started:
                node = self.nodes.load(UUID(state.uuid))
                same = node is not None and node.acceptance_attempt == state.acceptance_attempt
                self._attempt_started[key] = node.acceptance_since if same and node else None
            since = self._attempt_started[key]
            if since is None or now - since < self.acceptance_timeout:
                continue
            if self.nodes.time_out_acceptance(UUID(state.uuid), state.acceptance_attempt,
                                              self.acceptance_timeout):
                report.acceptance_timed_out.append(state.id)


def _last_heard(session_since: str | None, beat: tuple[int, datetime] | None,
                epoch: int) -> datetime | None:
    since = datetime.fromisoformat(session_since) if session_since else None
    if beat is not None and beat[0] == epoch and (since is None or beat[1] > since):
        return beat[1]
    return since
