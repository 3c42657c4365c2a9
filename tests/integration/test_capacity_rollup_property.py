"""Property: any sequence of node events leaves the rollup equal to a recomputation.

Random operations on a few nodes of a fresh pool go through the Node
aggregate and the store, as the service saves them; the capacity projection
then catches up. Its per-pool sums must equal what ``node_capacity`` gives
for each node as the store rebuilds it, field by field, for every resource.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from better_compute.domain.errors import Conflict
from better_compute.domain.ids import new_uuid, public_id
from better_compute.domain.node import NODE_ROLE, Node
from better_compute.domain.node_rules import RESOURCES, node_capacity
from better_compute.projections.capacity import read_capacity

OPS = ("connect", "disconnect", "unreachable", "start", "pass", "fail", "sick", "well",
       "cordon", "uncordon", "assign", "unassign")

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
        elif op == "assign":
            node.assign_devices({"allocationId": f"alloc_{arg}", "gpus": [gpu], "cpus": 8,
                                 "memoryGiB": 64.0}, at)
        elif op == "unassign":
            node.unassign_devices(f"alloc_{arg}", at)
    except Conflict:
        pass  # a rule refused it: nothing recorded, as in the service


def _expected(nodes: list[Node]) -> dict[str, dict[str, float]]:
    total: dict[str, dict[str, float]] = {}
    for node in nodes:
        part = node_capacity(node.provision_state, node.session, node.cordoned, node.gpus,
                             node.hardware["cpus"], node.hardware["memoryGib"],
                             node.device_assignments())
        for resource, fields in part.items():
            into = total.setdefault(resource, {})
            for k, v in fields.items():
                into[k] = into.get(k, 0.0) + v
    return total


def test_rollup_equals_recomputation_from_aggregates(runtime: Any) -> None:
    store = runtime.store
    at = datetime(2030, 1, 1, tzinfo=UTC)

    @settings(max_examples=20, deadline=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture,
                                     HealthCheck.too_slow])
    @given(sizes=st.lists(st.integers(1, 8), min_size=1, max_size=3),
           ops=st.lists(operation, max_size=25))
    def check(sizes: list[int], ops: list[tuple[int, str, int]]) -> None:
        pool_id = public_id("pool", new_uuid())
        nodes = [_node(pool_id, n, at) for n in sizes]
        store.save(*nodes)
        for i, (which, op, arg) in enumerate(ops):
            node = store.repository.get(nodes[which % len(nodes)].id)
            _apply(node, op, arg, at + timedelta(seconds=i))
            if node.pending_events:
                store.save(node)
        runtime.projections.catch_up("capacity")
        rebuilt = [store.repository.get(n.id) for n in nodes]
        got = read_capacity(runtime.projections.sql, pool_id)
        want = _expected(rebuilt)
        for resource in RESOURCES:
            for field, value in want[resource].items():
                assert got[resource][field] == value, (resource, field, ops)

    check()
