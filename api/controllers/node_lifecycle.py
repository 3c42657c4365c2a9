"""The NodeLifecycle controller: level-triggered, one pass at a time.

Each pass (``reconcile``) catches the capacity projection up (it holds the
node states this controller reads), then for every node with a session:

* connected, adopting, acceptance never started: start attempt 1 with the
  pool's checks (``node.acceptance.started``); the gateway sends them;
* connected or disconnected, and nothing heard for ``unreachable_after``
  (default 30 s; the newest heartbeat of its current epoch, else the
  session's last change): ``node.unreachable``.

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

from better_compute.api.node_presence import Presence
from better_compute.api.node_service import NodeService
from better_compute.domain.node_rules import (
    ACCEPTANCE_PENDING,
    SESSION_CONNECTED,
    SESSION_DISCONNECTED,
)
from better_compute.projections.capacity import read_node_states

UNREACHABLE_AFTER = timedelta(seconds=30)


@dataclass
class PassReport:
    """What one pass did, by node id (for logs and tests)."""

    acceptance_started: list[str] = field(default_factory=list)
    unreachable: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.acceptance_started or self.unreachable)


class NodeLifecycle:
    def __init__(self, nodes: NodeService, presence: Presence,
                 unreachable_after: timedelta = UNREACHABLE_AFTER) -> None:
        self.nodes = nodes
        self.presence = presence
        self.unreachable_after = unreachable_after

    def reconcile(self) -> PassReport:
        report = PassReport()
        service = self.nodes.service
        service.projections.catch_up("capacity")
        states = read_node_states(
            service.sql, where="session IN (?, ?)",
            params=(SESSION_CONNECTED, SESSION_DISCONNECTED),
        )
        if not states:
            return report
        heard = self.presence.last_seen()
        now = service.clock()
        for state in states:
            uuid = UUID(state.uuid)
            if (state.session == SESSION_CONNECTED and state.provision_state == "adopting"
                    and state.acceptance_state == ACCEPTANCE_PENDING
                    and self.nodes.start_first_acceptance(uuid) is not None):
                report.acceptance_started.append(state.id)
            last = _last_heard(state.session_since, heard.get(state.uuid), state.session_epoch)
            if last is not None and now - last > self.unreachable_after \
                    and self.nodes.mark_unreachable(uuid, state.session_epoch, last):
                report.unreachable.append(state.id)
        return report


def _last_heard(session_since: str | None, beat: tuple[int, datetime] | None,
                epoch: int) -> datetime | None:
    since = datetime.fromisoformat(session_since) if session_since else None
    if beat is not None and beat[0] == epoch and (since is None or beat[1] > since):
        return beat[1]
    return since
