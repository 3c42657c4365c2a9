"""Property: any sequence of node and booking events leaves the rollup equal to a recomputation.

Random operations on a few nodes of a fresh pool go through the Node and
NodeBookings aggregates and the store, as the services save them (a hold is
booked first and assigned in the same save; a release ends both; future
bookings wait in one of three later slots); the capacity projection then
catches up. Its per-pool sums must equal what ``node_contribution`` gives for
each node as the store rebuilds it, field by field, for every resource. And
the rollup's ``available`` GPUs must be exactly what the placer's index
(``free_gpus``) counts free now on schedulable nodes: one definition for both.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from eventsourcing.application import AggregateNotFoundError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from better_compute.domain.bookings import NodeBookings, bookings_uuid
from better_compute.domain.errors import Conflict
from better_compute.domain.ids import new_uuid, public_id
from better_compute.domain.node import NODE_ROLE, Node
from better_compute.domain.node_rules import RESOURCES
from better_compute.projections.capacity import node_contribution, read_capacity

OPS = ("connect", "disconnect", "unreachable", "start", "pass", "fail", "sick", "well",
       "cordon", "uncordon", "assign", "unassign", "book", "cancel")

operation = st.tuples(st.integers(0, 2), st.sampled_from(OPS), st.integers(0, 7))


def _node(pool_id: str, gpus: int, at: datetime) -> Node:
    return Node(
        id=new_uuid(), tenant_id="root", pool_id=pool_id, site_id="site_x", join_token_id="jt_x",
        role=NODE_ROLE, hardware_key=f"serial:{new_uuid().hex}",
        hardware={"cpus": 64, "memoryGib": 512.0},
        gpus=[{"uuid": f"GPU-{i}", "name": "NVIDIA H100 80GB HBM3", "healthy": True}
              for i in range(gpus)],
        key_pin="sha256/x", certificate_serial="1", certificate_not_after=at + timedelta(days=7),
        bcd_version="0.1.0",
    )


BOOKING_OPS = ("assign", "unassign", "book", "cancel")


def _get(store: Any, uuid: Any) -> Any:
    try:
        return store.repository.get(uuid)
    except AggregateNotFoundError:
        return None


def _book(bookings: NodeBookings, alloc: str, gpu: str, start: datetime, hours: int) -> bool:
    try:
        bookings.book(allocation_id=alloc, reservation_id=f"rsv_{alloc}", holder="root",
                      gpus=[gpu], cpus=8, memory_gib=64, start=start,
                      end=start + timedelta(hours=hours))
    except Conflict:
        return False
    return True


def _apply_booking(node: Node, bookings: NodeBookings, op: str, arg: int, at: datetime,
                   base: datetime) -> None:
    """What the reservation services do to a node and its bookings (docs/reservations.md)."""
    gpu = f"GPU-{arg % max(1, len(node.gpus))}"
    alloc = f"alloc_{node.public_id[-12:]}{arg}"  # globally unique: the index keys on it
    held = {a["allocationId"] for a in node.device_assignments()}
    if op == "book":  # placed with a later start: one of three future slots
        _book(bookings, alloc, gpu, base + timedelta(hours=2 + 2 * (arg % 3)), 1)
    elif op == "cancel" and alloc not in held:  # withdrawn before its start
        bookings.end(alloc, at)
    elif op == "assign" and alloc not in held:  # booked now and bound, in one save
        booking = bookings.booking(alloc)
        if booking is None and not _book(bookings, alloc, gpu, base - timedelta(hours=1), 2):
            return
        booking = bookings.booking(alloc) or {}
        node.assign_devices({"allocationId": alloc, "gpus": list(booking["gpus"]),
                             "cpus": booking["cpus"], "memoryGiB": booking["memoryGiB"]}, at)
    elif op == "unassign" and alloc in held:  # released: the hold and its booking end
        bookings.end(alloc, at)
        node.unassign_devices(alloc, at)


def _apply(node: Node, op: str, arg: int, at: datetime) -> None:
    gpu = f"GPU-{arg % max(1, len(node.gpus))}"
    try:
        if op == "connect":
            node.connect(at, "0.1.0")
        elif op == "disconnect":
            node.disconnect(node.session_epoch, at, "test")
        elif op == "unreachable":
            node.mark_unreachable(at, None)
        elif op == "start":
            node.start_acceptance(at, [{"kind": "diag.nvml"}], "test", None)
        elif op in ("pass", "fail"):
            node.finish_acceptance(node.acceptance_attempt, op == "pass", op, [], None, at)
        elif op in ("sick", "well"):
            node.set_gpu_health(gpu, op == "well", [] if op == "well" else ["xid-79"], at)
        elif op == "cordon":
            node.cordon("maintenance", at, None)
        elif op == "uncordon":
            node.uncordon(at, None)
    except Conflict:
        pass  # a rule refused it: nothing recorded, as in the service


def _booking_docs(bookings: NodeBookings | None) -> list[dict[str, Any]]:
    if bookings is None:
        return []
    return [{"allocationId": alloc, "gpus": list(b["gpus"]), "cpus": b["cpus"],
             "memoryGiB": b["memoryGiB"]} for alloc, b in bookings.bookings.items()]


def _expected(nodes: list[Node], bookings: list[NodeBookings | None]
              ) -> dict[str, dict[str, float]]:
    total: dict[str, dict[str, float]] = {}
    for node, booked in zip(nodes, bookings, strict=True):
        part = node_contribution(node.provision_state, node.session, node.cordoned, node.gpus,
                                 node.hardware["cpus"], node.hardware["memoryGib"],
                                 node.device_assignments(), _booking_docs(booked))
        for resource, fields in part.items():
            into = total.setdefault(resource, {})
            for k, v in fields.items():
                into[k] = into.get(k, 0.0) + v
    return total


def _free_now(sql: Any, pool_id: str) -> int:
    """What the placer's index counts free now, over the pool's schedulable nodes."""
    with sql.transaction(commit=False) as cursor:
        sql.execute(cursor, "SELECT COALESCE(SUM(free_now), 0) AS n FROM bc_fg_node "
                    "WHERE pool_id = ? AND schedulable = 1", (pool_id,))
        return int(cursor.fetchone()["n"])


def test_rollup_equals_recomputation_from_aggregates(runtime: Any) -> None:
    store = runtime.store
    at = datetime(2030, 1, 1, tzinfo=UTC)

    @settings(max_examples=25, deadline=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture,
                                     HealthCheck.too_slow])
    @given(sizes=st.lists(st.integers(1, 8), min_size=1, max_size=3),
           ops=st.lists(operation, max_size=30))
    def check(sizes: list[int], ops: list[tuple[int, str, int]]) -> None:
        pool_id = public_id("pool", new_uuid())
        nodes = [_node(pool_id, n, at) for n in sizes]
        store.save(*nodes, actor="local")
        for i, (which, op, arg) in enumerate(ops):
            node = store.repository.get(nodes[which % len(nodes)].id)
            when = at + timedelta(seconds=i)
            if op in BOOKING_OPS:
                uuid = bookings_uuid(node.public_id)
                bookings = _get(store, uuid) or NodeBookings(
                    tenant_id="root", node_id=node.public_id, pool_id=pool_id)
                _apply_booking(node, bookings, op, arg, when, at)
                changed = [a for a in (bookings, node) if a.pending_events]
                if changed:
                    store.save(*changed, actor="local")
                continue
            _apply(node, op, arg, when)
            if node.pending_events:
                store.save(node, actor="local")
        runtime.projections.catch_up("capacity")
        runtime.projections.catch_up("free_gpus")
        rebuilt = [store.repository.get(n.id) for n in nodes]
        booked = [_get(store, bookings_uuid(n.public_id)) for n in nodes]
        got = read_capacity(runtime.projections.sql, pool_id)
        want = _expected(rebuilt, booked)
        for resource in RESOURCES:
            for field, value in want[resource].items():
                assert got[resource][field] == value, (resource, field, ops)
        assert got["gpu"]["available"] == _free_now(runtime.projections.sql, pool_id), ops

    check()
