"""The reservations projection's counts by tenant, pool and state (bc_rsv_count, read by
/metrics) equal its rows, also after an upgrade from version 1, which left rows and no
counts: version 2 applies the log again from sequence 0 over those rows."""

from __future__ import annotations

from collections import Counter
from typing import Any

from better_compute.domain.access import LOCAL_OPERATOR as OP
from better_compute.projections.reservations import count_reservations, list_reservations
from tests.integration.test_reservations_service import ACME, reserve, setup


def _counted(runtime: Any) -> dict[tuple[str, str, str], int]:
    runtime.projections.catch_up("reservations")
    return {(t, p, s): n for t, p, s, n in count_reservations(runtime.projections.sql)}


def _listed(runtime: Any) -> dict[tuple[str, str, str], int]:
    rows = list_reservations(runtime.projections.sql)
    return dict(Counter((r["tenantId"], r["poolId"], r["state"]) for r in rows))


def test_counts_follow_every_state_and_survive_an_upgrade(runtime: Any) -> None:
    rs, clock, pool, _ = setup(runtime)
    kept = reserve(rs, pool, 2, ACME)
    released = reserve(rs, pool, 1)
    reserve(rs, pool, 1, start="+1h")
    rs.release(OP, released["id"])
    clock.advance(minutes=1)
    counted = _counted(runtime)
    assert counted == _listed(runtime)
    assert kept["state"] == "placed"  # the answer; it started, so it is binding now
    assert counted[("acme", pool, "binding")] == 1
    assert counted[("root", pool, "released")] == 1

    # Version 1 knew no counts: its rows stay, its position is 0 for version 2.
    sql = runtime.projections.sql
    projection = runtime.projections.get("reservations")
    with sql.transaction(commit=True) as cursor:
        sql.execute(cursor, "DELETE FROM bc_rsv_count")
        table = "bc_tracking" if sql.postgres else "tracking"
        sql.execute(cursor, f"DELETE FROM {table} WHERE application_name = ?",
                    (projection.tracking_name,))
    assert count_reservations(sql) == []
    assert _counted(runtime) == counted == _listed(runtime)
