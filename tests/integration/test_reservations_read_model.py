"""The reservations read model groups a batch's events by reservation (projections/reservations.py).

A create that starts now records `reservation.placed` and `.binding` in one save; the read
model writes each reservation's row once per batch, not once per event, and the rows and
counts equal those of applying one event at a time.
"""

from __future__ import annotations

import json
from typing import Any

from better_compute.domain.access import LOCAL_OPERATOR as OP
from tests.fleet import count_calls, offered_pool

COLUMNS = ("uuid", "id", "tenant_id", "pool_id", "node_id", "allocation_id", "state", "start_at",
           "end_at", "bind_deadline", "created_seq", "doc")


def _untimed(snapshot: str) -> dict[str, Any]:
    """A row's snapshot without when it was taken."""
    doc = json.loads(snapshot)
    doc.pop("timestamp")
    return doc  # type: ignore[no-any-return]


def _tables(runtime: Any) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    sql = runtime.projections.sql
    with sql.transaction(commit=False) as cursor:
        sql.execute(cursor, f"SELECT {', '.join(COLUMNS)}, snapshot FROM bc_rsv ORDER BY uuid")
        rows = [(*(row[c] for c in COLUMNS), _untimed(row["snapshot"]))
                for row in cursor.fetchall()]
        sql.execute(cursor, "SELECT tenant_id, pool_id, state, n FROM bc_rsv_count "
                            "ORDER BY tenant_id, pool_id, state")
        counts = [(row["tenant_id"], row["pool_id"], row["state"], row["n"])
                  for row in cursor.fetchall()]
    return rows, counts


def test_a_batch_writes_each_reservation_once_and_the_same_rows_as_one_at_a_time(
        runtime: Any, monkeypatch: Any) -> None:
    from better_compute.domain.reservation import Reservation

    pool = offered_pool(runtime.service, nodes=2, gpus=16)
    rs = runtime.services.reservations
    for i in range(6):
        doc = rs.create(OP, tenant_id="acme", pool_id=pool, gpus=1, duration="1h",
                        key=f"rsv-batch-{i}")
        if i % 2:
            rs.release(OP, doc["id"])
    rs.create(OP, tenant_id="acme", pool_id=pool, gpus=1, duration="1h", start="+2h",
              key="rsv-batch-later")  # placed, not bound: one event
    projections = runtime.projections
    rendered = count_calls(monkeypatch, Reservation, "to_doc")
    projections.rebuild("reservations")
    rows, counts = _tables(runtime)
    assert len(rows) == 7
    assert len(rendered) == len(set(rendered)) == 7, rendered  # each reservation once
    states = sorted(str(row[6]) for row in rows)
    assert states == ["binding", "binding", "binding", "placed", "released", "released",
                      "released"], states
    assert sorted((str(c[2]), int(c[3])) for c in counts if int(c[3])) == [
        ("binding", 3), ("placed", 1), ("released", 3)]

    rendered.clear()
    monkeypatch.setattr(projections, "batch_size", 1)
    projections.rebuild("reservations")
    assert _tables(runtime) == (rows, counts)
    assert len(rendered) > 7 + 6  # one at a time: rendered at each reservation event


def test_the_counts_are_the_same_wherever_the_batches_end(runtime: Any, monkeypatch: Any
                                                          ) -> None:
    """A combination of tenant, pool and state that no reservation is in has no count row,
    however the log was cut into batches: a reservation placed and bound in one save passes
    through ``placed`` only when a batch ends between its two events. A row left at 0 made the
    live read model (followed after every create) differ from ``store verify``'s rebuild (one
    batch), which reported it as a problem after every busy run."""
    pool = offered_pool(runtime.service, nodes=1, gpus=8)
    rs = runtime.services.reservations
    for i in range(3):
        doc = rs.create(OP, tenant_id="acme", pool_id=pool, gpus=1, duration="1h",
                        key=f"rsv-cut-{i}")
        rs.release(OP, doc["id"])
    projections = runtime.projections
    projections.rebuild("reservations")
    whole = _tables(runtime)
    assert [(c[2], c[3]) for c in whole[1]] == [("released", 3)]
    monkeypatch.setattr(projections, "batch_size", 1)
    projections.rebuild("reservations")
    assert _tables(runtime) == whole
