"""The free-GPU index is kept inline: every save applies it in its own transaction.

DESIGN.md allows it for the index the placer reads: a create places on the index as of the
last commit without following the log first, a save that is refused leaves no trace in it,
and it equals the index rebuilt from the log (``store verify``). Its booking events are
written without reading a row first, so on PostgreSQL they add no round trip to the save.
"""

from __future__ import annotations

from typing import Any

import pytest
from eventsourcing.persistence import IntegrityError

from better_compute.api.store.verify import verify
from better_compute.domain.access import LOCAL_OPERATOR as OP
from better_compute.domain.bookings import NodeBookings, bookings_uuid
from tests.fleet import offered_pool
from tests.support import open_runtime


def _index(runtime: Any) -> tuple[dict[str, int], set[str]]:
    """Each node's free_now, and the allocations the index holds."""
    sql = runtime.projections.sql
    with sql.transaction(commit=False) as cursor:
        sql.execute(cursor, "SELECT node_id, free_now FROM bc_fg_node")
        free = {str(r["node_id"]): int(r["free_now"]) for r in cursor.fetchall()}
        sql.execute(cursor, "SELECT allocation_id FROM bc_fg_booking")
        held = {str(r["allocation_id"]) for r in cursor.fetchall()}
    return free, held


def _equal_to_a_rebuild(runtime: Any) -> None:
    report = verify(runtime)
    assert report["projections"]["free_gpus"].startswith("equal"), report["problems"]


def test_a_saved_booking_is_in_the_index_when_the_save_returns(runtime: Any) -> None:
    pool = offered_pool(runtime.service, nodes=2, gpus=16)
    free_before, _ = _index(runtime)
    rs = runtime.services.reservations
    doc = rs.create(OP, tenant_id="acme", pool_id=pool, gpus=3, duration="1h")
    free, held = _index(runtime)  # nothing followed, nothing caught up
    assert free[doc["nodeId"]] == free_before[doc["nodeId"]] - 3
    assert len(held) == 1
    rs.release(OP, doc["id"])
    assert _index(runtime) == (free_before, set())
    _equal_to_a_rebuild(runtime)


def test_a_refused_save_leaves_the_index_as_it_was(runtime: Any) -> None:
    pool = offered_pool(runtime.service, nodes=1, gpus=8)
    rs = runtime.services.reservations
    doc = rs.create(OP, tenant_id="acme", pool_id=pool, gpus=1, duration="1h")
    before = _index(runtime)
    stale = runtime.store.repository.get(bookings_uuid(doc["nodeId"]), version=1)
    assert isinstance(stale, NodeBookings)
    now = runtime.service.aggregates.now()
    stale.book(allocation_id="alloc_stale", reservation_id="rsv_stale", holder="acme",
               gpus=["GPU-x"], cpus=1, memory_gib=1, start=now,
               end=now.replace(year=now.year + 1), cpu_capacity=None, memory_capacity_gib=None)
    with pytest.raises(IntegrityError):
        runtime.store.save(stale, actor="local")  # an older version: refused as a whole
    assert _index(runtime) == before
    _equal_to_a_rebuild(runtime)


def test_a_create_applies_its_bookings_to_the_index_reading_nothing(
        runtime: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    pool = offered_pool(runtime.service, nodes=2, gpus=16)
    rs = runtime.services.reservations
    projections = runtime.projections
    fetches: list[str] = []
    real = type(projections).apply_inline

    class Counting:
        def __init__(self, cursor: Any) -> None:
            self.cursor = cursor
            self.connection = getattr(cursor, "connection", None)

        def execute(self, *args: Any, **kwargs: Any) -> Any:
            self.last = str(args[0])
            return self.cursor.execute(*args, **kwargs)

        def fetchone(self) -> Any:
            fetches.append(self.last)
            return self.cursor.fetchone()

        def fetchall(self) -> Any:
            fetches.append(self.last)
            return self.cursor.fetchall()

    def apply_inline(self: Any, cursor: Any, events: Any, sequences: Any) -> None:
        real(self, Counting(cursor), events, sequences)

    monkeypatch.setattr(type(projections), "apply_inline", apply_inline)
    doc = rs.create(OP, tenant_id="acme", pool_id=pool, gpus=2, duration="1h")
    rs.release(OP, doc["id"])
    assert fetches == []
    monkeypatch.undo()
    _equal_to_a_rebuild(runtime)


def test_an_index_of_an_older_version_is_rebuilt_once_when_the_store_opens(
        runtime: Any, env: dict[str, str]) -> None:
    pool = offered_pool(runtime.service, nodes=2, gpus=16)
    rs = runtime.services.reservations
    for _ in range(3):
        rs.create(OP, tenant_id="acme", pool_id=pool, gpus=1, duration="1h")
    kept = _index(runtime)
    sql = runtime.projections.sql
    name = runtime.projections.get("free_gpus").tracking_name
    table = "bc_tracking" if sql.postgres else "tracking"
    with sql.transaction(commit=True) as cursor:  # as a store of the version before
        sql.execute(cursor, "DELETE FROM bc_fg_booking")
        sql.execute(cursor, "UPDATE bc_fg_node SET free_now = 0")
        sql.execute(cursor, f"DELETE FROM {table} WHERE application_name = ?", (name,))
    other: Any = open_runtime(env)
    try:
        assert _index(other) == kept
    finally:
        other.close()
    _equal_to_a_rebuild(runtime)


def test_a_save_whose_index_writes_fail_records_nothing(runtime: Any,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The events and the index commit together or not at all (on PostgreSQL the writes go
    after the insert, in one pipelined transaction with no BEGIN of its own)."""
    from better_compute.projections.free_gpus import FreeGpus

    pool = offered_pool(runtime.service, nodes=1, gpus=8)
    before, head = _index(runtime), runtime.projections.source.head()
    real = FreeGpus.end_batch

    def failing(self: Any, sql: Any, cursor: Any) -> None:
        real(self, sql, cursor)
        sql.execute(cursor, "INSERT INTO bc_fg_booking (allocation_id) VALUES (NULL)")

    monkeypatch.setattr(FreeGpus, "end_batch", failing)
    with pytest.raises(Exception):  # noqa: B017 (the database's own error, either backend)
        runtime.services.reservations.create(OP, tenant_id="acme", pool_id=pool, gpus=1,
                                             duration="1h")
    monkeypatch.undo()
    assert runtime.projections.source.head() == head  # not one event of the save
    assert _index(runtime) == before
    _equal_to_a_rebuild(runtime)
