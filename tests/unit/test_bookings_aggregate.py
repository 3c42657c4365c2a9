"""NodeBookings: half-open intervals, overlap refused, extend and end."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from better_compute.domain.bookings import NodeBookings, bookings_uuid, overlaps
from better_compute.domain.errors import Conflict

T0 = datetime(2030, 1, 1, tzinfo=UTC)


def h(n: float) -> datetime:
    return T0 + timedelta(hours=n)


def fresh() -> NodeBookings:
    return NodeBookings(tenant_id="root", node_id="node_a", pool_id="pool_a")


def book(b: NodeBookings, alloc: str, gpus: list[str], start: float, end: float) -> None:
    b.book(allocation_id=alloc, reservation_id="rsv_" + alloc, holder="root", gpus=gpus,
           cpus=len(gpus), memory_gib=len(gpus), start=h(start), end=h(end))


def test_id_derives_from_the_node() -> None:
    assert fresh().id == bookings_uuid("node_a")


def test_back_to_back_bookings_do_not_overlap_but_overlapping_ones_are_refused() -> None:
    b = fresh()
    book(b, "alloc_1", ["g0", "g1"], 0, 2)
    book(b, "alloc_2", ["g0"], 2, 4)  # [0,2) and [2,4) share no instant
    book(b, "alloc_3", ["g2"], 1, 3)
    with pytest.raises(Conflict) as err:
        book(b, "alloc_4", ["g1", "g3"], 1.5, 5)
    assert "g1" in err.value.message and "g3" not in err.value.message
    assert set(b.bookings) == {"alloc_1", "alloc_2", "alloc_3"}


def test_extend_checks_the_extra_time_only() -> None:
    b = fresh()
    book(b, "alloc_1", ["g0"], 0, 2)
    book(b, "alloc_2", ["g0"], 3, 4)
    b.extend("alloc_1", h(3))
    assert b.bookings["alloc_1"]["end"] == h(3)
    with pytest.raises(Conflict) as err:
        b.extend("alloc_1", h(3.5))
    assert "booked by another reservation" in err.value.message
    assert b.bookings["alloc_1"]["end"] == h(3)


def test_end_frees_the_gpus_and_is_idempotent() -> None:
    b = fresh()
    book(b, "alloc_1", ["g0"], 0, 2)
    assert b.end("alloc_1", h(1))
    assert not b.end("alloc_1", h(1))
    book(b, "alloc_2", ["g0"], 1, 2)


def test_an_extension_never_covers_a_later_booking_that_already_ran() -> None:
    """alloc_1 ran on g0 after alloc_0's end and has ended: extending alloc_0 over that time
    would record g0 in two bookings at once (found by the property test below)."""
    b = fresh()
    book(b, "alloc_0", ["g0"], 0, 1)
    book(b, "alloc_1", ["g0"], 1, 2)
    assert b.end("alloc_1", h(2))
    with pytest.raises(Conflict, match="g0"):
        b.extend("alloc_0", h(2))


def test_host_capacity_is_checked() -> None:
    b = fresh()
    b.book(allocation_id="alloc_1", reservation_id="r", holder="root", gpus=["g0"], cpus=10,
           memory_gib=10, start=h(0), end=h(1), cpu_capacity=16, memory_capacity_gib=100)
    with pytest.raises(Conflict):
        b.book(allocation_id="alloc_2", reservation_id="r", holder="root", gpus=["g1"], cpus=10,
               memory_gib=10, start=h(0), end=h(1), cpu_capacity=16, memory_capacity_gib=100)


ops = st.lists(
    st.tuples(st.sampled_from(["book", "end", "extend"]), st.sets(st.integers(0, 3), min_size=1),
              st.integers(0, 10), st.integers(1, 5), st.integers(0, 30)),
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(ops)
def test_no_gpu_is_ever_double_booked(steps: list[tuple[str, set[int], int, int, int]]) -> None:
    """Neither among the bookings held nor among the intervals recorded: a booking that ended
    held its GPUs from its start to when it ended (or its end), and a later booking of them
    never starts inside that, whatever time it asked for."""
    b = fresh()
    recorded: list[tuple[set[str], datetime, datetime]] = []
    for n, (op, gpu_set, start, length, pick) in enumerate(steps):
        allocs = sorted(b.bookings)
        try:
            if op == "book":
                book(b, f"alloc_{n}", [f"g{i}" for i in sorted(gpu_set)], start, start + length)
            elif op == "end" and allocs:
                ending = b.bookings[allocs[pick % len(allocs)]]
                b.end(allocs[pick % len(allocs)], h(start))
                if h(start) > ending["start"]:
                    recorded.append((set(ending["gpus"]), ending["start"],
                                     min(h(start), ending["end"])))
            elif op == "extend" and allocs:
                alloc = allocs[pick % len(allocs)]
                b.extend(alloc, b.bookings[alloc]["end"] + timedelta(hours=length))
        except Conflict:
            pass
        items = [(set(x["gpus"]), x["start"], x["end"]) for x in b.bookings.values()]
        items += recorded
        for i, (gpus, start_at, end_at) in enumerate(items):
            for other, other_start, other_end in items[i + 1:]:
                if overlaps(start_at, end_at, other_start, other_end):
                    assert not gpus & other
