"""The index walk answers exactly what a search over every node of the pool answers.

On SQLite and PostgreSQL: random bookings (groups of GPUs, back to back, with gaps, some
only in the future), a cordoned node and an unhealthy GPU; for many requests the service's
``earliest_slot`` (fast path, then the walk over the index in ascending bound, stopping
early) must give the same slot as the pure search over every schedulable node with no
bounds at all. The index rows are kept by the free-GPU projection from the events alone.
"""

from __future__ import annotations

import random
from datetime import timedelta
from typing import Any

import pytest
from eventsourcing.application import AggregateNotFoundError

from better_compute.domain.access import LOCAL_OPERATOR as OP
from better_compute.domain.bookings import NodeBookings, bookings_uuid
from better_compute.domain.earliest import earliest_start, fits_at, instant
from better_compute.domain.errors import Conflict
from better_compute.domain.placement import PlacementRequest
from better_compute.domain.reservation import new_allocation_id
from better_compute.domain.selectors import parse_selector
from better_compute.projections.earliest_index import timeline_of
from better_compute.projections.framework import Sql
from tests.integration.test_reservations_service import node, setup


def book_randomly(runtime: Any, pool: str, node_id: str, from_: Any, rnd: random.Random) -> None:
    """Every GPU busy from ``from_`` on (groups of 1 to 8), then more bookings, some gaps."""
    bookings = NodeBookings(tenant_id="root", node_id=node_id, pool_id=pool)
    gpus = [g["uuid"] for g in node(runtime, node_id).gpus]
    free_at = dict.fromkeys(gpus, from_)
    count = dict.fromkeys(gpus, 0)
    while min(count.values()) < rnd.randint(1, 4):
        group = sorted(gpus, key=lambda g: (free_at[g], g))[:rnd.choice([1, 2, 4, 8])]
        if count[group[0]] == 0:
            group = [g for g in group if count[g] == 0]
        start = max(free_at[g] for g in group) + timedelta(minutes=rnd.choice([0, 0, 20, 90]))
        end = start + timedelta(minutes=rnd.randint(10, 200))
        bookings.book(allocation_id=new_allocation_id(), reservation_id="rsv_x", holder="root",
                      gpus=group, cpus=26 * len(group), memory_gib=239 * len(group),
                      start=start, end=end)
        for g in group:
            free_at[g], count[g] = end, count[g] + 1
    runtime.store.save(bookings, actor="local")


@pytest.mark.parametrize(("seed", "settled"), [(1, True), (2, True), (3, True), (1, False),
                                               (2, False)])
def test_the_walk_answers_what_every_node_answers(runtime: Any, seed: int, settled: bool,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """``settled=False``: the index is never settled, so every node's blocks are stale (as a
    batch committed between a search's settling and its walk leaves a few): the walk reads
    the stale nodes first, at the lowest bound, and still answers exactly."""
    rs, clock, pool, nodes = setup(runtime, nodes=6, quota=None)
    if not settled:
        monkeypatch.setattr(runtime.projections, "settle", lambda name: 0)
    rnd = random.Random(seed)
    for node_id in nodes[:-1]:
        book_randomly(runtime, pool, node_id, clock.now, rnd)
    book_randomly(runtime, pool, nodes[-1], clock.now + timedelta(minutes=45), rnd)
    service = runtime.services.nodes
    service.cordon(OP, nodes[0], "maintenance")
    sick = node(runtime, nodes[1])
    sick.set_gpu_health(sick.gpus[0]["uuid"], False, ["xid-79"], clock.now)
    runtime.store.save(sick, actor="local")
    runtime.projections.catch_up("free_gpus")
    everyone = [t for t in (timeline_of(runtime.service.sql, n) for n in nodes) if t]
    assert nodes[0] not in {t.node_id for t in everyone}  # cordoned: never a candidate
    later = 0
    for gpus in (1, 2, 3, 5, 8):
        for minutes in (15, 60, 150, 400):
            for nvlink, selector in ((False, None), (True, None), (False, "index >= 4")):
                request = PlacementRequest(gpus=gpus, nvlink=nvlink,
                                           selector=parse_selector(selector) if selector else None)
                length = timedelta(minutes=minutes)
                walked = rs.earliest.earliest_slot(pool, request, length, clock.now)
                whole = earliest_start(request, length.total_seconds(), instant(clock.now),
                                       everyone)
                case = (gpus, minutes, nvlink, selector)
                if whole is not None and whole.start == instant(clock.now):
                    # Fits at once: the placer's own answer (its fast path packs among the
                    # fullest nodes with GPUs free of any booking, docs/reservations.md).
                    assert walked is not None and walked.start == whole.start, case
                    chosen = next(t for t in everyone if t.node_id == walked.placement.node_id)
                    assert fits_at(request, chosen, walked.start, walked.end) == \
                        walked.placement, case
                else:
                    assert walked == whole, case
                    later += whole is not None
    assert later >= 10  # most requests had to look past now: the walk was exercised


@pytest.mark.parametrize("seed", [4, 5])
def test_the_index_written_row_by_row_is_the_index_rebuilt(runtime: Any, seed: int) -> None:
    """Each batch writes only the rows of a node's blocks and ends that changed: after many
    batches of single bookings, ends and extensions on the same nodes, the rows are exactly
    what applying the whole log again gives."""
    _, clock, pool, nodes = setup(runtime, nodes=3, quota=None)
    rnd = random.Random(seed)
    store, runner = runtime.store, runtime.projections

    def bookings_of(node_id: str) -> NodeBookings:
        try:
            found: NodeBookings = store.repository.get(bookings_uuid(node_id))
        except AggregateNotFoundError:
            return NodeBookings(tenant_id="root", node_id=node_id, pool_id=pool)
        return found

    live: list[tuple[str, str]] = []  # (node, allocation) of the bookings not ended
    for step in range(40):
        node_id = rnd.choice(nodes)
        bookings = bookings_of(node_id)
        action = rnd.random()
        if live and action < 0.25:
            node_id, allocation = live.pop(rnd.randrange(len(live)))
            bookings = bookings_of(node_id)
            bookings.end(allocation, clock.now)
        elif live and action < 0.4:
            node_id, allocation = rnd.choice(live)
            bookings = bookings_of(node_id)
            booked = bookings.booking(allocation)
            assert booked is not None
            try:
                bookings.extend(allocation, booked["end"] + timedelta(minutes=rnd.randint(1, 90)))
            except Conflict:
                continue  # taken meanwhile: nothing saved
        else:
            gpus = [g["uuid"] for g in node(runtime, node_id).gpus]
            start = clock.now + timedelta(minutes=rnd.choice([0, 0, 30, 240]) + step)
            end = start + timedelta(minutes=rnd.randint(10, 300))
            free = [g for g in gpus if not bookings.conflicts([g], start, end)]
            if not free:
                continue
            group = rnd.sample(free, rnd.randint(1, min(4, len(free))))
            allocation = new_allocation_id()
            bookings.book(allocation_id=allocation, reservation_id="rsv_x", holder="root",
                          gpus=group, cpus=26 * len(group), memory_gib=239 * len(group),
                          start=start, end=end)
            live.append((node_id, allocation))
        store.save(bookings, actor="local")
        runner.catch_up("free_gpus")  # one batch per change, settled: rows updated in place
        runner.settle("free_gpus")
    _, written = runner.rows_at_position("free_gpus")
    runner.rebuild("free_gpus")
    _, rebuilt = runner.rows_at_position("free_gpus")

    def rows(tables: dict[str, list[dict[str, Any]]], name: str) -> list[tuple[Any, ...]]:
        return sorted(tuple(sorted(row.items())) for row in tables[name])

    for name in ("bc_fg_block", "bc_fg_end"):
        assert rows(written, name) == rows(rebuilt, name), name
    assert len(rows(written, "bc_fg_end")) > 10  # the nodes had bookings to index


def stale_nodes(runtime: Any) -> set[str]:
    with runtime.projections.sql.transaction(commit=False) as cursor:
        cursor.execute("SELECT node_id FROM bc_fg_stale")
        return {str(row["node_id"]) for row in cursor.fetchall()}


def index_rows(runtime: Any, node_id: str) -> list[tuple[Any, ...]]:
    sql = runtime.projections.sql
    with sql.transaction(commit=False) as cursor:
        sql.execute(cursor, "SELECT k, from_at, until_at FROM bc_fg_block WHERE node_id = ? "
                    "ORDER BY k", (node_id,))
        return [tuple(row.values()) if hasattr(row, "values") else tuple(row)
                for row in cursor.fetchall()]


def test_a_batch_marks_nodes_and_settling_computes_each_once(
        runtime: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Creates that start now never read the blocks: a batch marks the nodes it changed, and
    settling recomputes each of them once, however many of its events came in between, to
    the rows applying the whole log again gives."""
    from better_compute.projections import earliest_index
    from tests.integration.test_reservations_service import reserve

    rs, _, pool, nodes = setup(runtime, nodes=2, quota=None)
    runner = runtime.projections
    runner.catch_up("free_gpus")
    runner.settle("free_gpus")
    assert stale_nodes(runtime) == set()
    before = {n: index_rows(runtime, n) for n in nodes}
    refreshed: list[str] = []
    real = earliest_index.refresh_blocks

    def refresh_blocks(sql: Sql, cursor: Any, node_id: str) -> None:
        refreshed.append(node_id)
        real(sql, cursor, node_id)

    monkeypatch.setattr(earliest_index, "refresh_blocks", refresh_blocks)
    placed = [reserve(rs, pool, 1, duration="1h")["nodeId"] for _ in range(5)]
    runner.catch_up("free_gpus")
    assert len(set(placed)) == 1  # the placer packs one node first
    assert stale_nodes(runtime) == set(placed)
    assert refreshed == []  # no batch recomputed a block
    assert {n: index_rows(runtime, n) for n in nodes} == before
    assert runner.settle("free_gpus") == 1
    assert refreshed == placed[:1]  # once for five creates
    assert stale_nodes(runtime) == set()
    assert index_rows(runtime, placed[0]) != before[placed[0]]
    assert runner.settle("free_gpus") == 0  # nothing waits: one read, nothing recomputed
    assert refreshed == placed[:1]
    _, settled = runner.rows_at_position("free_gpus")
    runner.rebuild("free_gpus")
    _, rebuilt = runner.rows_at_position("free_gpus")
    for name in ("bc_fg_block", "bc_fg_end", "bc_fg_stale"):
        assert sorted(map(str, settled[name])) == sorted(map(str, rebuilt[name])), name


def test_the_queue_dispatchers_pass_settles_the_index(runtime: Any) -> None:
    from better_compute.api.controllers.queue import QueueDispatcher
    from tests.integration.test_reservations_service import reserve

    rs, _, pool, _ = setup(runtime, nodes=2, quota=None)
    runtime.projections.catch_up("free_gpus")
    runtime.projections.settle("free_gpus")
    node_id = reserve(rs, pool, 2, duration="1h")["nodeId"]
    runtime.projections.catch_up("free_gpus")
    assert stale_nodes(runtime) == {node_id}
    QueueDispatcher(rs).run()
    assert stale_nodes(runtime) == set()
