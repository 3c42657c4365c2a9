"""capacity.history: a pool's GPUs over time, from the capacity read model's 5-minute buckets.

Events carry their own time (``timestamp``); the test moves one clock that stamps the events
and answers the service's ``now``, so the figures at each instant are known by hand. The
buckets are the same whether the log is followed a few events at a time or rebuilt in one
batch (``store verify`` compares the two), and a pool keeps 8 days of them.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import eventsourcing.domain
import pytest

from better_compute.domain.access import LOCAL_OPERATOR as OP
from better_compute.domain.access import Principal, Role
from better_compute.domain.errors import InvalidInput, NotFound
from better_compute.projections.capacity_history import TABLE
from tests.fleet import add_nodes, make_pool

T0 = datetime(2031, 5, 1, 12, 0, tzinfo=UTC)  # a bucket's start


class Clock:
    """The service's clock and the events' timestamps, moved by the test."""

    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now

    def at(self, **kw: float) -> None:
        self.now = T0 + timedelta(**kw)


@pytest.fixture
def clock(runtime: Any, monkeypatch: pytest.MonkeyPatch) -> Clock:
    clock = Clock()
    runtime.service.clock = clock
    monkeypatch.setattr(eventsourcing.domain, "datetime_now_with_tzinfo", clock)
    return clock


def history_rows(runtime: Any) -> list[tuple[Any, ...]]:
    sql = runtime.projections.sql
    with sql.transaction(commit=False) as cursor:
        sql.execute(cursor, f"SELECT * FROM {TABLE} ORDER BY pool_id, bucket")
        return [tuple(float(v) if isinstance(v, int | float) else v for v in r.values())
                for r in map(dict, cursor.fetchall())]


def allocated(answer: dict[str, Any]) -> dict[int, int]:
    """``at`` (as minutes after T0) -> allocated GPUs, for the points of ``answer``."""
    return {round((datetime.fromisoformat(p["at"].replace("Z", "+00:00")) - T0)
                  .total_seconds() / 60): p["allocated"] for p in answer["points"]}


def test_the_history_answers_the_figures_at_each_instant_and_survives_a_rebuild(
        runtime: Any, clock: Clock) -> None:
    nodes, rs = runtime.services.nodes, runtime.services.reservations
    pool = make_pool(runtime.service)
    add_nodes(runtime.service, pool, 1)  # 8 GPUs at T0
    runtime.projections.catch_up("capacity")
    clock.at(minutes=12)
    first = rs.create(OP, tenant_id=None, pool_id=pool, gpus=4, duration="2h")
    runtime.projections.catch_up("capacity")  # followed a few events at a time
    clock.at(minutes=61)
    rs.create(OP, tenant_id=None, pool_id=pool, gpus=2, duration="2h")
    clock.at(minutes=62)
    rs.create(OP, tenant_id=None, pool_id=pool, gpus=1, duration="2h")
    runtime.projections.catch_up("capacity")
    clock.at(minutes=64)
    rs.release(OP, first["id"])  # in the same bucket: only the bucket's last figures stay
    clock.at(minutes=100)

    answer = nodes.capacity_history(OP, pool, "2h")
    assert (answer["window"], answer["step"]) == ("2h", "5m")
    assert answer["to"] == "2031-05-01T13:40:00Z" and answer["from"] == "2031-05-01T11:40:00Z"
    seen = allocated(answer)
    assert len(seen) == 2 * 12 + 1  # the window's start, every 5 minutes in it, and now
    assert {m: seen[m] for m in (-20, 0, 5, 10, 15, 60, 65, 70, 100)} == {
        -20: 0, 0: 0, 5: 0, 10: 0, 15: 4, 60: 4, 65: 3, 70: 3, 100: 3}
    last = answer["points"][-1]
    assert last == {"at": "2031-05-01T13:40:00Z", "total": 8, "allocatable": 8,
                    "allocated": 3, "reserved": 0, "available": 5}
    assert answer["points"][1]["total"] == 0  # before the node joined
    assert answer["points"][5]["total"] == 8

    live = history_rows(runtime)
    assert len(live) == 3  # the buckets at 0, 10 and 60 minutes
    runtime.projections.rebuild("capacity")  # one batch
    assert history_rows(runtime) == live
    assert nodes.capacity_history(OP, pool, "2h") == answer


def test_a_pool_keeps_eight_days_and_the_row_before_them(runtime: Any, clock: Clock) -> None:
    nodes, rs = runtime.services.nodes, runtime.services.reservations
    pool = make_pool(runtime.service)
    add_nodes(runtime.service, pool, 1)
    clock.at(minutes=10)
    rs.create(OP, tenant_id=None, pool_id=pool, gpus=2, duration="30d")
    runtime.projections.catch_up("capacity")
    assert len(history_rows(runtime)) == 2
    clock.at(days=9)
    rs.create(OP, tenant_id=None, pool_id=pool, gpus=1, duration="1h")
    runtime.projections.catch_up("capacity")
    rows = history_rows(runtime)
    assert [r[1] for r in rows] == [(T0 + timedelta(minutes=10)).timestamp(),
                                    (T0 + timedelta(days=9)).timestamp()]
    week = nodes.capacity_history(OP, pool, "7d")
    assert week["step"] == "1h" and len(week["points"]) == 7 * 24 + 1
    assert [p["allocated"] for p in week["points"][:-1]] == [2] * 7 * 24  # carried forward
    assert week["points"][-1]["allocated"] == 3


def test_the_window_is_checked_and_the_pool_must_be_visible(runtime: Any, clock: Clock) -> None:
    nodes = runtime.services.nodes
    pool = make_pool(runtime.service)
    for window, message in [("30m", "out of range"), ("8d", "out of range"),
                            ("soon", "is not a duration")]:
        with pytest.raises(InvalidInput, match=message):
            nodes.capacity_history(OP, pool, window)
    assert nodes.capacity_history(OP, pool, None)["window"] == "1d"  # 24h
    runtime.service.tenants_create(OP, "acme", None)
    with pytest.raises(NotFound):
        nodes.capacity_history(Principal("acme", Role.ADMIN, "tok_acme"), pool, "24h")


def test_capacity_get_answers_the_caller_s_quota(runtime: Any, clock: Clock) -> None:
    nodes, rs = runtime.services.nodes, runtime.services.reservations
    pool = make_pool(runtime.service)
    add_nodes(runtime.service, pool, 1)
    runtime.service.tenants_create(OP, "acme", None)
    runtime.service.pools_offer(OP, pool, "acme", {"gpu": 4})
    acme = Principal("acme", Role.MEMBER, "tok_acme")
    assert nodes.capacity(acme, pool)["quota"] == {"tenantId": "acme", "gpu": 4, "inUse": 0}
    rs.create(acme, tenant_id=None, pool_id=pool, gpus=3, duration="1h")
    assert nodes.capacity(acme, pool)["quota"] == {"tenantId": "acme", "gpu": 4, "inUse": 3}
    assert nodes.capacity(OP, pool)["quota"] == {"tenantId": "root", "gpu": "unlimited",
                                                 "inUse": 0}
