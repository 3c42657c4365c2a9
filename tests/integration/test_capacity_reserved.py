"""allocated vs reserved, through real reservations, on each backend (docs/capacity.md).

A reservation that starts later is ``reserved``; at its start the reservations
controller binds it and it becomes ``allocated``; released, it frees its GPUs. The
placer's index agrees with ``available`` throughout. Time is the service's injected
clock, moved by the test; the controller runs one pass at a time.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from better_compute.api.controllers.reservations import ReservationTimers
from better_compute.domain.access import LOCAL_OPERATOR as OP
from tests.fleet import add_nodes, make_pool


class Clock:
    def __init__(self) -> None:
        self.now = datetime(2031, 5, 1, 12, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now


def free_now(runtime: Any, pool: str) -> int:
    runtime.projections.catch_up("free_gpus")
    sql = runtime.projections.sql
    with sql.transaction(commit=False) as cursor:
        sql.execute(cursor, "SELECT COALESCE(SUM(free_now), 0) AS n FROM bc_fg_node "
                    "WHERE pool_id = ? AND schedulable = 1", (pool,))
        return int(cursor.fetchone()["n"])


def test_a_later_reservation_is_reserved_then_allocated_then_freed(runtime: Any) -> None:
    clock = Clock()
    runtime.service.clock = clock
    pool = make_pool(runtime.service)
    add_nodes(runtime.service, pool, 1)  # one adopted 8-GPU node: 224 CPUs, 2015.56 GiB
    nodes = runtime.services.nodes
    rs = runtime.services.reservations
    timers = ReservationTimers(rs)

    def rollup() -> dict[str, dict[str, float]]:
        resources: dict[str, dict[str, float]] = nodes.capacity(OP, pool)["resources"]
        assert resources["gpu"]["available"] == free_now(runtime, pool)  # one definition
        return resources

    def gpu() -> tuple[float, float, float]:
        row = rollup()["gpu"]
        return row["allocated"], row["reserved"], row["available"]

    assert gpu() == (0, 0, 8)
    later = rs.create(OP, tenant_id=None, pool_id=pool, gpus=4, duration="2h", start="+2h")
    assert gpu() == (0, 4, 4)
    host = rollup()
    assert (host["cpu"]["reserved"], host["memory"]["reserved"]) == (104, 956)
    assert host["cpu"]["available"] == 224 - 104
    assert host["memory"]["available"] == round(2015.56 - 956, 3)

    # The same GPUs booked again for an even later slot: still four reserved GPUs.
    after = rs.create(OP, tenant_id=None, pool_id=pool, gpus=8, duration="1h", start="+5h")
    assert gpu() == (0, 8, 0)
    rs.release(OP, after["id"], cancel=True)
    assert gpu() == (0, 4, 4)

    # Time passes with no event: the rollup moves when the controller binds at the start.
    clock.now += timedelta(hours=2)
    assert gpu() == (0, 4, 4)
    assert timers.tick().binding == [later["id"]]
    assert gpu() == (4, 0, 4)
    held = rollup()
    assert (held["cpu"]["allocated"], held["cpu"]["reserved"]) == (104, 0)

    clock.now += timedelta(minutes=30)
    rs.release(OP, later["id"])
    assert gpu() == (0, 0, 8)
