"""The Reservation aggregate's life: placed, binding, active, released; cancel; re-place; fail."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from better_compute.domain.errors import Conflict
from better_compute.domain.events import public_event
from better_compute.domain.ids import new_uuid
from better_compute.domain.reservation import (
    BIND_TIMEOUT,
    MAX_PLACEMENTS,
    Reservation,
    new_allocation_id,
    reservation_uuid,
)

T0 = datetime(2030, 1, 1, tzinfo=UTC)


def make(start: datetime = T0) -> Reservation:
    return Reservation(
        id=new_uuid(), tenant_id="acme", pool_id="pool_a", gpu_count=2, request={},
        start=start, end=start + timedelta(hours=2), key=None, fingerprint=None,
        created_by=None, allocation_id=new_allocation_id(), node_id="node_a",
        gpus=["GPU-1", "GPU-2"], cpus=20, memory_gib=200,
    )


def test_allocation_ids_have_no_dash_and_keys_give_stable_ids() -> None:
    alloc = new_allocation_id()
    assert alloc.startswith("alloc_") and "-" not in alloc
    assert reservation_uuid("acme", "k") == reservation_uuid("acme", "k")
    assert reservation_uuid("acme", "k") != reservation_uuid("other", "k")


def test_the_happy_life_and_its_events() -> None:
    rsv = make()
    rsv.begin_binding(T0)
    assert rsv.state == "binding" and rsv.bind_deadline == T0 + BIND_TIMEOUT
    assert not rsv.bound("alloc_other", {})
    assert rsv.bound(rsv.allocation_id, {"nodeId": "node_a"})
    rsv.extend(rsv.end + timedelta(hours=1))
    assert rsv.release(T0 + timedelta(hours=1), "released")
    assert not rsv.release(T0 + timedelta(hours=1), "released")
    types = [public_event(i, e)["type"] for i, e in enumerate(rsv.collect_events())]
    assert types == ["reservation.placed", "reservation.binding", "reservation.active",
                     "reservation.extended", "reservation.released"]
    assert rsv.to_doc()["binding"] == {"nodeId": "node_a"}


def test_cancel_only_before_the_start() -> None:
    future = make(T0 + timedelta(hours=2))
    future.cancel(T0)
    assert future.state == "cancelled"
    started = make(T0)
    with pytest.raises(Conflict) as err:
        started.cancel(T0 + timedelta(minutes=1))
    assert "release" in err.value.message and started.state == "placed"


def test_at_most_two_replacements_then_only_failure() -> None:
    rsv = make()
    for n in range(MAX_PLACEMENTS - 1):
        rsv.begin_binding(T0)
        rsv.replace(reason="device-missing", message="gone", allocation_id=new_allocation_id(),
                    node_id=f"node_{n}", gpus=["GPU-x"], cpus=1, memory_gib=1)
    assert rsv.attempt == MAX_PLACEMENTS and not rsv.can_replace
    with pytest.raises(Conflict):
        rsv.replace(reason="overlap", message="", allocation_id=new_allocation_id(),
                    node_id="node_z", gpus=["GPU-y"], cpus=1, memory_gib=1)
    rsv.fail("overlap", "again", T0)
    assert rsv.state == "failed" and rsv.failure == {"reason": "overlap", "message": "again"}
    assert len(rsv.to_doc()["previousPlacements"]) == MAX_PLACEMENTS - 1
    with pytest.raises(Conflict):
        rsv.extend(rsv.end + timedelta(hours=1))
