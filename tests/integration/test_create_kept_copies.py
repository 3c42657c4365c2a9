"""A create books on the copies of the bookings, quota use and node this process kept, with
no read: what another process saved meanwhile makes the save fail, and the create reads
again (api/services/reservation_base.py ``to_save``). A refusal is never made on such a copy
alone: an overlap or a used-up quota is checked again on a fresh read.

Two runtimes on one store stand for two processes (``serve --workers 2``): each keeps its
own copies.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from better_compute.api.controllers.queue import QueueDispatcher
from better_compute.domain.access import LOCAL_OPERATOR as OP
from tests.fleet import offered_pool, placed_again
from tests.integration.test_queue_service import booked
from tests.integration.test_reservations_service import reserve, setup
from tests.support import open_runtime


@pytest.fixture
def other(runtime: Any, env: dict[str, str]) -> Iterator[Any]:
    second = open_runtime(env)
    yield second
    second.close()


def test_a_quota_another_process_refunded_is_not_refused(runtime: Any, other: Any) -> None:
    pool = offered_pool(runtime.service, nodes=2, gpus=2)
    mine = runtime.services.reservations
    doc = mine.create(OP, tenant_id="acme", pool_id=pool, gpus=2, duration="1h")
    other.services.reservations.release(OP, doc["id"])  # the quota is free again, there
    again = mine.create(OP, tenant_id="acme", pool_id=pool, gpus=2, duration="1h")
    assert again["state"] in ("placed", "binding")


def test_gpus_another_process_freed_are_booked_here(runtime: Any, other: Any,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    pool = offered_pool(runtime.service, nodes=1, gpus=8)
    mine = runtime.services.reservations
    held = mine.create(OP, tenant_id="acme", pool_id=pool, gpus=8, duration="1h")
    other.services.reservations.release(OP, held["id"])  # this process's copy still holds them
    lost = placed_again(monkeypatch)
    again = mine.create(OP, tenant_id="acme", pool_id=pool, gpus=8, duration="1h")
    assert again["nodeId"] == held["nodeId"]
    # The kept copies said "taken" (the bookings) and were older than the store's (the
    # node): read again each time, then booked.
    assert lost and set(lost) == {held["nodeId"]}


def test_a_node_another_process_booked_on_is_not_double_booked(runtime: Any,
                                                              other: Any) -> None:
    pool = offered_pool(runtime.service, nodes=1, gpus=8)
    mine, theirs = runtime.services.reservations, other.services.reservations
    first = mine.create(OP, tenant_id="acme", pool_id=pool, gpus=2, duration="1h")
    second = theirs.create(OP, tenant_id="acme", pool_id=pool, gpus=4, duration="1h")
    third = mine.create(OP, tenant_id="acme", pool_id=pool, gpus=2, duration="1h")
    gpus = [g for doc in (first, second, third) for g in doc["gpus"]]
    assert len(gpus) == len(set(gpus)) == 8


def test_a_move_to_another_node_ends_a_booking_this_process_never_saw(runtime: Any,
                                                                       other: Any) -> None:
    # Only a create books on kept copies: a copy that does not hold the booking to end would
    # end nothing, save nothing, and so never be found stale (the history checker's
    # key-booked-twice: the old node kept the moved reservation's booking).
    rs, clock, pool, nodes = setup(runtime, nodes=2, quota=None)
    other.service.clock = clock
    theirs = other.services.reservations
    mine = reserve(rs, pool, 8, duration="2h")  # this process keeps that node's bookings
    held = reserve(theirs, pool, 8, duration="3h")
    early = reserve(theirs, pool, 4, duration="1h", start="earliest")
    assert early["nodeId"] == mine["nodeId"] != held["nodeId"]  # booked where mine ends
    clock.advance(minutes=10)
    theirs.release(OP, held["id"])
    assert QueueDispatcher(rs).run().rescheduled == [early["id"]]
    moved = rs.get_doc(OP, early["id"])
    assert moved["nodeId"] == held["nodeId"]
    [booking] = booked(runtime, nodes, early["id"])  # the old node's booking ended
    assert sorted(booking["gpus"]) == sorted(moved["gpus"])
