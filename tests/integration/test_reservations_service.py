"""Reservations through the service on SQLite and PostgreSQL: book, quota, release, extend, bind.

Time is injected (the service's clock), never slept.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

import better_compute.api.services.reservation_journal  # noqa: F401  (registers allocation.*)
from better_compute.api.controllers.reservations import ReservationTimers
from better_compute.api.gateway.journal import journal_handlers
from better_compute.api.services.reservations import ReservationService
from better_compute.api.store.actor import CONTROLLER_RESERVATIONS
from better_compute.api.store.eventlog import EventLog
from better_compute.domain.access import LOCAL_OPERATOR as OP
from better_compute.domain.access import Principal, Role
from better_compute.domain.bookings import NodeBookings, bookings_uuid
from better_compute.domain.errors import Conflict, NoCapacity, QuotaExceeded
from better_compute.domain.ids import parse_id
from better_compute.domain.node import Node
from better_compute.projections.framework import Sql
from tests.fleet import add_nodes, make_pool

ACME = Principal("acme", Role.MEMBER, "tok_acme")


class Clock:
    def __init__(self) -> None:
        self.now = datetime(2031, 5, 1, 12, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, **kw: float) -> None:
        self.now += timedelta(**kw)


def setup(runtime: Any, nodes: int = 2, quota: int | None = 6
          ) -> tuple[ReservationService, Clock, str, list[str]]:
    clock = Clock()
    runtime.service.clock = clock
    pool = make_pool(runtime.service)
    node_ids = add_nodes(runtime.service, pool, nodes)
    if quota is not None:
        runtime.service.tenants_create(OP, "acme", None)
        runtime.service.pools_offer(OP, pool, "acme", {"gpu": quota})
    return runtime.services.reservations, clock, pool, node_ids


def reserve(rs: ReservationService, pool: str, gpus: int, who: Principal = OP, **kw: Any
            ) -> dict[str, Any]:
    return rs.create(who, tenant_id=None, pool_id=pool, gpus=gpus, duration=kw.pop("duration", "2h"),
                     **kw)


def node(runtime: Any, node_id: str) -> Node:
    return runtime.store.repository.get(parse_id("node", node_id))  # type: ignore[no-any-return]


def bookings(runtime: Any, node_id: str) -> NodeBookings:
    return runtime.store.repository.get(bookings_uuid(node_id))  # type: ignore[no-any-return]


def bound_entry(doc: dict[str, Any]) -> dict[str, Any]:
    return {"kind": "allocation.bound", "nodeId": doc["nodeId"],
            "allocationId": doc["allocationId"], "gpus": doc["gpus"],
            "cdiDevices": [f"bcd.dev/gpu={g}" for g in doc["gpus"]],
            "envFile": f"/run/bcd/allocations/{doc['allocationId']}.env",
            "cgroupParent": f"bcd-alloc-{doc['allocationId']}.slice"}


def journal(runtime: Any, node_id: str, payload: dict[str, Any]) -> None:
    journal_handlers(runtime.services)[payload["kind"]](parse_id("node", node_id), 1, payload)


def test_reserve_packs_books_and_retries_with_the_same_key(runtime: Any) -> None:
    rs, _, pool, _ = setup(runtime)
    first = reserve(rs, pool, 4, key="k-1")
    assert first["state"] == "placed" and len(first["gpus"]) == 4
    assert first["hostResources"] == {"cpus": 104, "memoryGiB": 956}
    again = reserve(rs, pool, 4, key="k-1")
    assert again["id"] == first["id"] and again["allocationId"] == first["allocationId"]
    with pytest.raises(Conflict) as err:
        reserve(rs, pool, 3, key="k-1")
    assert "different parameters" in err.value.message
    second = reserve(rs, pool, 4)
    assert second["nodeId"] == first["nodeId"]  # packing: the half-full node first
    assert set(second["gpus"]).isdisjoint(first["gpus"])
    assert len(bookings(runtime, first["nodeId"]).bookings) == 2
    assert [r["id"] for r in rs.list(OP, None, None, None)] == [first["id"], second["id"]]
    assert rs.get_doc(OP, first["id"])["state"] == "binding"  # it started: bound in its save


def test_quota_and_capacity_errors_say_which_and_what_is_available(runtime: Any) -> None:
    rs, _, pool, _ = setup(runtime, nodes=1, quota=6)
    held = reserve(rs, pool, 4, who=ACME)
    with pytest.raises(QuotaExceeded) as err:
        reserve(rs, pool, 4, who=ACME)
    assert "holds 4 and asked for 4; 2 are available now" in err.value.message
    reserve(rs, pool, 4)  # the owner is not limited by acme's quota
    with pytest.raises(NoCapacity) as nocap:
        reserve(rs, pool, 1)
    assert "0 matching free GPUs" in nocap.value.message
    preview = rs.preview(ACME, tenant_id=None, pool_id=pool, gpus=2, duration="1h")
    assert preview["fits"] is False and preview["reason"] == "no_capacity"
    rs.release(ACME, held["id"])
    preview = rs.preview(ACME, tenant_id=None, pool_id=pool, gpus=4, duration="1h")
    assert preview["fits"] is True and preview["hostResources"] == {"cpus": 104, "memoryGiB": 956}
    assert preview["quota"] == {"gpu": 6, "inUse": 0}
    assert reserve(rs, pool, 4, who=ACME)["state"] == "placed"  # the refund made room


def test_other_tenants_never_see_a_reservation(runtime: Any) -> None:
    rs, _, pool, _ = setup(runtime)
    mine = reserve(rs, pool, 1)
    with pytest.raises(Exception) as err:
        rs.get_doc(ACME, mine["id"])
    assert "no reservation" in str(err.value)
    assert rs.list(ACME, None, None, None) == []


def test_release_ends_bookings_at_database_time_and_frees_the_gpus(runtime: Any) -> None:
    rs, clock, pool, _ = setup(runtime, nodes=1)
    a = reserve(rs, pool, 8)
    clock.advance(minutes=10)
    released = rs.release(OP, a["id"])
    assert released["state"] == "released" and released["endedAt"] == "2031-05-01T12:10:00Z"
    assert bookings(runtime, a["nodeId"]).bookings == {}
    assert reserve(rs, pool, 8)["nodeId"] == a["nodeId"]
    assert rs.release(OP, a["id"])["state"] == "released"  # again: nothing changes


def test_a_booking_never_starts_before_the_previous_booking_of_its_gpus_ended(
        runtime: Any) -> None:
    """A create's time is read before its save; a release saved in between ended the GPUs'
    last booking later than that time (each process reads the database's clock in its own
    transaction, seen here as the clock going back a second). The new booking starts where
    the old one ended, so recorded intervals of one GPU never overlap, and it still starts now
    (bound in its own save)."""
    rs, clock, pool, (node_id,) = setup(runtime, nodes=1)
    first = reserve(rs, pool, 8)
    clock.advance(minutes=10)
    ended = rs.release(OP, first["id"])["endedAt"]
    clock.advance(seconds=-1)  # read before the release was saved
    second = reserve(rs, pool, 8, duration="1h")
    assert second["start"] == ended == "2031-05-01T12:10:00Z"
    assert second["end"] == "2031-05-01T13:10:00Z"  # its length kept
    assert rs.get_doc(OP, second["id"])["state"] == "binding"
    (booked,) = bookings(runtime, node_id).bookings.values()
    assert booked["start"] == datetime(2031, 5, 1, 12, 10, tzinfo=UTC)


def test_cancel_before_start_and_refused_after(runtime: Any) -> None:
    rs, clock, pool, _ = setup(runtime)
    later = reserve(rs, pool, 2, start="+2h")
    with pytest.raises(Conflict) as not_started:
        rs.release(OP, later["id"])
    assert "--cancel" in not_started.value.message
    assert rs.release(OP, later["id"], cancel=True)["state"] == "cancelled"
    now = reserve(rs, pool, 2)
    clock.advance(seconds=1)
    with pytest.raises(Conflict) as started:
        rs.release(OP, now["id"], cancel=True)
    assert "only withdraws a reservation before its start" in started.value.message
    assert rs.get_doc(OP, now["id"])["state"] == "binding"  # as it was


def test_future_bookings_are_intervals(runtime: Any) -> None:
    rs, _, pool, _ = setup(runtime, nodes=1)
    later = reserve(rs, pool, 8, start="+4h", duration="2h")
    now = reserve(rs, pool, 8, duration="4h")  # [now, now+4h) touches [4h, 6h) only at the edge
    assert now["nodeId"] == later["nodeId"]
    with pytest.raises(NoCapacity):
        reserve(rs, pool, 1, start="+3h", duration="2h")


def test_extend_when_free_and_refused_into_another_booking(runtime: Any) -> None:
    rs, _, pool, _ = setup(runtime, nodes=1)
    a = reserve(rs, pool, 8, duration="2h")
    extended = rs.extend(OP, a["id"], "2h")
    assert extended["end"] == "2031-05-01T16:00:00Z"
    reserve(rs, pool, 8, start="+5h", duration="1h")
    with pytest.raises(Conflict) as err:
        rs.extend(OP, a["id"], "2h")
    assert "booked by another reservation" in err.value.message
    assert rs.get_doc(OP, a["id"])["end"] == "2031-05-01T16:00:00Z"


def test_reservations_end_on_their_own(runtime: Any) -> None:
    rs, clock, pool, _ = setup(runtime, nodes=1, quota=8)
    a = reserve(rs, pool, 8, who=ACME, duration="1h")
    journal(runtime, a["nodeId"], bound_entry(a))  # its node holds it: active
    timers = ReservationTimers(rs)
    clock.advance(minutes=59)
    assert timers.tick().expired == []
    clock.advance(minutes=1)
    assert timers.tick().expired == [a["id"]]
    doc = rs.get_doc(ACME, a["id"])
    assert doc["state"] == "released" and doc["endedAt"] == "2031-05-01T13:00:00Z"
    assert reserve(rs, pool, 8, who=ACME)["state"] == "placed"  # quota refunded, GPUs free


def test_a_reservation_that_starts_now_binds_in_its_create_s_one_save(runtime: Any,
                                                                   monkeypatch: Any) -> None:
    """No timers' pass has to load and save it again: placed, binding and the node's hold are
    one write; a later start stays placed until the timers reach its start."""
    rs, clock, pool, _ = setup(runtime)
    saves: list[list[str]] = []
    real = runtime.store.save

    def save(*aggs: Any, actor: str | None) -> Any:
        saves.append([type(a).__name__ for a in aggs])
        return real(*aggs, actor=actor)

    monkeypatch.setattr(runtime.store, "save", save)
    a = reserve(rs, pool, 4, who=ACME)
    assert a["state"] == "placed"  # the answer: what the placer did
    assert saves == [["Reservation", "NodeBookings", "QuotaUse", "Node"]]
    doc = rs.get_doc(ACME, a["id"])
    assert doc["state"] == "binding" and doc["nodeId"] == a["nodeId"]
    [hold] = node(runtime, a["nodeId"]).desired_sections()["devices"]["assignments"]
    assert hold["allocationId"] == a["allocationId"] and hold["gpus"] == a["gpus"]

    later = reserve(rs, pool, 2, who=ACME, start="+1h")
    assert len(saves) == 2 and "Node" not in saves[-1]
    assert rs.get_doc(ACME, later["id"])["state"] == "placed"
    timers = ReservationTimers(rs)
    assert not timers.tick().changed
    journal(runtime, a["nodeId"], bound_entry(a))  # the first one's node holds it
    clock.advance(hours=1)
    assert timers.tick().binding == [later["id"]]
    # Who recorded each binding (docs/events.md): the creator's hand, then the controller's.
    bindings = {e.subject: e.actor for e in EventLog(runtime.store).read(0, 10_000)
                if e.type == "reservation.binding"}
    assert bindings == {a["id"]: ACME.actor, later["id"]: CONTROLLER_RESERVATIONS}


def test_binding_makes_the_reservation_active_with_exactly_the_booked_gpus(runtime: Any) -> None:
    rs, clock, pool, _ = setup(runtime)
    a = reserve(rs, pool, 4)
    assert a["state"] == "placed"  # the answer: what the placer did
    # It starts now, so its create's own save began the binding and gave the node its hold:
    # nothing is left for the timers.
    assert rs.get_doc(OP, a["id"])["state"] == "binding"
    timers = ReservationTimers(rs)
    assert not timers.tick().changed
    n = node(runtime, a["nodeId"])
    [assignment] = n.desired_sections()["devices"]["assignments"]
    assert assignment == {"allocationId": a["allocationId"], "reservationId": a["id"],
                          "gpus": a["gpus"], "cpus": 104, "memoryGiB": 956}
    wrong = {**bound_entry(a), "cdiDevices": ["bcd.dev/gpu=GPU-someone-else"]}
    with pytest.raises(Conflict):
        journal(runtime, a["nodeId"], wrong)
    journal(runtime, a["nodeId"], bound_entry(a))
    doc = rs.get_doc(OP, a["id"])
    assert doc["state"] == "active"
    assert doc["binding"] == {
        "nodeId": a["nodeId"], "cdiDevices": [f"bcd.dev/gpu={g}" for g in a["gpus"]],
        "envFile": f"/run/bcd/allocations/{a['allocationId']}.env",
        "cgroupParent": f"bcd-alloc-{a['allocationId']}.slice",
    }
    generation = node(runtime, a["nodeId"]).generation
    rs.release(OP, a["id"])  # the agent may be away: the desired state changes anyway
    after = node(runtime, a["nodeId"])
    assert after.desired_sections()["devices"]["assignments"] == []
    assert after.generation == generation + 1
    journal(runtime, a["nodeId"], {"kind": "allocation.released", "nodeId": a["nodeId"],
                                   "allocationId": a["allocationId"]})
    clock.advance(minutes=10)
    assert not timers.tick().changed


def test_a_failed_hold_is_placed_again_at_most_twice_then_failed(runtime: Any) -> None:
    rs, _, pool, _ = setup(runtime, nodes=4, quota=8)
    a = reserve(rs, pool, 8, who=ACME)
    timers = ReservationTimers(rs)
    seen_nodes = []
    for _ in range(2):
        timers.tick()
        doc = rs.get_doc(ACME, a["id"])
        assert doc["state"] == "binding"
        seen_nodes.append(doc["nodeId"])
        journal(runtime, doc["nodeId"], {"kind": "allocation.failed", "nodeId": doc["nodeId"],
                                         "allocationId": doc["allocationId"],
                                         "reason": "device-missing", "message": "GPU gone"})
        doc = rs.get_doc(ACME, a["id"])
        assert doc["state"] == "placed" and doc["nodeId"] not in seen_nodes
        assert bookings(runtime, seen_nodes[-1]).bookings == {}
    timers.tick()
    doc = rs.get_doc(ACME, a["id"])
    assert doc["attempt"] == 3
    journal(runtime, doc["nodeId"], {"kind": "allocation.failed", "nodeId": doc["nodeId"],
                                     "allocationId": doc["allocationId"], "reason": "overlap",
                                     "message": "held elsewhere"})
    failed = rs.get_doc(ACME, a["id"])
    assert failed["state"] == "failed" and failed["failure"]["reason"] == "overlap"
    assert [p["reason"] for p in failed["previousPlacements"]] == ["device-missing"] * 2
    assert all(bookings(runtime, n).bookings == {} for n in [*seen_nodes, doc["nodeId"]])
    assert node(runtime, doc["nodeId"]).desired_sections()["devices"]["assignments"] == []
    assert reserve(rs, pool, 8, who=ACME)["state"] == "placed"  # quota refunded


def test_a_node_that_never_reports_times_out(runtime: Any) -> None:
    rs, clock, pool, _ = setup(runtime, nodes=2)
    a = reserve(rs, pool, 8)
    timers = ReservationTimers(rs)
    timers.tick()
    clock.advance(minutes=4, seconds=59)
    assert timers.tick().timed_out == []
    clock.advance(seconds=1)
    report = timers.tick()
    assert report.timed_out == [a["id"]]
    doc = rs.get_doc(OP, a["id"])
    assert doc["attempt"] == 2 and doc["nodeId"] != a["nodeId"] and doc["state"] == "binding"
    assert doc["previousPlacements"][0]["reason"] == "timeout"
    clock.advance(minutes=5)
    timers.tick()  # no third node: the next timeout fails it
    doc = rs.get_doc(OP, a["id"])
    assert doc["state"] == "failed" and doc["failure"]["reason"] == "timeout"


@pytest.mark.parametrize("trouble,cause", [
    ("cordoned", "in maintenance"), ("unhealthy", "unhealthy"), ("unreachable", "unreachable"),
])
def test_no_capacity_names_the_true_cause(runtime: Any, trouble: str, cause: str) -> None:
    """A pool whose only node is out of reach (cordoned, unhealthy, unreachable) is refused
    naming that cause, not "Ask for fewer GPUs"."""
    rs, clock, pool, (node_id,) = setup(runtime, nodes=1, quota=None)
    subject = node(runtime, node_id)
    if trouble == "cordoned":
        runtime.services.nodes.cordon(OP, node_id, "replace PSU 2")
    elif trouble == "unhealthy":
        for gpu in list(subject.gpus):
            subject.set_gpu_health(gpu["uuid"], False, ["xid 79"], at=clock.now)
        runtime.store.save(subject, actor="local")
    else:
        subject.connect(clock.now, "0.1.0")
        subject.mark_unreachable(at=clock.now, last_seen=clock.now)
        runtime.store.save(subject, actor="local")
    with pytest.raises(NoCapacity) as refused:
        reserve(rs, pool, 4)
    message = refused.value.message
    assert f"8 GPUs {cause}" in message, message
    assert "Ask for fewer GPUs" not in message


def test_a_booking_takes_the_node_s_host_share_from_the_placer_s_candidate(
        runtime: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The free-GPU index's row of the chosen node gave the placer its CPUs and memory per
    GPU and its GPU count: the booking checks the node's whole share with them, without
    reading the row again."""
    import better_compute.api.services.reservation_base as base
    from better_compute.projections import free_gpus

    rs, _, pool, _ = setup(runtime)
    reads: list[str] = []
    real_share = free_gpus.node_host_share  # the function reservation_base imported

    def node_host_share(sql: Sql, node_id: str) -> tuple[int, int, int] | None:
        reads.append(node_id)
        return real_share(sql, node_id)

    monkeypatch.setattr(base, "node_host_share", node_host_share)
    caps: list[tuple[Any, Any]] = []
    real_book = NodeBookings.book

    def book(self: NodeBookings, **kwargs: Any) -> tuple[datetime, datetime]:
        caps.append((kwargs["cpu_capacity"], kwargs["memory_capacity_gib"]))
        return real_book(self, **kwargs)

    monkeypatch.setattr(NodeBookings, "book", book)
    first = reserve(rs, pool, 4)
    assert first["hostResources"] == {"cpus": 104, "memoryGiB": 956}
    assert reads == [] and caps == [(208, 1912)]  # 8 GPUs x 26 CPUs, 8 x 239 GiB
