"""The queue's pure rules: the create's mode, and backfill that never delays the head."""

from __future__ import annotations

from datetime import timedelta

import pytest

from better_compute.domain.earliest import Booking, Slot, Timeline, earliest_start
from better_compute.domain.errors import InvalidInput
from better_compute.domain.placement import FreeGpu, Placement, PlacementRequest
from better_compute.domain.queue import Shadow, delays_head, start_mode

HOUR = 3600.0


def node(name: str, count: int = 8, bookings: tuple[Booking, ...] = ()) -> Timeline:
    gpus = tuple(FreeGpu(f"GPU-{name}-{i}", i, {"model": "H100"}) for i in range(count))
    return Timeline(name, gpus, count, 1, 1, bookings)


def all_gpus(name: str, count: int = 8) -> frozenset[str]:
    return frozenset(f"GPU-{name}-{i}" for i in range(count))


def head_shadow(tenant: str = "acme", limit: int | None = 8,
                held: tuple[tuple[int, float], ...] = ((8, 2 * HOUR),)) -> Shadow:
    """acme's 8-GPU head: over quota until its reservation ends at 2h, then node_a."""
    request = PlacementRequest(gpus=8)
    busy = Booking("alloc_held", all_gpus("node_a"), 0.0, 2 * HOUR, 8, 8)
    slot = earliest_start(request, 2 * HOUR, 2 * HOUR, [node("node_a", bookings=(busy,))])
    assert slot is not None and slot.start == 2 * HOUR
    return Shadow("rsv_head", tenant, request, slot, node("node_a", bookings=(busy,)), limit,
                  held, 0.0)


def test_no_head_means_nothing_can_be_delayed() -> None:
    assert not delays_head(None, "beta", "node_a", Booking("x", all_gpus("node_a"), 0, 1e9), 8)


def test_a_booking_elsewhere_or_before_the_head_starts_does_not_delay_it() -> None:
    shadow = head_shadow()
    other_node = Booking("x", all_gpus("node_b"), 2 * HOUR, 5 * HOUR)
    assert not delays_head(shadow, "beta", "node_b", other_node, 8)
    before = Booking("x", frozenset({"GPU-node_a-0"}), HOUR, 2 * HOUR)  # ends as the head starts
    assert not delays_head(shadow, "beta", "node_a", before, 1)


def test_a_booking_that_takes_the_heads_gpus_at_its_start_delays_it() -> None:
    shadow = head_shadow()
    overlapping = Booking("x", frozenset({"GPU-node_a-3"}), 2 * HOUR - 60, 2 * HOUR + 60)
    assert delays_head(shadow, "beta", "node_a", overlapping, 1)


def test_the_heads_own_tenant_may_not_push_its_quota_later() -> None:
    shadow = head_shadow(held=((4, HOUR), (4, 2 * HOUR)))
    # acme taking 2 more GPUs until 3h: the head's quota frees at 3h, after its shadow start.
    assert delays_head(shadow, "acme", "node_b", Booking("x", all_gpus("node_b", 2), 0, 3 * HOUR),
                       2)
    # The same booking by another tenant takes nothing from acme's quota.
    assert not delays_head(shadow, "beta", "node_b",
                           Booking("x", all_gpus("node_b", 2), 0, 3 * HOUR), 2)
    # A move (quota_gpus 0) keeps acme's quota as it is.
    assert not delays_head(shadow, "acme", "node_b",
                           Booking("x", all_gpus("node_b", 2), 0, 3 * HOUR), 0)


def test_backfill_counts_what_was_placed_before_it() -> None:
    """Two bookings that each leave room for the head cannot together take it."""
    request = PlacementRequest(gpus=4)
    slot = Slot(2 * HOUR, 4 * HOUR, Placement("node_a", tuple(sorted(all_gpus("node_a", 4))),
                                               4, 4))
    shadow = Shadow("rsv_head", "acme", request, slot, node("node_a", count=6), None, (), 0.0)
    first = Booking("x1", frozenset({"GPU-node_a-0"}), HOUR, 3 * HOUR)
    second = Booking("x2", frozenset({"GPU-node_a-1"}), HOUR, 3 * HOUR)
    assert not delays_head(shadow, "beta", "node_a", first, 1)
    after = shadow.after("beta", "node_a", first, 1)
    assert not delays_head(after, "beta", "node_a", second, 1)  # 6 - 2 = 4: still fits
    after = after.after("beta", "node_a", second, 1)
    third = Booking("x3", frozenset({"GPU-node_a-2"}), HOUR, 3 * HOUR)
    assert delays_head(after, "beta", "node_a", third, 1)
    assert not delays_head(shadow, "beta", "node_a", third, 1)  # alone it would have fitted


def test_a_move_gives_its_old_booking_back_to_the_head() -> None:
    request = PlacementRequest(gpus=8)
    old = Booking("alloc_old", all_gpus("node_a", 2), 2 * HOUR, 3 * HOUR)
    slot = Slot(2 * HOUR, 3 * HOUR, Placement("node_a", tuple(sorted(all_gpus("node_a"))), 8, 8))
    shadow = Shadow("rsv_head", "beta", request, slot, node("node_a", bookings=(old,)), None,
                    (), 0.0)
    moved_to = Booking("alloc_new", all_gpus("node_a", 2), HOUR, 2 * HOUR)
    assert not delays_head(shadow, "acme", "node_a", moved_to, 0, releases="alloc_old")


def test_the_create_mode_from_its_flags() -> None:
    assert start_mode(None, False, None, False).earliest is False
    earliest = start_mode("earliest", False, None, False)
    assert earliest.earliest and earliest.start is None and not earliest.queue
    assert earliest.request_fields() == {"start": "earliest", "moveEarlier": True}
    queued = start_mode(None, True, "30m", False)
    assert queued.earliest and queued.queue and queued.queue_timeout == timedelta(minutes=30)
    assert queued.fingerprint() == {"start": "earliest", "queue": True, "queueTimeout": 1800}
    later = start_mode("+2h", False, None, True)
    assert later.start == "+2h" and later.request_fields() == {"moveEarlier": True}
    # A plain create keeps the fingerprint it always had: old keys still retry.
    assert start_mode("+2h", False, None, False).fingerprint() == {}
    for flags, message in [(("+2h", True, None, False), "--queue starts as early"),
                           ((None, False, "1h", False), "goes with --queue"),
                           ((None, True, "0s", False), "out of range"),
                           ((None, True, "99999999999999d", False), "at most 9 digits"),
                           ((None, False, None, True), "--move-earlier is for")]:
        with pytest.raises(InvalidInput) as err:
            start_mode(*flags)
        assert message in err.value.message
