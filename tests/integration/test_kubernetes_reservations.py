"""`reserve --kubernetes` on the control plane, on SQLite and PostgreSQL.

A pool's policy.kubernetes is what lets a reservation ask for the kubelet: the flag is
refused on any other pool (a stable code, nothing booked), and on a kubernetes pool it
rides along everywhere the hold goes: the reservation.placed event, the node's device
assignment, the desired-state sections of the pool's nodes, and the binding, which names
the resource and the device ids the kubelet sees.
"""

from __future__ import annotations

from typing import Any

import pytest

from better_compute.api.controllers.reservations import ReservationTimers
from better_compute.api.store.eventlog import EventLog, decode_lines, filter_for
from better_compute.domain.access import LOCAL_OPERATOR as OP
from better_compute.domain.errors import Conflict, KubernetesNotEnabled
from better_compute.domain.policy import DEFAULT_RESOURCE
from tests.fleet import add_nodes, make_pool
from tests.integration.test_reservations_service import (
    bound_entry,
    journal,
    node,
    reserve,
)

KUBERNETES_POLICY = {"acceptance": [{"kind": "diag.nvml"}], "expect": {"gpuCount": 8},
                     "kubernetes": {}, "nodeProfile": {"units": ["container-toolkit"]}}


def kubernetes_pool(service: Any, resource: str | None = None) -> str:
    policy = dict(KUBERNETES_POLICY)
    if resource:
        policy["kubernetes"] = {"resourceName": resource}
    site = service.sites_create(OP, "shared", "eu-1", None, "site-k8s")
    return str(service.pools_create(OP, site["id"], "metal-host", "H100", policy, None,
                                    "pool-k8s")["id"])


def placed_events(runtime: Any) -> list[dict[str, Any]]:
    page = EventLog(runtime.store).page(filter_for(OP, "reservation.placed"), 0, 100)
    return decode_lines(page.entries)


def test_kubernetes_is_refused_on_a_pool_without_policy_kubernetes(runtime: Any) -> None:
    service = runtime.service
    pool = make_pool(service)
    add_nodes(service, pool, 1)
    rs = runtime.services.reservations
    head = EventLog(runtime.store).page(filter_for(OP, None), 0, 1000).head
    with pytest.raises(KubernetesNotEnabled) as err:
        reserve(rs, pool, 4, kubernetes=True, key="k8s-1")
    assert err.value.code == "kubernetes_not_enabled"
    assert f"pool {pool} has no kubernetes in its policy" in err.value.message
    assert "reserve without --kubernetes" in err.value.message
    assert rs.list(OP, None, None, None) == []  # nothing booked, nothing recorded
    assert EventLog(runtime.store).page(filter_for(OP, None), 0, 1000).head == head
    # The same key without the flag books as usual.
    assert reserve(rs, pool, 4, key="k8s-1")["kubernetes"] is False


def test_a_kubernetes_hold_carries_the_flag_to_the_node_and_the_binding(runtime: Any) -> None:
    service = runtime.service
    pool = kubernetes_pool(service)
    assert service.pools_get(OP, pool)["policy"]["kubernetes"] == {"resourceName": DEFAULT_RESOURCE}
    [node_id] = add_nodes(service, pool, 1)
    rs = runtime.services.reservations
    k8s = reserve(rs, pool, 4, kubernetes=True, key="k8s-2")
    plain = reserve(rs, pool, 2)
    assert (k8s["kubernetes"], plain["kubernetes"]) == (True, False)
    assert k8s["request"]["kubernetes"] is True and "kubernetes" not in plain["request"]
    with pytest.raises(Conflict):  # the flag is part of what the key stands for
        reserve(rs, pool, 4, key="k8s-2")
    assert reserve(rs, pool, 4, kubernetes=True, key="k8s-2")["id"] == k8s["id"]
    placed = {e["subject"]: e["data"] for e in placed_events(runtime)}
    assert placed[k8s["id"]]["request"]["kubernetes"] is True
    assert "kubernetes" not in placed[plain["id"]]["request"]

    ReservationTimers(rs).tick()
    sections = node(runtime, node_id).desired_sections(runtime.services.nodes.pool_sections(
        node(runtime, node_id)))
    assert list(sections) == ["kubernetes", "profile", "devices"]  # units before devices
    assert sections["kubernetes"] == {"resourceName": "bcd.dev/gpu"}
    assert sections["profile"] == {"units": ["container-toolkit"]}
    by_alloc = {a["allocationId"]: a for a in sections["devices"]["assignments"]}
    assert by_alloc[k8s["allocationId"]]["kubernetes"] is True
    assert "kubernetes" not in by_alloc[plain["allocationId"]]

    for doc in (k8s, plain):
        journal(runtime, node_id, bound_entry(doc))
    bound = rs.get_doc(OP, k8s["id"])
    assert bound["state"] == "active"
    assert bound["binding"]["kubernetes"] == {"resourceName": "bcd.dev/gpu",
                                              "deviceIds": k8s["gpus"]}
    assert "kubernetes" not in rs.get_doc(OP, plain["id"])["binding"]


def test_the_binding_names_the_pools_own_resource(runtime: Any) -> None:
    service = runtime.service
    pool = kubernetes_pool(service, resource="example.com/h100")
    [node_id] = add_nodes(service, pool, 1)
    rs = runtime.services.reservations
    doc = reserve(rs, pool, 1, kubernetes=True)
    ReservationTimers(rs).tick()
    journal(runtime, node_id, bound_entry(doc))
    assert rs.get_doc(OP, doc["id"])["binding"]["kubernetes"]["resourceName"] == "example.com/h100"


def test_an_unadopted_node_gets_no_pool_sections(runtime: Any) -> None:
    service = runtime.service
    pool = kubernetes_pool(service)
    [node_id] = add_nodes(service, pool, 1, adopted=False)
    n = node(runtime, node_id)
    assert "kubernetes" not in n.desired_sections(runtime.services.nodes.pool_sections(n))
