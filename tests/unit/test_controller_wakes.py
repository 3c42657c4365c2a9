"""Which events wake which controller loop (api/controllers/runner.py).

A stream of creates must not wake the queue dispatcher: a create only takes capacity, so a
pass it wakes finds nothing new to place (it cost ~6 % of the server's CPU per create). Every
event that can grow capacity or add to a line wakes it; the 1-second tick runs it anyway.
"""

from __future__ import annotations

from better_compute.api.controllers.runner import _WAKE_ON, _WAKE_TIMERS
from better_compute.api.store.eventlog import EventFilter, LogEntry
from tests.unit.test_events_reference import public_types


def wakes(flt: EventFilter, type_: str) -> bool:
    return flt.matches(LogEntry(sequence=1, type=type_, tenant_id="t", line=b""))


# What a reservation that starts now writes, from its create to its node's report.
CREATE_AND_BIND = ["reservation.placed", "bookings.opened", "bookings.booked", "quota.opened",
                   "quota.taken", "reservation.binding", "node.devices.assigned",
                   "reservation.active"]
# What can free GPUs or quota, or add to a pool's line: the dispatcher must look again.
GROWS = ["reservation.released", "reservation.cancelled", "reservation.failed",
         "reservation.expired", "reservation.replaced", "reservation.rescheduled",
         "reservation.queued", "bookings.ended", "quota.refunded", "pool.offered",
         "pool.created", "node.adopted", "node.uncordoned", "node.gpu.healthy",
         "node.connected", "node.rejoined", "node.inventory.accepted"]


def test_a_create_and_its_binding_do_not_wake_the_queue_dispatcher() -> None:
    assert [t for t in CREATE_AND_BIND if wakes(_WAKE_ON, t)] == []


def test_what_frees_capacity_or_queues_wakes_the_queue_dispatcher() -> None:
    assert [t for t in GROWS if not wakes(_WAKE_ON, t)] == []


# The rest of what only takes or keeps capacity, or adds none.
OTHER_QUIET = ["reservation.extended", "reservation.dequeued", "bookings.extended",
               "node.devices.unassigned", "node.joined", "node.cordoned", "node.draining",
               "node.drained", "node.gpu.unhealthy", "node.disconnected", "node.unreachable",
               "node.removed", "node.certificate.renewed", "node.acceptance.started",
               "node.acceptance.failed", "node.inventory.mismatch"]


def test_every_event_type_is_sorted_into_waking_or_not() -> None:
    """A new event type fails here until it is put in one of the lists (and it wakes the
    dispatcher until then: when in doubt, look again)."""
    relevant = {t for t in public_types()
                if t.split(".")[0] in ("reservation", "bookings", "quota", "pool", "node")}
    assert relevant == set(CREATE_AND_BIND) | set(GROWS) | set(OTHER_QUIET)
    assert [t for t in OTHER_QUIET if wakes(_WAKE_ON, t)] == []
    assert wakes(_WAKE_ON, "node.something.new") and not wakes(_WAKE_ON, "site.created")


def test_the_timers_wake_on_what_another_hand_made_due() -> None:
    """A create that starts now binds in its own save (no pass needed); the queue's
    placement, a failed hold placed again and a move earlier are bound by the timers."""
    assert [t for t in CREATE_AND_BIND if wakes(_WAKE_TIMERS, t)] == []
    assert all(wakes(_WAKE_TIMERS, t) for t in
               ("reservation.dequeued", "reservation.replaced", "reservation.rescheduled"))
