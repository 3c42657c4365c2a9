"""A node as others read it: its conditions and its document (nodes.get, nodes.list), and
the desired state bcd is sent.

Presentation only: every value is derived from the aggregate's state (domain/node.py), which
decides and records; nothing here changes a node.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from better_compute.domain.base import iso
from better_compute.domain.node_rules import (
    ACCEPTANCE_FAILED,
    ACCEPTANCE_PASSED,
    ACCEPTANCE_PENDING,
    ACCEPTANCE_RUNNING,
    SESSION_CONNECTED,
    SESSION_DISCONNECTED,
    SESSION_NEVER,
    SESSION_UNREACHABLE,
)

if TYPE_CHECKING:
    from better_compute.domain.node import Node


def node_conditions(self: Node) -> list[dict[str, Any]]:
    """Connected, AcceptancePassed, Healthy, Schedulable, InventoryMatches, each with a reason
    and a time."""
    joined = iso(self.created_on) or ""
    since = self.transitions
    statuses = self.statuses()
    sick = [g for g in self.gpu_values() if not g.healthy]
    session_reason = {
        SESSION_NEVER: ("NeverConnected", "bcd node has not opened a session yet"),
        SESSION_CONNECTED: ("SessionUp", f"connected (epoch {self.session_epoch})"),
        SESSION_DISCONNECTED: ("Disconnected",
                               f"session epoch {self.session_epoch} ended; bcd reconnects"),
        SESSION_UNREACHABLE: ("Unreachable", "no session and no heartbeat within the timeout"),
    }[self.session]
    acceptance_reason = {
        ACCEPTANCE_PENDING: ("Pending", "acceptance starts once the session is up"),
        ACCEPTANCE_RUNNING: ("Running", f"attempt {self.acceptance_attempt} is running"),
        ACCEPTANCE_PASSED: ("Passed", f"attempt {self.acceptance_attempt} passed"),
        ACCEPTANCE_FAILED: ("TimedOut" if self.acceptance_failure == "timeout"
                            else "Failed", f"attempt {self.acceptance_attempt}: "
                            f"{self.acceptance_message}"),
    }[self.acceptance_state]
    health_reason = (("AllGpusHealthy", f"{len(self.gpus)} GPUs healthy") if not sick else
                     ("GpusUnhealthy", "; ".join(f"{g.uuid}: {g.why_unhealthy}" for g in sick)))
    if self.removed:
        sched = ("Removed", "the node was removed from its pool")
    elif not self.adopted:
        sched = ("NotAdopted", "the node is still adopting")
    elif self.session == SESSION_UNREACHABLE:
        sched = ("Unreachable", "the node is unreachable")
    elif self.draining:
        sched = ("Drained" if self.drained_at else "Draining",
                 self.cordon_reason or "draining")
    elif self.cordoned:
        sched = ("Cordoned", self.cordon_reason or "in maintenance")
    elif not statuses["Schedulable"]:
        sched = ("NoHealthyGpus", "no GPU of the node is healthy")
    else:
        sched = ("Ready", "the placer considers this node")
    mismatch = self.inventory_mismatch
    inventory_reason = (("InventoryMismatch", str(mismatch.get("message") or ""))
                        if mismatch is not None else
                        ("Accepted", f"the node reports the {len(self.gpus)} GPUs it has"))
    reasons = {"Connected": session_reason, "AcceptancePassed": acceptance_reason,
               "Healthy": health_reason, "Schedulable": sched,
               "InventoryMatches": inventory_reason}
    return [
        {"type": name, "status": "True" if statuses[name] else "False",
         "reason": reasons[name][0], "message": reasons[name][1],
         "lastTransitionTime": since.get(name) or joined}
        for name in CONDITIONS
    ]


CONDITIONS = ("Connected", "AcceptancePassed", "Healthy", "Schedulable", "InventoryMatches")


def node_doc(self: Node) -> dict[str, Any]:
    return {
        "id": self.public_id,
        "tenantId": self.tenant_id,
        "poolId": self.pool_id,
        "siteId": self.site_id,
        "role": self.role,
        "provisionState": self.provision_state,
        "conditions": node_conditions(self),
        "session": {"state": self.session, "epoch": self.session_epoch,
                    "since": iso(self.session_since), "lastSeen": iso(self.last_seen)},
        "acceptance": {"state": self.acceptance_state, "attempt": self.acceptance_attempt,
                       "message": self.acceptance_message,
                       "checks": [dict(c) for c in self.acceptance_results],
                       "since": iso(self.acceptance_since),
                       "failureReason": (self.acceptance_failure or "checks")
                       if self.acceptance_state == ACCEPTANCE_FAILED else None},
        "generation": self.generation,
        "maintenance": {"state": self.maintenance_state, "cordoned": self.cordoned,
                        "reason": self.cordon_reason, "since": iso(self.cordoned_since),
                        "drainedAt": iso(self.drained_at)},
        "removal": dict(self.removal) if self.removal else None,
        "inventoryMismatch": {k: v for k, v in self.inventory_mismatch.items()
                              if k != "identity"} if self.inventory_mismatch else None,
        "hardwareKey": self.hardware_key,
        "hardware": dict(self.hardware),
        "gpus": [dict(g) for g in self.gpus],
        "heldGpus": sum(len(a.get("gpus", [])) for a in self.device_assignments()),
        "keyPin": self.key_pin,
        "certificate": {
            "serial": self.certificate_serial,
            "notAfter": iso(self.certificate_not_after),
        },
        "joinTokenId": self.join_token_id,
        "bcdVersion": self.bcd_version,
        "joinedAt": iso(self.created_on),
        "adoptedAt": iso(self.adopted_at),
    }


def node_desired_sections(self: Node, pool_sections: dict[str, Any] | None) -> dict[str, Any]:
    """The node's desired state by section (docs/nodes.md, api/wire/gateway.py).

    ``pool_sections`` (domain/policy.py ``node_sections``: ``kubernetes``, ``profile``)
    come from the pool's policy and go down once the node is adopted, before ``devices``.
    """
    sections: dict[str, Any] = {}
    if not self.adopted and self.acceptance_attempt > 0:
        sections["acceptance"] = {"attempt": self.acceptance_attempt,
                                  "state": self.acceptance_state,
                                  "checks": [dict(c) for c in self.acceptance_checks]}
    if self.adopted:
        sections.update(pool_sections or {})
        sections["devices"] = {"assignments": self.device_assignments()}
    return sections
