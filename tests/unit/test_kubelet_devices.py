"""The device plugin's decisions, without sockets: which GPUs, their health, Allocate, preference.

The kubelet sees exactly the GPUs held here for kubernetes reservations: never a plain
reservation's, never a free GPU, never a hold whose release is under way.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from better_compute.agent.gpu.model import Gpu, HostFacts, Inventory
from better_compute.agent.kubelet.devices import (
    KubeletDevice,
    NotHeld,
    advertised,
    allocate,
    preferred,
    resource_name,
)

UUIDS = [f"GPU-{n:08d}-0000-0000-0000-000000000000" for n in range(8)]


def inventory(unhealthy: dict[int, list[str]] | None = None, numa: bool = True) -> Inventory:
    sick = unhealthy or {}
    gpus = [Gpu(index=n, uuid=UUIDS[n], name="NVIDIA H100 80GB HBM3",
                nvlink_domain=f"dom-{n // 4}", numa_node=(n // 4) if numa else None,
                healthy=n not in sick, health_reasons=sick.get(n, []))
            for n in range(8)]
    return Inventory(host=HostFacts(), gpus=gpus, source="fake")


def assignment(alloc: str, gpus: list[int], kubernetes: bool = True) -> dict[str, Any]:
    doc = {"allocationId": alloc, "reservationId": "rsv_" + alloc[6:],
           "gpus": [UUIDS[n] for n in gpus], "cpus": 8, "memoryGiB": 64}
    return doc | ({"kubernetes": True} if kubernetes else {})


def sections(*assignments: dict[str, Any]) -> dict[str, Any]:
    return {"kubernetes": {"resourceName": "bcd.dev/gpu"},
            "devices": {"assignments": list(assignments)}}


def holds(*assignments: dict[str, Any]) -> dict[str, str]:
    return {uuid: a["allocationId"] for a in assignments for uuid in a["gpus"]}


K8S = assignment("alloc_k1", [4, 5, 6, 7])
PLAIN = assignment("alloc_p1", [0, 1], kubernetes=False)


def test_exactly_the_gpus_of_kubernetes_holds_in_index_order() -> None:
    listed = advertised(sections(PLAIN, K8S), holds(PLAIN, K8S), inventory())
    assert [d.id for d in listed] == UUIDS[4:8]
    assert {d.health for d in listed} == {"Healthy"}
    assert {(d.allocation_id, d.reservation_id) for d in listed} == {("alloc_k1", "rsv_k1")}
    assert [d.numa_node for d in listed] == [1, 1, 1, 1]


def test_an_assignment_not_yet_held_is_not_listed() -> None:
    # Bound only once bcd holds it: the CDI spec the kubelet's runtime needs exists first.
    assert advertised(sections(K8S), {}, inventory()) == []


def test_a_release_withdraws_the_gpus_before_the_hold_goes() -> None:
    # The new desired state no longer has the assignment; the hold is still on disk.
    assert advertised(sections(), holds(K8S), inventory()) == []


def test_without_the_flag_or_with_a_stale_hold_nothing_is_listed() -> None:
    other = {UUIDS[4]: "alloc_k2"}  # held by an allocation the assignment does not name
    assert advertised(sections(K8S), other, inventory()) == []
    assert advertised(sections(PLAIN), holds(PLAIN), inventory()) == []


def test_health_follows_the_gpu_source() -> None:
    listed = advertised(sections(K8S), holds(K8S), inventory({5: ["xid-79"]}))
    assert [d.health for d in listed] == ["Healthy", "Unhealthy", "Healthy", "Healthy"]
    assert listed[1].reasons == ("xid-79",)


def test_a_held_gpu_the_source_lost_or_cannot_read_is_unhealthy_but_still_listed() -> None:
    lost = inventory()
    lost.gpus = [g for g in lost.gpus if g.index != 6]
    listed = advertised(sections(K8S), holds(K8S), lost)
    assert [(d.id, d.health) for d in listed][-1] == (UUIDS[6], "Unhealthy")
    assert listed[-1].reasons == ("missing from the GPU source",)
    broken = advertised(sections(K8S), holds(K8S), None, "NVML: driver not loaded")
    assert len(broken) == 4 and {d.health for d in broken} == {"Unhealthy"}
    assert broken[0].reasons == ("GPU source error: NVML: driver not loaded",)


def test_resource_name_from_the_section() -> None:
    assert resource_name(sections()) == "bcd.dev/gpu"
    assert resource_name({"devices": {}}) is None
    assert resource_name({"kubernetes": {"resourceName": ""}}) is None


def test_allocate_answers_cdi_names_and_envs_naming_the_allocation() -> None:
    listed = advertised(sections(K8S), holds(K8S), inventory())
    grant = allocate([UUIDS[5], UUIDS[4]], listed, "bcd.dev/gpu")
    assert grant.cdi_devices == [f"bcd.dev/gpu={UUIDS[5]}", f"bcd.dev/gpu={UUIDS[4]}"]
    assert grant.envs == {
        "NVIDIA_VISIBLE_DEVICES": f"{UUIDS[5]},{UUIDS[4]}",
        "BCD_ALLOCATION_ID": "alloc_k1", "BCD_RESERVATION_ID": "rsv_k1",
        "BCD_CDI_DEVICES": f"bcd.dev/gpu={UUIDS[5]},bcd.dev/gpu={UUIDS[4]}",
    }


def test_allocate_refuses_what_is_not_held_and_names_it() -> None:
    listed = advertised(sections(PLAIN, K8S), holds(PLAIN, K8S), inventory())
    with pytest.raises(NotHeld) as err:
        allocate([UUIDS[4], UUIDS[0], "GPU-nope"], listed, "bcd.dev/gpu")
    assert err.value.ids == [UUIDS[0], "GPU-nope"]
    assert f"{UUIDS[0]}, GPU-nope are not held for a kubernetes reservation" in str(err.value)
    assert "bcd.dev/gpu" in str(err.value)


def _devices(layout: list[tuple[str, str]]) -> list[KubeletDevice]:
    return [KubeletDevice(UUIDS[n], True, alloc, "rsv_" + alloc[6:], index=n,
                          nvlink_domain=domain) for n, (alloc, domain) in enumerate(layout)]


# Two reservations: a (GPUs 0-4; 0-1 in domain x, 2-4 in y) and b (5-7, domain y).
LAYOUT = [("alloc_a", "x"), ("alloc_a", "x"), ("alloc_a", "y"), ("alloc_a", "y"),
          ("alloc_a", "y"), ("alloc_b", "y"), ("alloc_b", "y"), ("alloc_b", "y")]


@pytest.mark.parametrize("size,expected", [
    (2, [0, 1]),        # the smallest group of one reservation and one domain that fits
    (3, [2, 3, 4]),     # a's y group fits exactly (b's too, but a comes first)
    (4, [0, 1, 2, 3]),  # no single group: one reservation, a
    (6, [2, 3, 4, 5, 6, 7]),  # no reservation holds 6: one NVLink domain, y
    (7, [2, 3, 4, 0, 1, 5, 6]),  # nothing single fits: the biggest groups first
])
def test_preferred_keeps_one_reservation_and_one_domain(size: int, expected: list[int]) -> None:
    devices = _devices(LAYOUT)
    assert preferred(UUIDS, [], size, devices) == [UUIDS[n] for n in expected]


def test_preferred_continues_from_what_must_be_included() -> None:
    devices = _devices(LAYOUT)
    # Starting from b's GPU 6: b's other GPUs first, not a's.
    assert preferred(UUIDS, [UUIDS[6]], 3, devices) == [UUIDS[6], UUIDS[5], UUIDS[7]]
    # Starting from a's GPU 2 (domain y): a's y GPUs before a's x GPUs, before b's.
    assert preferred(UUIDS, [UUIDS[2]], 4, devices) == [UUIDS[2], UUIDS[3], UUIDS[4], UUIDS[0]]
    # Only from what is available; must_include alone when it is already enough.
    assert preferred(UUIDS[5:], [], 2, devices) == [UUIDS[5], UUIDS[6]]
    assert preferred(UUIDS, [UUIDS[1], UUIDS[7]], 2, devices) == [UUIDS[1], UUIDS[7]]


def test_the_numa_node_comes_from_sysfs(tmp_path: Path) -> None:
    from better_compute.agent.gpu.pci import numa_node

    device = tmp_path / "sys/bus/pci/devices/0000:18:00.0"
    device.mkdir(parents=True)
    (device / "numa_node").write_text("1\n")
    assert numa_node(tmp_path, "0000:18:00.0") == 1
    (device / "numa_node").write_text("-1\n")  # a machine without NUMA
    assert numa_node(tmp_path, "0000:18:00.0") is None
    assert numa_node(tmp_path, "0000:2a:00.0") is None and numa_node(tmp_path, None) is None


def test_a_malformed_assignment_hands_nothing_and_spoils_no_other() -> None:
    broken = {"allocationId": 5, "gpus": "GPU-0", "kubernetes": True}
    listed = advertised({"devices": {"assignments": [broken, K8S]}}, holds(K8S), inventory())
    assert [d.id for d in listed] == UUIDS[4:8]
    assert advertised({"devices": {"assignments": "all"}}, holds(K8S), inventory()) == []
    assert resource_name({"kubernetes": {"resourceName": 7}}) is None
