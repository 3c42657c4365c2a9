"""The reservations' journal entries: allocation.bound, allocation.failed, allocation.released.

The gateway verifies each entry's signature with the node key before it calls
these handlers (api/gateway/journal.py); they turn the node's word into the
reservation's state. The gateway's handlers are built, explicitly, from the services the
composition root made (``journal_handlers`` in api/gateway/journal.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from uuid import UUID

from better_compute.api.services.reservations import ReservationService
from better_compute.domain.errors import InvalidInput
from better_compute.domain.ids import public_id
from better_compute.domain.reservation import BIND_FAILURE_REASONS

# handler(node uuid, session epoch, payload) -> None; raising a BetterComputeError refuses it
JournalHandler = Callable[[UUID, int, dict[str, Any]], None]


def _allocation(payload: dict[str, Any]) -> str:
    allocation_id = payload.get("allocationId")
    if not isinstance(allocation_id, str) or not allocation_id.startswith("alloc_"):
        raise InvalidInput("the entry names no allocationId (alloc_…)")
    return allocation_id


def reservation_handlers(reservations: ReservationService) -> dict[str, JournalHandler]:
    """The allocation.* kinds, answered by ``reservations``."""

    def bound(uuid: UUID, epoch: int, payload: dict[str, Any]) -> None:
        _allocation(payload)
        reservations.bound(public_id("node", uuid), payload)

    def failed(uuid: UUID, epoch: int, payload: dict[str, Any]) -> None:
        allocation_id = _allocation(payload)
        reason = str(payload.get("reason") or "")
        if reason not in BIND_FAILURE_REASONS:
            reason = "device-missing" if not reason else reason[:40]
        reservations.bind_failed(public_id("node", uuid), allocation_id, reason,
                                 str(payload.get("message") or reason)[:500], reservations.now())

    def released(uuid: UUID, epoch: int, payload: dict[str, Any]) -> None:
        # The hold is gone from the node; the reservation already ended when it was released,
        # so there is nothing left to record.
        _allocation(payload)

    return {"allocation.bound": bound, "allocation.failed": failed,
            "allocation.released": released}
