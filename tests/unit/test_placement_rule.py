"""The default placer: packing, NVLink domains, host resources, filters, and NoCapacity."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from better_compute.domain.errors import NoCapacity
from better_compute.domain.host_share import host_share
from better_compute.domain.placement import (
    Candidate,
    FreeGpu,
    NodePartition,
    PlacementRequest,
    gpu_attributes,
    place,
)
from better_compute.domain.selectors import parse_selector


def gpus(node: str, indexes: list[int], domain: str | None = "sw", vram: int = 80,
         healthy: bool = True) -> tuple[FreeGpu, ...]:
    return tuple(
        FreeGpu(f"GPU-{node}-{i}", i, {"vramGiB": vram, "model": "H100", "product": "SXM",
                                       "nvlinkDomain": f"{node}/{domain}" if domain else None,
                                       "healthy": healthy})
        for i in indexes
    )


def node(name: str, indexes: list[int], **kw: object) -> Candidate:
    return Candidate(name, gpus(name, indexes), cpus_per_gpu=10, memory_gib_per_gpu=100,
                     free_cpus=80, free_memory_gib=800, **kw)  # type: ignore[arg-type]


def test_packing_prefers_the_node_with_the_fewest_free_gpus_that_fits() -> None:
    candidates = [node("node_a", list(range(8))), node("node_b", [4, 5, 6, 7]),
                  node("node_c", [7])]
    placement = place(PlacementRequest(gpus=2), candidates)
    assert placement.node_id == "node_b"
    assert placement.gpus == ("GPU-node_b-4", "GPU-node_b-5")
    assert (placement.cpus, placement.memory_gib) == (20, 200)


def test_ties_go_to_the_smallest_node_id_whatever_the_order() -> None:
    a, b = node("node_b", [0, 1, 2]), node("node_a", [3, 4, 5])
    assert place(PlacementRequest(gpus=3), [a, b]).node_id == "node_a"
    assert place(PlacementRequest(gpus=3), [b, a]).node_id == "node_a"


def test_a_partition_packs_its_own_nodes_first_then_the_others() -> None:
    """Workers of one server each pack their own share of the nodes (a stable hash of the
    id), so two of them placing at once do not both choose the fullest node of the pool."""
    names = [f"node_{i:02d}" for i in range(40)]
    partitions = [NodePartition(0, 2), NodePartition(1, 2)]
    mine = {partition: [n for n in names if partition.holds(n)] for partition in partitions}
    assert set(mine[partitions[0]]).isdisjoint(mine[partitions[1]])
    assert sorted(mine[partitions[0]] + mine[partitions[1]]) == names
    assert all(len(each) >= 10 for each in mine.values())  # a share each, not all on one
    assert NodePartition(1, 2).holds("node_07") == NodePartition(1, 2).holds("node_07")  # stable
    fullest, emptier = mine[partitions[0]][0], mine[partitions[1]][0]
    candidates = [node(fullest, [7]), node(emptier, list(range(8)))]
    assert place(PlacementRequest(gpus=1), candidates).node_id == fullest  # no partition: packing
    assert place(PlacementRequest(gpus=1), candidates, partition=partitions[0]).node_id == fullest
    assert place(PlacementRequest(gpus=1), candidates, partition=partitions[1]).node_id == emptier
    # Nothing of its own fits: the others, packed as ever.
    assert place(PlacementRequest(gpus=2), candidates, partition=partitions[0]).node_id == emptier
    other = mine[partitions[1]][1]
    packed = [node(emptier, list(range(8))), node(other, [6, 7]), node(fullest, [7])]
    assert place(PlacementRequest(gpus=2), packed, partition=partitions[0]).node_id == other
    with pytest.raises(ValueError):
        NodePartition(2, 2)


def test_nvlink_keeps_every_gpu_in_one_domain_and_packs_domains() -> None:
    split = Candidate("node_a", gpus("node_a", [0, 1], "d0") + gpus("node_a", [2, 3, 4], "d1")
                      + gpus("node_a", [5, 6, 7], "d2"), free_cpus=0, free_memory_gib=0)
    placement = place(PlacementRequest(gpus=3, nvlink=True), [split])
    assert placement.gpus == ("GPU-node_a-2", "GPU-node_a-3", "GPU-node_a-4")
    with pytest.raises(NoCapacity) as err:
        place(PlacementRequest(gpus=4, nvlink=True), [split])
    assert "at most 3 in one NVLink domain" in err.value.message
    assert place(PlacementRequest(gpus=4), [split]).gpus[:2] == ("GPU-node_a-0", "GPU-node_a-1")


def test_host_resources_must_fit_too() -> None:
    short = Candidate("node_a", gpus("node_a", [0, 1, 2, 3]), cpus_per_gpu=10,
                      memory_gib_per_gpu=100, free_cpus=30, free_memory_gib=800)
    with pytest.raises(NoCapacity) as err:
        place(PlacementRequest(gpus=4), [short])
    assert "not the host CPUs or memory" in err.value.message
    assert place(PlacementRequest(gpus=3), [short]).cpus == 30


def test_filters_model_product_selector_and_health() -> None:
    mixed = Candidate("node_a", gpus("node_a", [0, 1], vram=40) + gpus("node_a", [2, 3])
                      + gpus("node_a", [4], healthy=False))
    request = PlacementRequest(gpus=2, model="h100", product="SXM",
                               selector=parse_selector("vramGiB >= 80"))
    assert place(request, [mixed]).gpus == ("GPU-node_a-2", "GPU-node_a-3")
    with pytest.raises(NoCapacity) as err:
        place(PlacementRequest(gpus=3, selector=parse_selector("vramGiB >= 80")), [mixed])
    assert "selector 'vramGiB >= 80'" in err.value.message
    assert err.value.data["freeGpus"] == 2
    with pytest.raises(NoCapacity):
        place(PlacementRequest(gpus=1, model="A100"), [mixed])


def test_excluded_nodes_and_an_empty_pool() -> None:
    with pytest.raises(NoCapacity) as err:
        place(PlacementRequest(gpus=1, exclude_nodes=frozenset({"node_a"})),
              [node("node_a", [0])])
    assert "no node of the pool is adopted and schedulable now" in err.value.message


def test_gpu_attributes_round_vram_like_the_card_is_sold() -> None:
    attrs = gpu_attributes({"name": "NVIDIA H100 80GB HBM3", "memoryMiB": 81559, "index": 2})
    assert attrs["vramGiB"] == 80 and attrs["model"] == "H100" and attrs["healthy"] is True


def test_host_share_keeps_a_reserve_for_the_host() -> None:
    share = host_share(224, 2015.56, 8)
    assert (share.reserved_cpus, share.reserved_memory_gib) == (12, 101)
    assert (share.cpus_per_gpu, share.memory_gib_per_gpu) == (26, 239)
    assert host_share(None, None, 8).cpus_per_gpu == 0
    assert host_share(16, 64, 0).cpus_per_gpu == 0


@settings(max_examples=200, deadline=None)
@given(
    frees=st.lists(st.sets(st.integers(0, 7), max_size=8), min_size=1, max_size=6),
    want=st.integers(1, 8),
)
def test_a_placement_is_free_distinct_and_packed(frees: list[set[int]], want: int) -> None:
    candidates = [node(f"node_{i}", sorted(f)) for i, f in enumerate(frees)]
    fitting = [c for c in candidates if len(c.free_gpus) >= want]
    try:
        placement = place(PlacementRequest(gpus=want), candidates)
    except NoCapacity:
        assert not fitting
        return
    chosen = next(c for c in candidates if c.node_id == placement.node_id)
    assert len(set(placement.gpus)) == want
    assert set(placement.gpus) <= {g.uuid for g in chosen.free_gpus}
    assert len(chosen.free_gpus) == min(len(c.free_gpus) for c in fitting)
