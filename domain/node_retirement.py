"""Retiring a node (docs/nodes.md, "Drain, remove, re-join"): its commands and their events.

``node.draining`` is a cordon that also tracks when nothing is held any more
(``node.drained``); ``node.removed`` takes the node out of its pool and refuses its
certificate at the gateway; the same machine joining again brings the removed node back
(``node.rejoined``, in ``adopting``, with its new key and certificate).

These are methods of ``Node`` (domain/node.py assigns them in its class body, where the
library makes each ``@event`` method an event class with its pinned topic), kept in their
own module so that the aggregate reads in one screen per concern. Like every command, each
public one decides and the ``@event`` body only assigns.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

from eventsourcing.domain import event

from better_compute.domain.base import iso
from better_compute.domain.errors import Conflict
from better_compute.domain.node_rules import (
    ACCEPTANCE_PENDING,
    PROVISION_ADOPTING,
    PROVISION_REMOVED,
    SESSION_CONNECTED,
    SESSION_DISCONNECTED,
    SESSION_NEVER,
)

if TYPE_CHECKING:
    from better_compute.domain.node import Node


def drain(self: Node, reason: str, at: datetime, by: str | None, held: int) -> bool:
    """No new placements; holds and future bookings stay until they end (``held`` of them
    now). Drained at once when nothing is held. False when nothing changed."""
    if self.removed:
        raise Conflict(f"node {self.public_id} was removed: there is nothing to drain")
    changed = False
    if not self.draining:
        self._draining(reason=reason, at=at, by=by, held=held)
        changed = True
    if held == 0 and self.mark_drained(at):
        changed = True
    return changed


@event("Draining", topic="node.draining")
def _draining(self: Node, reason: str, at: datetime, by: str | None, held: int) -> None:
    self.cordoned = True  # a drain is a cordon that also says when nothing is held
    self.cordon_reason = reason
    self.cordoned_since = at
    self.draining = True
    self.drained_at = None
    self._touch(at)


def mark_drained(self: Node, at: datetime) -> bool:
    """The last hold or booking of a draining node ended; False when not draining."""
    if not self.draining or self.drained_at is not None:
        return False
    self._drained(at=at)
    return True


@event("Drained", topic="node.drained")
def _drained(self: Node, at: datetime) -> None:
    self.drained_at = at
    self._touch(at)


def remove(self: Node, at: datetime, by: str | None, reason: str, released: list[str]) -> None:
    """Out of its pool: the gateway refuses its certificate, capacity drops it. The
    caller ended every booking first (``released``: the reservations it released)."""
    if self.removed:
        raise Conflict(f"node {self.public_id} is already removed")
    if self.device_assignments():
        raise Conflict(f"node {self.public_id} still holds allocations: release them first "
                       "(`better-compute nodes remove NODE --force`)")
    self._removed(at=at, by=by, reason=reason, certificate_serial=self.certificate_serial,
                  released=list(released))


@event("Removed", topic="node.removed")
def _removed(self: Node, at: datetime, by: str | None, reason: str, certificate_serial: str,
             released: list[str]) -> None:
    self.provision_state = PROVISION_REMOVED
    if self.session == SESSION_CONNECTED:
        self.session = SESSION_DISCONNECTED
        self.session_since = at
    self.cordoned = False
    self.cordon_reason = ""
    self.draining = False
    self.drained_at = None
    self.removal = {"at": iso(at), "by": by, "reason": reason,
                    "revokedCertificateSerial": certificate_serial,
                    "releasedReservations": list(released)}
    self._touch(at)


def rejoin(self: Node, *, pool_id: str, site_id: str, join_token_id: str,
           hardware: dict[str, Any], gpus: list[dict[str, Any]], key_pin: str,
           certificate_serial: str, certificate_not_after: datetime,
           bcd_version: str | None, at: datetime) -> None:
    """The same machine joined again: the removed node comes back, ``adopting``."""
    if not self.removed:
        raise Conflict(f"node {self.public_id} was not removed")
    self._rejoined(pool_id=pool_id, site_id=site_id, join_token_id=join_token_id,
                   hardware=hardware, gpus=gpus, key_pin=key_pin,
                   certificate_serial=certificate_serial,
                   certificate_not_after=certificate_not_after, bcd_version=bcd_version,
                   at=at)


@event("Rejoined", topic="node.rejoined")
def _rejoined(self: Node, pool_id: str, site_id: str, join_token_id: str,
              hardware: dict[str, Any], gpus: list[dict[str, Any]], key_pin: str,
              certificate_serial: str, certificate_not_after: datetime,
              bcd_version: str | None, at: datetime) -> None:
    # The session epoch, the desired-state generation and the acceptance attempt keep
    # counting up: the new session fences off anything of the old one.
    self.pool_id = pool_id
    self.site_id = site_id
    self.join_token_id = join_token_id
    self.hardware = hardware
    self.gpus = gpus
    self.key_pin = key_pin
    self.certificate_serial = certificate_serial
    self.certificate_not_after = certificate_not_after
    self.bcd_version = bcd_version
    self.provision_state = PROVISION_ADOPTING
    self.session = SESSION_NEVER
    self.session_since = at
    self.acceptance_state = ACCEPTANCE_PENDING
    self.acceptance_checks = []
    self.acceptance_results = []
    self.acceptance_message = ""
    self.acceptance_since = None
    self.adopted_at = None
    self.devices = {}
    self.removal = None
    self.inventory_mismatch = None  # it joined again: its GPUs are the ones it joined with
    self._touch(at)
