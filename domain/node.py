"""Nodes: machines that joined a pool with a join token, and their lifecycle.

A node is created by ``node.joined`` in provision state ``adopting``, in the
same atomic save that spends the join token. It belongs to the pool's owner.
It remembers what the machine reported when it joined (hardware facts and
GPUs), the SPKI pin of the node key generated on the machine (the key never
leaves it) and the serial and end of the node certificate issued for that key.

The lifecycle (docs/nodes.md): each gateway session bumps the session epoch
(``node.connected``); a session that ends records ``node.disconnected`` and a
node silent for the heartbeat timeout ``node.unreachable``. Acceptance runs
in attempts (``node.acceptance.started``); a failed attempt is sticky
(``node.acceptance.failed``) until ``nodes.adopt`` starts another; a passed
one adopts the node (``node.adopted``) at desired-state generation 1. GPU
health changes (``node.gpu.unhealthy`` / ``node.gpu.healthy``) and
maintenance (``node.cordoned`` / ``node.uncordoned``) change its conditions
and its capacity, never a hold. Every lifecycle event carries ``at``, the
control plane's clock when it was decided.

Acceptance's commands and events are in domain/node_acceptance.py, its inventory's (what a
node may change of its GPUs) in domain/node_inventory.py, retiring's (drain, remove,
re-join) in domain/node_retirement.py: assigned in the class body below, they are the
aggregate's own methods and events. How a node reads (its conditions, its document, the
desired state it is sent) is in domain/node_view.py.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import UUID

from eventsourcing.domain import event

from better_compute.domain import node_acceptance as acceptance
from better_compute.domain import node_inventory as inventory
from better_compute.domain import node_retirement as retirement
from better_compute.domain.base import TenantOwned, iso
from better_compute.domain.gpus import Gpu, gpu_is_healthy, gpus_of, with_health
from better_compute.domain.node_rules import (
    ACCEPTANCE_PASSED,
    ACCEPTANCE_PENDING,
    PROVISION_ADOPTED,
    PROVISION_ADOPTING,
    PROVISION_REMOVED,
    SESSION_CONNECTED,
    SESSION_DISCONNECTED,
    SESSION_NEVER,
    SESSION_UNREACHABLE,
    placement_eligible,
)
from better_compute.domain.node_view import node_conditions, node_desired_sections, node_doc

NODE_ROLE = "node"

_NO_DEVICES: dict[str, dict[str, Any]] = {}
_NO_TIME: datetime | None = None
_NO_REMOVAL: dict[str, Any] | None = None
_NO_STATUSES: dict[str, bool] = {}
_NO_MISMATCH: dict[str, Any] | None = None


class Node(TenantOwned):
    PREFIX = "node"
    TOPIC = "bc.aggregate.node"
    # Every event gives an attribute a new value, never changes one in place: the aggregate
    # cache hands out shallow copies (api/store/aggregate_cache.py, COPY_ON_WRITE).
    COPY_ON_WRITE = True

    class Event(TenantOwned.Event):
        TOPIC = "bc.node.event"

    # State that events after node.joined brought in: a node (or snapshot) recorded before
    # any of them reads these defaults. Event bodies replace them, never change them in place.
    # (Not annotated here: annotated names would become fields of the aggregate's __init__.)
    devices = _NO_DEVICES  # holds by allocation id (assign_devices)
    draining = False
    drained_at = _NO_TIME
    acceptance_failure = ""  # "timeout" when the last attempt timed out
    removal = _NO_REMOVAL
    inventory_mismatch = _NO_MISMATCH  # what the node listed that differs from its GPUs
    _status_cache = _NO_STATUSES

    @event("Joined", topic="node.joined")
    def __init__(
        self, id: UUID, tenant_id: str, pool_id: str, site_id: str, join_token_id: str,
        role: str, hardware_key: str, hardware: dict[str, Any], gpus: list[dict[str, Any]],
        key_pin: str, certificate_serial: str, certificate_not_after: datetime,
        bcd_version: str | None,
    ) -> None:
        self.tenant_id = tenant_id
        self.pool_id = pool_id
        self.site_id = site_id
        self.join_token_id = join_token_id
        self.role = role
        self.hardware_key = hardware_key
        self.hardware = hardware
        self.gpus = gpus
        self.key_pin = key_pin
        self.certificate_serial = certificate_serial
        self.certificate_not_after = certificate_not_after
        self.bcd_version = bcd_version
        self.provision_state = PROVISION_ADOPTING
        self._init_lifecycle()

    # ------------------------------------------------------------- lifecycle

    def _init_lifecycle(self) -> None:
        self.session = SESSION_NEVER
        self.session_epoch = 0
        self.session_since: datetime | None = None
        self.last_seen: datetime | None = None
        self.acceptance_state = ACCEPTANCE_PENDING
        self.acceptance_attempt = 0
        self.acceptance_checks: list[dict[str, Any]] = []
        self.acceptance_results: list[dict[str, Any]] = []
        self.acceptance_message = ""
        self.acceptance_since: datetime | None = None
        self.generation = 0
        self.adopted_at: datetime | None = None
        self.cordoned = False
        self.cordon_reason = ""
        self.cordoned_since: datetime | None = None
        self.transitions: dict[str, str] = {}  # condition -> when it last changed
        self._status_cache = self.statuses()

    @property
    def adopted(self) -> bool:
        return self.provision_state == PROVISION_ADOPTED

    def connect(self, at: datetime, bcd_version: str | None) -> int:
        """A new gateway session: the epoch goes up by one; older sessions are fenced off."""
        epoch = self.session_epoch + 1
        self._connected(epoch=epoch, at=at, bcd_version=bcd_version)
        return epoch

    @event("Connected", topic="node.connected")
    def _connected(self, epoch: int, at: datetime, bcd_version: str | None) -> None:
        self.session_epoch = epoch
        self.session = SESSION_CONNECTED
        self.session_since = at
        self.last_seen = at
        if bcd_version:
            self.bcd_version = bcd_version
        self._touch(at)

    def disconnect(self, epoch: int, at: datetime, reason: str) -> bool:
        """The session of ``epoch`` ended; False when a newer one already took over."""
        if epoch != self.session_epoch or self.session != SESSION_CONNECTED:
            return False
        self._disconnected(epoch=epoch, at=at, reason=reason)
        return True

    @event("Disconnected", topic="node.disconnected")
    def _disconnected(self, epoch: int, at: datetime, reason: str) -> None:
        self.session = SESSION_DISCONNECTED
        self.session_since = at
        self.last_seen = at
        self._touch(at)

    def mark_unreachable(self, at: datetime, last_seen: datetime | None) -> bool:
        """No session and no heartbeat for the timeout; False when already unreachable."""
        if self.session not in (SESSION_CONNECTED, SESSION_DISCONNECTED) or self.removed:
            return False
        self._unreachable(epoch=self.session_epoch, at=at, last_seen=last_seen or self.last_seen)
        return True

    @event("Unreachable", topic="node.unreachable")
    def _unreachable(self, epoch: int, at: datetime, last_seen: datetime | None) -> None:
        self.session = SESSION_UNREACHABLE
        self.session_since = at
        self._touch(at)

    start_acceptance = acceptance.start_acceptance
    _acceptance_started = acceptance._acceptance_started
    time_out_acceptance = acceptance.time_out_acceptance
    finish_acceptance = acceptance.finish_acceptance
    refuse_acceptance = acceptance.refuse_acceptance
    _adopted = acceptance._adopted
    _acceptance_failed = acceptance._acceptance_failed

    note_inventory_mismatch = inventory.note_inventory_mismatch
    _inventory_mismatch = inventory._inventory_mismatch
    accept_inventory = inventory.accept_inventory
    _inventory_accepted = inventory._inventory_accepted

    def set_gpu_health(self, uuid: str, healthy: bool, reasons: list[str], at: datetime) -> bool:
        """Record a GPU turning unhealthy or healthy again; holds on it are never touched."""
        current = next((g for g in self.gpu_values() if g.uuid == uuid), None)
        if current is None:
            return False
        if healthy == current.healthy and (healthy or list(current.health_reasons) == reasons):
            return False
        if healthy:
            self._gpu_healthy(uuid=uuid, at=at)
        else:
            self._gpu_unhealthy(uuid=uuid, reasons=list(reasons), at=at)
        return True

    @event("GpuUnhealthy", topic="node.gpu.unhealthy")
    def _gpu_unhealthy(self, uuid: str, reasons: list[str], at: datetime) -> None:
        self.gpus = [with_health(g, False, reasons) if g.get("uuid") == uuid else g
                     for g in self.gpus]
        self._touch(at)

    @event("GpuHealthy", topic="node.gpu.healthy")
    def _gpu_healthy(self, uuid: str, at: datetime) -> None:
        self.gpus = [with_health(g, True, ()) if g.get("uuid") == uuid else g
                     for g in self.gpus]
        self._touch(at)

    def renew_certificate(self, serial: str, not_after: datetime, at: datetime) -> None:
        """A new node certificate for the SAME node key (checked by the caller), over a session."""
        self._certificate_renewed(serial=serial, not_after=not_after, at=at)

    @event("CertificateRenewed", topic="node.certificate.renewed")
    def _certificate_renewed(self, serial: str, not_after: datetime, at: datetime) -> None:
        self.certificate_serial = serial
        self.certificate_not_after = not_after

    def cordon(self, reason: str, at: datetime, by: str | None) -> bool:
        """Put the node in maintenance: the placer skips it; holds stay."""
        if self.cordoned and self.cordon_reason == reason:
            return False
        self._cordoned(reason=reason, at=at, by=by)
        return True

    @event("Cordoned", topic="node.cordoned")
    def _cordoned(self, reason: str, at: datetime, by: str | None) -> None:
        self.cordoned = True
        self.cordon_reason = reason
        self.cordoned_since = at
        self._touch(at)

    def uncordon(self, at: datetime, by: str | None) -> bool:
        if not self.cordoned:
            return False
        self._uncordoned(at=at, by=by)
        return True

    @event("Uncordoned", topic="node.uncordoned")
    def _uncordoned(self, at: datetime, by: str | None) -> None:
        self.cordoned = False
        self.cordon_reason = ""
        self.cordoned_since = at
        self.draining = False  # uncordon also ends a drain
        self.drained_at = None
        self._touch(at)

    # ------------------------------------------------ device assignments (reservations)

    def device_assignments(self) -> list[dict[str, Any]]:
        """Holds the node must keep, oldest first (the ``devices`` section of desired state)."""
        return [dict(a) for a in self.devices.values()]

    def assign_devices(self, assignment: dict[str, Any], at: datetime) -> bool:
        """Add a reservation's hold; the desired generation goes up. False if already there."""
        devices = self.devices
        if assignment["allocationId"] in devices:
            return False
        self._devices_assigned(assignment=dict(assignment), generation=self.generation + 1, at=at)
        return True

    @event("DevicesAssigned", topic="node.devices.assigned")
    def _devices_assigned(self, assignment: dict[str, Any], generation: int, at: datetime
                          ) -> None:
        self.devices = {**self.devices, assignment["allocationId"]: assignment}
        self.generation = generation

    def unassign_devices(self, allocation_id: str, at: datetime) -> bool:
        """Drop a hold from the desired state (release, re-placement); False if absent."""
        if allocation_id not in self.devices:
            return False
        self._devices_unassigned(allocation_id=allocation_id, generation=self.generation + 1,
                                 at=at)
        return True

    @event("DevicesUnassigned", topic="node.devices.unassigned")
    def _devices_unassigned(self, allocation_id: str, generation: int, at: datetime) -> None:
        self.devices = {k: v for k, v in self.devices.items()
                        if k != allocation_id}
        self.generation = generation

    # ------------------------------------------------ drain, removal, re-join

    @property
    def removed(self) -> bool:
        return self.provision_state == PROVISION_REMOVED

    @property
    def maintenance_state(self) -> str:
        """``none``, ``cordoned``, ``draining`` or ``drained`` (docs/nodes.md)."""
        if self.draining:
            return "drained" if self.drained_at else "draining"
        return "cordoned" if self.cordoned else "none"

    drain = retirement.drain
    _draining = retirement._draining
    mark_drained = retirement.mark_drained
    _drained = retirement._drained
    remove = retirement.remove
    _removed = retirement._removed
    rejoin = retirement.rejoin
    _rejoined = retirement._rejoined

    # ------------------------------------------------------------ derived state

    def gpu_values(self) -> list[Gpu]:
        """Its GPUs as values (``gpus`` holds the documents its events carry)."""
        return gpus_of(self.gpus)

    @property
    def healthy(self) -> bool:
        return all(gpu_is_healthy(g) for g in self.gpus)

    @property
    def schedulable(self) -> bool:
        return placement_eligible(self.provision_state, self.session, self.cordoned,
                                  self.draining, self.gpus)

    def statuses(self) -> dict[str, bool]:
        return {
            "Connected": self.session == SESSION_CONNECTED,
            "AcceptancePassed": self.acceptance_state == ACCEPTANCE_PASSED,
            "Healthy": self.healthy,
            "Schedulable": self.schedulable,
            "InventoryMatches": self.inventory_mismatch is None,
        }

    def _touch(self, at: datetime) -> None:
        """Remember when each condition last changed (runs inside event bodies: derived only)."""
        previous = self._status_cache
        statuses = self.statuses()
        stamped = dict(self.transitions)
        for name, status in statuses.items():
            if previous.get(name) != status:
                stamped[name] = iso(at) or ""
        self.transitions = stamped
        self._status_cache = statuses

    def conditions(self) -> list[dict[str, Any]]:
        """Connected, AcceptancePassed, Healthy, Schedulable, InventoryMatches, each with a
        reason and a time."""
        return node_conditions(self)

    def desired_sections(self, pool_sections: dict[str, Any] | None = None) -> dict[str, Any]:
        """The node's desired state by section (docs/nodes.md, api/wire/gateway.py)."""
        return node_desired_sections(self, pool_sections)

    def to_doc(self) -> dict[str, Any]:
        return node_doc(self)
