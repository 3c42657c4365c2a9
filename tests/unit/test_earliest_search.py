"""The earliest-start search against a brute-force reference, over random fleets and bookings.

The reference knows nothing of the search: it tries every whole minute from ``not_before`` to
the last booking's end (every start the search can answer is such an instant, since the data's
times are whole minutes) and decides "fits" by counting free, qualifying GPUs and host
resources itself. The search must answer the same instant, a slot that overlaps no booking and
that the request qualifies for, the same node however the nodes are ordered, and the bounds
the index keeps must never be later than a node's true earliest start.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from better_compute.domain.earliest import (
    NEVER,
    Booking,
    Timeline,
    earliest_start,
    instant,
    lower_bound,
    moment,
    node_earliest,
    node_index,
    quota_free_at,
)
from better_compute.domain.placement import FreeGpu, PlacementRequest
from better_compute.domain.selectors import parse_selector

MINUTE = 60.0  # the data's unit: every time is a whole number of minutes


@dataclass(frozen=True)
class Fleet:
    nodes: list[Timeline]
    request: PlacementRequest
    length: float
    not_before: float


@st.composite
def fleets(draw: st.DrawFn) -> Fleet:
    nodes = []
    for n in range(draw(st.integers(1, 4))):
        count = draw(st.integers(1, 4))
        gpus = []
        for i in range(count):
            gpus.append(FreeGpu(f"GPU-{n}-{i}", i, {
                "model": "H100", "product": "SXM", "healthy": draw(st.booleans()) or i == 0,
                "vramGiB": draw(st.sampled_from([40, 80])),
                "nvlinkDomain": f"n{n}/d{draw(st.integers(0, 1))}",
            }))
        share = draw(st.integers(0, 3))
        bookings: list[Booking] = []
        for b in range(draw(st.integers(0, 6))):
            held = draw(st.sets(st.sampled_from([g.uuid for g in gpus]), min_size=1))
            start = MINUTE * draw(st.integers(0, 40))
            end = start + MINUTE * draw(st.integers(1, 15))
            if any(o.overlaps(start, end) and o.gpus & held for o in bookings):
                continue  # the bookings aggregate never lets one GPU be booked twice
            bookings.append(Booking(f"alloc_{n}_{b}", frozenset(held), start, end,
                                    cpus=draw(st.integers(0, share * len(held) + 1)),
                                    memory_gib=draw(st.integers(0, 2))))
        usable = tuple(g for g in gpus if g.healthy)
        nodes.append(Timeline(f"node_{n}", usable, count, cpus_per_gpu=share,
                              memory_gib_per_gpu=draw(st.integers(0, 1)),
                              bookings=tuple(bookings)))
    selector = draw(st.sampled_from([None, "vramGiB >= 80"]))
    request = PlacementRequest(gpus=draw(st.integers(1, 4)), nvlink=draw(st.booleans()),
                               selector=parse_selector(selector) if selector else None)
    return Fleet(nodes, request, MINUTE * draw(st.integers(1, 20)),
                 MINUTE * draw(st.integers(0, 30)))


def reference_fits(fleet: Fleet, node: Timeline, t: float) -> bool:
    end = t + fleet.length
    busy = [b for b in node.bookings if b.start < end and t < b.end]
    taken = {u for b in busy for u in b.gpus}
    free = [g for g in node.gpus if g.uuid not in taken and fleet.request.qualifies(g)]
    need = fleet.request.gpus
    if fleet.request.nvlink and need > 1:
        domains = [g.nvlink_domain for g in free]
        enough = any(domains.count(d) >= need for d in set(domains) if d)
    else:
        enough = len(free) >= need
    cpus = node.cpus_per_gpu * node.gpu_count - sum(b.cpus for b in busy)
    memory = node.memory_gib_per_gpu * node.gpu_count - sum(b.memory_gib for b in busy)
    return (enough and node.cpus_per_gpu * need <= cpus
            and node.memory_gib_per_gpu * need <= memory)


def reference_earliest(fleet: Fleet, node: Timeline | None = None) -> float | None:
    nodes = [node] if node else fleet.nodes
    horizon = max([fleet.not_before, *(b.end for n in nodes for b in n.bookings)])
    t = fleet.not_before
    while t <= horizon:
        if any(reference_fits(fleet, n, t) for n in nodes):
            return t
        t += MINUTE
    return None


def bounded(fleet: Fleet, shuffle: random.Random | None = None) -> list[Timeline]:
    """The nodes with the bounds the index keeps, in the order the index reads them."""
    out = []
    k = fleet.request.gpus
    for node in fleet.nodes:
        blocks, ends = node_index([g.uuid for g in node.gpus], node.gpu_count, node.bookings,
                                  True, node.cpus_per_gpu, node.memory_gib_per_gpu)
        block = next(((a, b) for n, a, b in blocks if n == k), (-NEVER, NEVER))
        bound = lower_bound(block, [(a, f) for n, a, f in ends if n == k], fleet.length,
                            fleet.not_before)
        out.append(Timeline(node.node_id, node.gpus, node.gpu_count, node.cpus_per_gpu,
                            node.memory_gib_per_gpu, node.bookings, bound))
    if shuffle is not None:
        shuffle.shuffle(out)
    return sorted(out, key=lambda t: t.lower_bound)


@settings(max_examples=300, deadline=None)
@given(fleets(), st.randoms(use_true_random=False))
def test_the_search_answers_the_true_earliest_start_and_a_free_slot(
        fleet: Fleet, rnd: random.Random) -> None:
    truth = reference_earliest(fleet)
    slot = earliest_start(fleet.request, fleet.length, fleet.not_before, bounded(fleet))
    if truth is None:
        assert slot is None
        return
    assert slot is not None and slot.start == truth  # never later, never earlier
    node = next(n for n in fleet.nodes if n.node_id == slot.placement.node_id)
    chosen = set(slot.placement.gpus)
    assert len(chosen) == fleet.request.gpus
    assert not any(b.overlaps(slot.start, slot.end) and b.gpus & chosen for b in node.bookings)
    assert all(fleet.request.qualifies(g) for g in node.gpus if g.uuid in chosen)
    assert reference_fits(fleet, node, slot.start)
    # The same answer every time: another order of the same bounds, or no bounds at all.
    again = earliest_start(fleet.request, fleet.length, fleet.not_before, bounded(fleet, rnd))
    unbounded = earliest_start(fleet.request, fleet.length, fleet.not_before, fleet.nodes)
    assert again == slot == unbounded


@settings(max_examples=300, deadline=None)
@given(fleets())
def test_the_index_bounds_are_never_later_than_a_nodes_earliest_start(fleet: Fleet) -> None:
    plain = fleet.request.selector is None and not fleet.request.nvlink
    for node in bounded(fleet):
        truth = reference_earliest(fleet, node)
        mine = node_earliest(fleet.request, fleet.length, fleet.not_before, node)
        assert (mine.start if mine else None) == truth
        if truth is not None:
            assert node.lower_bound <= truth
        if plain and node.lower_bound > fleet.not_before:
            # Blocked at not_before, no selector, no NVLink: the bound is exact (GPUs and host).
            assert node.lower_bound == (NEVER if truth is None else truth)


def test_a_full_pool_answers_the_end_of_the_blocking_booking_exactly() -> None:
    gpus = tuple(FreeGpu(f"GPU-a-{i}", i, {"model": "H100"}) for i in range(8))
    full = Booking("alloc_x", frozenset(g.uuid for g in gpus), 100.0, 7300.0, 80, 800)
    node = Timeline("node_a", gpus, 8, 10, 100, (full,))
    slot = earliest_start(PlacementRequest(gpus=8), 7200.0, 100.0, [node])
    assert slot is not None and (slot.start, slot.end) == (7300.0, 14500.0)
    assert slot.placement.gpus == tuple(g.uuid for g in gpus)
    assert (slot.placement.cpus, slot.placement.memory_gib) == (80, 800)


def test_ties_pack_like_the_placer_unless_the_reservations_own_node_fits() -> None:
    def node(name: str, free: int) -> Timeline:
        gpus = tuple(FreeGpu(f"GPU-{name}-{i}", i, {}) for i in range(4))
        busy = frozenset(g.uuid for g in gpus[free:])
        return Timeline(name, gpus, 4, bookings=(Booking("a", busy, 0.0, 50.0),) if busy else ())
    nodes = [node("node_a", 4), node("node_b", 2)]
    packed = earliest_start(PlacementRequest(gpus=2), 10.0, 0.0, nodes)
    assert packed is not None and packed.placement.node_id == "node_b"
    preferred = earliest_start(PlacementRequest(gpus=2), 10.0, 0.0, nodes, prefer="node_a")
    assert preferred is not None and preferred.placement.node_id == "node_a"


def test_instants_round_trip_to_the_microsecond() -> None:
    rnd = random.Random(7)
    for _ in range(2000):
        value = moment(rnd.uniform(1.7e9, 2.6e9))
        value = value.replace(microsecond=rnd.randrange(1_000_000))
        assert moment(instant(value)) == value


def test_quota_frees_when_enough_held_reservations_end() -> None:
    held = [(4, 50.0), (2, 20.0), (2, 80.0)]
    assert quota_free_at(8, held, 0, 10.0) == 10.0
    assert quota_free_at(8, held, 2, 10.0) == 20.0   # 8 held: the 2 ending at 20 make room
    assert quota_free_at(8, held, 4, 10.0) == 50.0
    assert quota_free_at(8, held, 8, 10.0) == 80.0
    assert quota_free_at(8, held, 9, 10.0) is None  # more than the quota: never
    assert quota_free_at(None, held, 9, 10.0) == 10.0  # the pool's owner: unlimited
