"""The earliest start, moving reservations earlier and the queue, through the service.

On SQLite and PostgreSQL; time is the service's injected clock, never slept. The dispatcher
pass (``QueueDispatcher.run``) is what the elected ``serve`` process runs when GPUs free up.
"""

from __future__ import annotations

from typing import Any

import pytest
from eventsourcing.application import AggregateNotFoundError

from better_compute.api.controllers.queue import QueueDispatcher
from better_compute.api.controllers.reservations import ReservationTimers
from better_compute.domain.access import LOCAL_OPERATOR as OP
from better_compute.domain.access import Principal, Role
from better_compute.domain.errors import Conflict, InvalidInput, NoCapacity, QuotaExceeded
from better_compute.domain.ids import parse_id
from better_compute.domain.quota import QuotaUse, quota_uuid
from tests.fleet import add_nodes
from tests.integration.test_reservations_service import (
    ACME,
    bookings,
    journal,
    reserve,
    setup,
)

BETA = Principal("beta", Role.MEMBER, "tok_beta")


def events(runtime: Any, rsv: str) -> list[str]:
    uuid = parse_id("rsv", rsv)
    return [type(e).TOPIC for e in runtime.store.events.get(uuid)]


def quota_events(runtime: Any, pool: str, tenant: str, rsv: str) -> list[str]:
    stored = runtime.store.events.get(quota_uuid(pool, tenant))  # none yet: empty
    return [type(e).TOPIC for e in stored if getattr(e, "reservation_id", None) == rsv]


def booked(runtime: Any, node_ids: list[str], rsv: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for node_id in node_ids:
        try:
            agg = bookings(runtime, node_id)
        except AggregateNotFoundError:  # nothing was ever booked on it
            continue
        out.extend(b for b in agg.bookings.values() if b["reservationId"] == rsv)
    return out


def offer(runtime: Any, pool: str, tenant: str, gpus: int) -> None:
    runtime.service.tenants_create(OP, tenant, None)
    runtime.service.pools_offer(OP, pool, tenant, {"gpu": gpus})


def test_preview_answers_the_earliest_start_exactly_and_earliest_books_it(runtime: Any) -> None:
    rs, _, pool, nodes = setup(runtime, nodes=2)
    first = reserve(rs, pool, 8, duration="2h")
    second = reserve(rs, pool, 8, duration="3h")
    assert {first["nodeId"], second["nodeId"]} == set(nodes)
    preview = rs.preview(OP, tenant_id=None, pool_id=pool, gpus=6, duration="1h")
    assert preview["fits"] is False and preview["reason"] == "no_capacity"
    earliest = preview["earliest"]
    assert earliest["start"] == first["end"] == "2031-05-01T14:00:00Z"
    assert earliest["end"] == "2031-05-01T15:00:00Z"
    assert earliest["nodeId"] == first["nodeId"] and len(earliest["gpus"]) == 6
    assert earliest["hostResources"] == {"cpus": 156, "memoryGiB": 1434}
    assert earliest["start"] in preview["message"]
    placed = reserve(rs, pool, 6, duration="1h", start="earliest", key="early")
    assert placed["state"] == "placed"
    assert (placed["start"], placed["end"], placed["nodeId"]) == (
        earliest["start"], earliest["end"], earliest["nodeId"])
    assert placed["gpus"] == earliest["gpus"]
    assert placed["request"]["start"] == "earliest" and placed["request"]["moveEarlier"]
    # Fits now: the same verdict as before, and the earliest start is the start.
    now = rs.preview(OP, tenant_id=None, pool_id=pool, gpus=2, duration="1h", start="+2h")
    assert now["fits"] is True and now["earliest"]["start"] == "2031-05-01T14:00:00Z"


def test_an_early_release_moves_earliest_and_move_earlier_reservations_forward(
        runtime: Any) -> None:
    rs, clock, pool, nodes = setup(runtime, nodes=1)
    blocking = reserve(rs, pool, 8, duration="2h")
    early = reserve(rs, pool, 4, duration="1h", start="earliest")
    asked = reserve(rs, pool, 2, duration="1h", start="+2h", move_earlier=True)
    fixed = reserve(rs, pool, 2, duration="1h", start="+2h")
    dispatcher = QueueDispatcher(rs)
    assert dispatcher.run().rescheduled == []  # nothing freed: nothing moves
    clock.advance(minutes=10)
    rs.release(OP, blocking["id"])
    report = dispatcher.run()
    assert sorted(report.rescheduled) == sorted([early["id"], asked["id"]])
    moved = rs.get_doc(OP, early["id"])
    assert (moved["start"], moved["end"]) == ("2031-05-01T12:10:00Z", "2031-05-01T13:10:00Z")
    assert moved["nodeId"] == nodes[0] and moved["allocationId"] != early["allocationId"]
    assert rs.get_doc(OP, asked["id"])["start"] == "2031-05-01T12:10:00Z"
    assert rs.get_doc(OP, fixed["id"])["start"] == "2031-05-01T14:00:00Z"  # not asked: stays
    assert events(runtime, early["id"]) == ["reservation.placed", "reservation.rescheduled"]
    [change] = [e for e in runtime.store.events.get(parse_id("rsv", early["id"]))
                if type(e).TOPIC == "reservation.rescheduled"]
    assert (change.previous_start.isoformat(), change.previous_node_id) == (
        "2031-05-01T14:00:00+00:00", nodes[0])
    assert len(booked(runtime, nodes, early["id"])) == 1  # the old booking is gone
    assert dispatcher.run().rescheduled == []  # never later, never twice


def test_a_queued_reservation_over_quota_is_placed_when_its_quota_frees(runtime: Any) -> None:
    rs, clock, pool, nodes = setup(runtime, nodes=2, quota=4)
    held = reserve(rs, pool, 4, who=ACME, duration="2h")
    with pytest.raises(QuotaExceeded):
        reserve(rs, pool, 4, who=ACME)
    preview = rs.preview(ACME, tenant_id=None, pool_id=pool, gpus=4, duration="1h")
    assert preview["reason"] == "quota_exceeded" and preview["quotaFreesAt"] == held["end"]
    assert preview["earliest"]["start"] == held["end"]
    queued = reserve(rs, pool, 4, who=ACME, duration="1h", queue=True, key="q1")
    assert queued["state"] == "queued" and queued["queue"]["position"] == 1
    assert queued["nodeId"] is None and queued["gpus"] == [] and queued["start"] is None
    assert queued["queue"]["deadline"] == "2031-05-01T18:00:00Z"  # 6h by default
    assert reserve(rs, pool, 4, who=ACME, duration="1h", queue=True, key="q1")["id"] == \
        queued["id"]  # the same key: the same reservation, queued once
    listed = rs.list(ACME, None, None, "queued")
    assert [(r["id"], r["queue"]["position"]) for r in listed] == [(queued["id"], 1)]
    dispatcher = QueueDispatcher(rs)
    assert dispatcher.run().placed == []
    with pytest.raises(Conflict) as err:
        rs.release(ACME, queued["id"])
    assert "--cancel" in err.value.message
    clock.advance(minutes=5)
    rs.release(ACME, held["id"])
    report = dispatcher.run()
    assert report.placed == [queued["id"]]
    doc = rs.get_doc(ACME, queued["id"])
    assert doc["state"] == "placed" and doc["start"] == "2031-05-01T12:05:00Z"
    assert doc["queue"]["dequeuedAt"] == "2031-05-01T12:05:00Z" and "position" not in doc["queue"]
    assert events(runtime, queued["id"]) == ["reservation.queued", "reservation.dequeued"]
    quota = runtime.store.repository.get(quota_uuid(pool, "acme"))
    assert isinstance(quota, QuotaUse) and quota.in_use == 4
    assert len(booked(runtime, nodes, queued["id"])) == 1


def test_a_request_no_node_can_hold_waits_for_a_node_that_can(runtime: Any) -> None:
    rs, _, pool, _ = setup(runtime, nodes=1)
    with pytest.raises(NoCapacity) as err:
        reserve(rs, pool, 12, start="earliest")
    assert "can ever hold 12 GPUs" in err.value.message and "--queue" in err.value.message
    queued = reserve(rs, pool, 12, queue=True)
    assert queued["state"] == "queued"
    dispatcher = QueueDispatcher(rs)
    assert dispatcher.run().placed == []
    [big] = add_nodes(runtime.service, pool, 1, gpus=16)
    assert dispatcher.run().placed == [queued["id"]]
    assert rs.get_doc(OP, queued["id"])["nodeId"] == big


def test_backfill_places_smaller_requests_only_when_the_head_is_not_delayed(
        runtime: Any) -> None:
    rs, clock, pool, _ = setup(runtime, nodes=2, quota=8)
    [small] = add_nodes(runtime.service, pool, 1, gpus=4)
    offer(runtime, pool, "beta", 16)
    acme_held = reserve(rs, pool, 8, who=ACME, duration="2h")    # one 8-GPU node until +2h
    other = reserve(rs, pool, 8, duration="3h")                  # the other until +3h
    assert other["nodeId"] != acme_held["nodeId"]
    reserve(rs, pool, 4, duration="1h")                          # the 4-GPU node until +1h
    head = reserve(rs, pool, 8, who=ACME, duration="2h", queue=True)
    assert head["state"] == "queued"  # over acme's quota until its reservation ends at +2h
    # Fits at +1h on the small node, far from the head's slot (acme's node at +2h): placed.
    backfill = reserve(rs, pool, 4, who=BETA, duration="1h", queue=True)
    assert backfill["state"] == "placed" and backfill["nodeId"] == small
    assert backfill["start"] == "2031-05-01T13:00:00Z"
    # Would take the head's node at +2h: it waits behind the head, and without --queue it
    # is refused with the reason.
    behind = reserve(rs, pool, 8, who=BETA, duration="1h", queue=True)
    assert behind["state"] == "queued" and behind["queue"]["position"] == 2
    with pytest.raises(NoCapacity) as err:
        reserve(rs, pool, 8, who=BETA, duration="1h", start="earliest")
    assert f"would delay its head {head['id']}" in err.value.message
    preview = rs.preview(BETA, tenant_id=None, pool_id=pool, gpus=8, duration="1h")
    assert preview["reason"] == "queue"
    dispatcher = QueueDispatcher(rs)
    report = dispatcher.run()
    assert report.placed == [] and report.pools[pool].head == head["id"]
    # acme releases early: the head is placed first (now, on its node), then the one behind.
    clock.advance(minutes=30)
    rs.release(ACME, acme_held["id"])
    report = dispatcher.run()
    assert report.placed == [head["id"], behind["id"]]
    placed_head = rs.get_doc(ACME, head["id"])
    assert placed_head["start"] == "2031-05-01T12:30:00Z"
    assert placed_head["nodeId"] == acme_held["nodeId"]
    assert rs.get_doc(BETA, behind["id"])["start"] == "2031-05-01T14:30:00Z"


def test_cancel_and_timeout_leave_nothing_booked_and_refund_nothing_twice(
        runtime: Any) -> None:
    rs, clock, pool, nodes = setup(runtime, nodes=1, quota=4)
    held = reserve(rs, pool, 4, who=ACME, duration="4h")
    cancelled = reserve(rs, pool, 2, who=ACME, queue=True)
    expiring = reserve(rs, pool, 2, who=ACME, queue=True, queue_timeout="30m")
    assert rs.get_doc(ACME, expiring["id"])["queue"]["position"] == 2
    assert rs.release(ACME, cancelled["id"], cancel=True)["state"] == "cancelled"
    assert rs.get_doc(ACME, expiring["id"])["queue"]["position"] == 1
    timers = ReservationTimers(rs)
    clock.advance(minutes=29)
    assert timers.tick().queue_expired == []
    clock.advance(minutes=1)
    assert timers.tick().queue_expired == [expiring["id"]]
    doc = rs.get_doc(ACME, expiring["id"])
    assert doc["state"] == "expired" and doc["endedAt"] == "2031-05-01T12:30:00Z"
    with pytest.raises(Conflict):
        rs.release(ACME, expiring["id"], cancel=True)  # it is over: nothing to withdraw
    rs.release(ACME, held["id"])
    assert QueueDispatcher(rs).run().placed == []  # neither comes back
    for rsv in (cancelled, expiring):
        assert booked(runtime, nodes, rsv["id"]) == []
        assert quota_events(runtime, pool, "acme", rsv["id"]) == []
    assert events(runtime, expiring["id"]) == ["reservation.queued", "reservation.expired"]
    # Placed from the queue, then cancelled before its start: refunded exactly once.
    blocker = reserve(rs, pool, 8, duration="1h")
    later = reserve(rs, pool, 4, who=ACME, queue=True)
    assert later["state"] == "placed" and later["start"] == blocker["end"]
    rs.release(ACME, later["id"], cancel=True)
    rs.release(ACME, later["id"], cancel=True)
    assert quota_events(runtime, pool, "acme", later["id"]) == ["quota.taken", "quota.refunded"]


def test_bad_queue_flags_are_refused_and_change_nothing(runtime: Any) -> None:
    rs, _, pool, _ = setup(runtime, nodes=1)
    cases: list[tuple[dict[str, Any], str]] = [
        ({"queue": True, "start": "+2h"}, "--queue starts as early as it can"),
        ({"queue_timeout": "1h"}, "--queue-timeout goes with --queue"),
        ({"queue": True, "queue_timeout": "8d"}, "out of range"),
        ({"queue": True, "queue_timeout": "soon"}, "not a duration"),
        ({"move_earlier": True}, "--move-earlier is for a reservation with a later --start"),
        ({"start": "earliest", "move_earlier": True}, "move earlier already"),
    ]
    for params, message in cases:
        with pytest.raises(InvalidInput) as err:
            reserve(rs, pool, 1, **params)
        assert message in err.value.message
    assert rs.list(OP, None, None, None) == []


def test_a_larger_quota_or_a_failed_binding_wakes_the_line(runtime: Any) -> None:
    rs, _, pool, _ = setup(runtime, nodes=1, quota=2)
    held = reserve(rs, pool, 2, who=ACME, duration="3h")
    queued = reserve(rs, pool, 2, who=ACME, duration="1h", queue=True)
    dispatcher = QueueDispatcher(rs)
    assert dispatcher.run().placed == []
    runtime.service.pools_offer(OP, pool, "acme", {"gpu": 4})  # the owner raises the quota
    assert dispatcher.run().placed == [queued["id"]]
    rs.release(ACME, held["id"])
    # A failed binding frees its GPUs: a reservation waiting for them moves forward.
    blocking = reserve(rs, pool, 6, duration="2h")
    early = reserve(rs, pool, 8, duration="1h", start="earliest")
    assert early["start"] == "2031-05-01T14:00:00Z"
    ReservationTimers(rs).tick()  # blocking (and acme's) start: binding
    journal(runtime, blocking["nodeId"], {
        "kind": "allocation.failed", "nodeId": blocking["nodeId"],
        "allocationId": blocking["allocationId"], "reason": "device-missing",
        "message": "GPU gone"})
    assert rs.get_doc(OP, blocking["id"])["state"] == "failed"  # no other node to go to
    assert dispatcher.run().rescheduled == [early["id"]]
    # Now only acme's reservation (2 GPUs until 13:00) stands in its way.
    assert rs.get_doc(OP, early["id"])["start"] == "2031-05-01T13:00:00Z"


def test_a_draining_node_takes_no_new_work() -> None:
    from tests.fleet import build_node

    node_ = build_node("pool_x")
    assert node_.schedulable
    node_.draining = True  # what nodes drain records (the day-2 issue): no new work
    assert not node_.schedulable


def test_a_store_outage_ends_the_dispatch_pass_without_a_traceback_per_pool(
        runtime: Any, monkeypatch: Any, caplog: Any) -> None:
    """The pass fails as a whole and its loop logs the outage once (api/supervise.py Retry);
    a traceback per pool and pass filled serve's log during an outage."""
    from better_compute.domain.errors import Unavailable

    rs, _, pool, _ = setup(runtime, nodes=1, quota=2)
    reserve(rs, pool, 2, who=ACME, duration="3h")
    reserve(rs, pool, 2, who=ACME, duration="1h", queue=True)  # a line to look at

    def away(*_: Any, **__: Any) -> Any:
        raise Unavailable("the event store is unavailable: PostgreSQL is unreachable")

    monkeypatch.setattr(rs, "dispatch", away)
    with pytest.raises(Unavailable):
        QueueDispatcher(rs).run()
    assert not [r for r in caplog.records if r.exc_info], "a traceback was logged"
