"""The reservations' journal entries: allocation.bound, allocation.failed, allocation.released.

The gateway verifies each entry's signature with the node key before it calls
these handlers (api/gateway/journal.py); they turn the node's word into the
reservation's state. Importing this module registers them (api/methods does).
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from better_compute.api.gateway.journal import handles
from better_compute.api.services.reservations import reservations
from better_compute.domain.errors import InvalidInput
from better_compute.domain.ids import public_id
from better_compute.domain.reservation import BIND_FAILURE_REASONS


def _allocation(payload: dict[str, Any]) -> str:
    allocation_id = payload.get("allocationId")
    if not isinstance(allocation_id, str) or not allocation_id.startswith("alloc_"):
        raise InvalidInput("the entry names no allocationId (alloc_…)")
    return allocation_id


@handles("allocation.bound")
def allocation_bound(nodes: Any, uuid: UUID, epoch: int, payload: dict[str, Any]) -> None:
    _allocation(payload)
    reservations(nodes.service).bound(public_id("node", uuid), payload)


@handles("allocation.failed")
def allocation_failed(nodes: Any, uuid: UUID, epoch: int, payload: dict[str, Any]) -> None:
    allocation_id = _allocation(payload)
    reason = str(payload.get("reason") or "")
    if reason not in BIND_FAILURE_REASONS:
        reason = "device-missing" if not reason else reason[:40]
    service = reservations(nodes.service)
    service.bind_failed(public_id("node", uuid), allocation_id, reason,
                        str(payload.get("message") or reason)[:500], service.now())


@handles("allocation.released")
def allocation_released(nodes: Any, uuid: UUID, epoch: int, payload: dict[str, Any]) -> None:
    # The hold is gone from the node; the reservation already ended when it was released,
    # so there is nothing left to record.
    _allocation(payload)
