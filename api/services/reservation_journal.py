"""The reservations' journal entries: allocation.bound, allocation.failed, allocation.released.

The gateway verifies each entry's signature with the node key before it calls
these handlers (api/gateway/journal.py); they turn the node's word into the
reservation's state, with the node as the actor (it signed the entry). The gateway's handlers are built, explicitly, from the services the
composition root made (``journal_handlers`` in api/gateway/journal.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar
from uuid import UUID

import msgspec

from better_compute.api.services.reservations import ReservationService
from better_compute.api.wire.journal import (
    AllocationBound,
    AllocationFailed,
    AllocationReleased,
    E,
    EntryInvalid,
    decode_entry,
)
from better_compute.domain.errors import InvalidInput
from better_compute.domain.ids import public_id
from better_compute.domain.reservation import BIND_FAILURE_REASONS

# handler(node uuid, session epoch, payload) -> None; raising a BetterComputeError refuses it
# (the verified entry's document: each handler decodes it, once, as the Struct of its kind)
JournalHandler = Callable[[UUID, int, dict[str, Any]], None]
A = TypeVar("A", AllocationBound, AllocationFailed, AllocationReleased)


def entry_of(kind: type[E], payload: dict[str, Any]) -> E:
    """A verified entry decoded, once, as its kind; a misfit is invalid input (a Nack)."""
    try:
        return decode_entry(payload, kind)
    except EntryInvalid as exc:
        raise InvalidInput(str(exc)) from None


def _allocation(payload: dict[str, Any], kind: type[A]) -> A:
    """The entry decoded as ``kind``; it must name an allocation."""
    entry = entry_of(kind, payload)
    if not entry.allocation_id.startswith("alloc_"):
        raise InvalidInput("the entry names no allocationId (alloc_…)")
    return entry


def reservation_handlers(reservations: ReservationService) -> dict[str, JournalHandler]:
    """The allocation.* kinds, answered by ``reservations``."""

    def bound(uuid: UUID, epoch: int, payload: dict[str, Any]) -> None:
        entry = _allocation(payload, AllocationBound)
        node_id = public_id("node", uuid)
        reservations.bound(node_id, msgspec.to_builtins(entry), actor=node_id)

    def failed(uuid: UUID, epoch: int, payload: dict[str, Any]) -> None:
        entry = _allocation(payload, AllocationFailed)
        reason = entry.reason or ""
        if reason not in BIND_FAILURE_REASONS:
            reason = "device-missing" if not reason else reason[:40]
        node_id = public_id("node", uuid)
        reservations.bind_failed(node_id, entry.allocation_id, reason,
                                 (entry.message or reason)[:500], reservations.now(),
                                 actor=node_id)

    def released(uuid: UUID, epoch: int, payload: dict[str, Any]) -> None:
        # The hold is gone from the node; the reservation already ended when it was released,
        # so there is nothing left to record.
        _allocation(payload, AllocationReleased)

    return {"allocation.bound": bound, "allocation.failed": failed,
            "allocation.released": released}
