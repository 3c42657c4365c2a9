"""ONE GPU health rule: capacity, Node.schedulable, the free-GPU index and the placer agree.

A GPU is healthy when it is not reported unhealthy AND carries no
``healthReasons``: a placer or ``Node.schedulable`` that ignored the reasons
would book a GPU that capacity counts as unhealthy.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from better_compute.domain.errors import NoCapacity
from better_compute.domain.ids import new_uuid
from better_compute.domain.node import NODE_ROLE, Node
from better_compute.domain.node_rules import node_capacity
from better_compute.domain.placement import (
    Candidate,
    FreeGpu,
    PlacementRequest,
    gpu_attributes,
    place,
)
from better_compute.projections.free_gpus import node_gpus

_HEALTH = st.fixed_dictionaries({}, optional={
    "healthy": st.booleans(),
    "healthReasons": st.sampled_from([[], ["xid 79"], ["ecc", "thermal"]]),
})


def _gpu(index: int, health: dict[str, Any]) -> dict[str, Any]:
    return {"index": index, "uuid": f"GPU-{index}", "name": "NVIDIA H100 80GB HBM3",
            "memoryMiB": 81559, "family": "H100", "nvlinkDomain": "sw", **health}


def _adopted_node(gpus: list[dict[str, Any]]) -> Node:
    at = datetime(2026, 1, 1, tzinfo=UTC)
    node = Node(id=new_uuid(), tenant_id="root", pool_id="pool_x", site_id="site_x",
                join_token_id="jt_x", role=NODE_ROLE, hardware_key="serial:x",
                hardware={"cpus": 64, "memoryGiB": 512}, gpus=gpus, key_pin="sha256/x",
                certificate_serial="1", certificate_not_after=at + timedelta(days=7),
                bcd_version="test")
    attempt = node.start_acceptance(at, [], "test", None)
    node.finish_acceptance(attempt, True, "ok", [], gpus, at)
    return node


def _bookable(gpus: list[dict[str, Any]], *, via_index: bool) -> set[str]:
    """The GPUs the placer books when asked for every one of them, one at a time."""
    if via_index:
        free = tuple(FreeGpu(g["uuid"], g["index"], g["attributes"]) for g in node_gpus(gpus))
    else:
        free = tuple(FreeGpu(g["uuid"], g["index"], gpu_attributes(g)) for g in gpus)
    booked: set[str] = set()
    for _ in gpus:
        candidate = Candidate("node_a", tuple(g for g in free if g.uuid not in booked),
                              free_cpus=64, free_memory_gib=512)
        try:
            booked.update(place(PlacementRequest(gpus=1), [candidate]).gpus)
        except NoCapacity:
            break
    return booked


@settings(max_examples=200, deadline=None)
@given(st.lists(_HEALTH, min_size=1, max_size=6))
def test_the_placer_never_books_a_gpu_capacity_counts_as_unhealthy(
        health: list[dict[str, Any]]) -> None:
    gpus = [_gpu(i, h) for i, h in enumerate(health)]
    part = node_capacity("adopted", "connected", False, gpus, 64, 512)["gpu"]
    for via_index in (True, False):
        booked = _bookable(gpus, via_index=via_index)
        assert len(booked) == part["allocatable"], (gpus, booked, part)
    assert part["unhealthy"] == len(gpus) - part["allocatable"]
    node = _adopted_node(gpus)
    assert node.schedulable == (part["allocatable"] > 0)
    assert node.healthy == (part["unhealthy"] == 0)


def test_a_gpu_reported_healthy_with_reasons_is_unhealthy_everywhere() -> None:
    gpus = [_gpu(0, {"healthy": True, "healthReasons": ["xid 79"]})]
    assert node_capacity("adopted", "connected", False, gpus, 64, 512)["gpu"]["unhealthy"] == 1
    assert gpu_attributes(gpus[0])["healthy"] is False
    node = _adopted_node(gpus)
    assert not node.schedulable
    schedulable = next(c for c in node.conditions() if c["type"] == "Schedulable")
    assert schedulable["reason"] == "NoHealthyGpus"
    with pytest.raises(NoCapacity):
        place(PlacementRequest(gpus=1), [Candidate(
            "node_a", (FreeGpu("GPU-0", 0, gpu_attributes(gpus[0])),), free_cpus=64,
            free_memory_gib=512)])
