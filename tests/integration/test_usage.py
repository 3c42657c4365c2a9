"""GPU-hours from the usage projection: exact to the second, by tenant, pool and day.

Reservations with known starts and ends (the service's clock, moved by the
test): the report's figures are worked out by hand below, then checked
again after the projection is rebuilt from sequence 0.
"""

from __future__ import annotations

from typing import Any

import pytest

from better_compute.api.controllers.reservations import ReservationTimers
from better_compute.api.services.reservations import ReservationService
from better_compute.api.services.usage import usage_report
from better_compute.domain.access import LOCAL_OPERATOR as OP
from better_compute.domain.access import Principal, Role
from better_compute.domain.errors import InvalidInput, NotFound, PermissionDenied
from tests.fleet import add_nodes, make_pool
from tests.integration.test_reservations_service import Clock

ACME = Principal("acme", Role.READ_ONLY, "tok_acme")
GLOBEX = Principal("globex", Role.MEMBER, "tok_globex")
DAY = ["2031-05-01", "2031-05-03"]


def report(rt: Any, who: Principal = OP, by: str = "tenant", start: str = DAY[0],
           end: str = DAY[1], **kw: Any) -> dict[str, Any]:
    return usage_report(rt.service, who, tenant_id=kw.get("tenant"), pool_id=kw.get("pool"),
                        start=start, end=end, by=by)


def booked(doc: dict[str, Any]) -> list[tuple[str, int, int]]:
    """(key, booked GPU-seconds, active GPU-seconds) per row."""
    keys = doc["by"]
    names = {"tenant": "tenantId", "pool": "poolId", "day": "day"}
    return [("/".join(r[names[k]] for k in keys), r["bookedGpuSeconds"], r["activeGpuSeconds"])
            for r in doc["rows"]]


@pytest.fixture
def world(runtime: Any) -> tuple[Any, Clock, str, str]:
    clock = Clock()  # 2031-05-01T12:00:00Z
    runtime.service.clock = clock
    service = runtime.service
    pool_a = make_pool(service, key="pool-a")
    pool_b = make_pool(service, key="pool-b")
    add_nodes(service, pool_a, 2)
    add_nodes(service, pool_b, 1)
    for tenant in ("acme", "globex"):
        service.tenants_create(OP, tenant, None)
        for pool in (pool_a, pool_b):
            service.pools_offer(OP, pool, tenant, {"gpu": 16})
    rs: ReservationService = runtime.services.reservations
    timers = ReservationTimers(rs)

    def reserve(tenant: str, pool: str, gpus: int, duration: str, start: str | None = None
                ) -> dict[str, Any]:
        return rs.create(OP, tenant_id=tenant, pool_id=pool, gpus=gpus, duration=duration,
                         start=start)

    r1 = reserve("acme", pool_a, 4, "2h")  # 12:00-14:00
    timers.tick()
    clock.advance(minutes=10)
    bound = rs.bound(r1["nodeId"], {"allocationId": r1["allocationId"],
                                    "cdiDevices": [f"bcd.dev/gpu={g}" for g in r1["gpus"]]},
                     actor=r1["nodeId"])
    assert bound  # active from 12:10
    reserve("acme", pool_a, 2, "10h", start="+50m")  # r4: 13:00-23:00, running at 15:00
    reserve("globex", pool_a, 1, "2h", start="2031-05-01T23:00:00Z")  # r3: across midnight
    reserve("acme", pool_b, 2, "4h", start="2031-05-02T10:00:00Z")  # r2: tomorrow
    clock.advance(minutes=80)  # 13:30
    rs.release(OP, r1["id"])
    timers.tick()  # r4 binds (never active)
    clock.advance(minutes=90)  # 15:00
    return runtime, clock, pool_a, pool_b


def test_gpu_hours_exact_to_the_second_running_ones_counted_to_now(world: Any) -> None:
    rt, clock, pool_a, pool_b = world
    now = report(rt)
    # r1: 4 GPUs 12:00-13:30 booked (21600 s), active 12:10-13:30 (19200 s);
    # r4: 2 GPUs 13:00-15:00 so far (14400 s); r3 and r2 have not started.
    assert booked(now) == [("acme", 36000, 19200)]
    assert now["total"]["bookedGpuHours"] == 10.0 and now["total"]["reservations"] == 2
    assert now["now"] == "2031-05-01T15:00:00Z"

    clock.advance(hours=23)  # 2031-05-02T14:00: everything has ended
    ReservationTimers(rt.services.reservations).tick()
    # r4 2x10h = 72000, r3 1x2h = 7200 (23:00-01:00), r2 2x4h = 28800.
    assert booked(report(rt)) == [("acme", 122400, 19200), ("globex", 7200, 0)]
    assert booked(report(rt, by="pool")) == sorted([(pool_a, 100800, 19200),
                                                    (pool_b, 28800, 0)])
    by_day = report(rt, by="day")
    assert booked(by_day) == [("2031-05-01", 97200, 19200), ("2031-05-02", 32400, 0)]
    assert by_day["total"]["bookedGpuSeconds"] == 129600
    assert by_day["total"]["bookedGpuHours"] == 36.0
    assert booked(report(rt, by="tenant,day")) == [
        ("acme/2031-05-01", 93600, 19200), ("acme/2031-05-02", 28800, 0),
        ("globex/2031-05-01", 3600, 0), ("globex/2031-05-02", 3600, 0)]
    # A window clips: 13:00-14:00 holds r1's last 30 minutes and r4's first hour.
    clipped = report(rt, start="2031-05-01T13:00:00Z", end="2031-05-01T14:00:00Z")
    assert booked(clipped) == [("acme", 14400, 7200)]
    assert booked(report(rt, pool=pool_b)) == [("acme", 28800, 0)]

    before = {by: report(rt, by=by) for by in ("tenant", "pool", "day")}
    rt.projections.rebuild("usage")
    assert {by: report(rt, by=by) for by in ("tenant", "pool", "day")} == before


def test_a_tenant_sees_only_its_own_usage(world: Any) -> None:
    rt, clock, pool_a, _ = world
    clock.advance(hours=23)
    ReservationTimers(rt.services.reservations).tick()
    assert booked(report(rt, ACME)) == [("acme", 122400, 19200)]
    assert booked(report(rt, GLOBEX, by="pool")) == [(pool_a, 7200, 0)]
    with pytest.raises(PermissionDenied):
        report(rt, ACME, tenant="globex")
    assert booked(report(rt, OP, tenant="globex")) == [("globex", 7200, 0)]


def test_bad_windows_and_groupings_are_refused(world: Any) -> None:
    rt = world[0]
    with pytest.raises(InvalidInput, match="not after"):
        report(rt, start="2031-05-02", end="2031-05-01")
    with pytest.raises(InvalidInput, match="--by"):
        report(rt, by="node")
    with pytest.raises(InvalidInput, match="--from"):
        report(rt, start="yesterday")
    with pytest.raises(NotFound):
        report(rt, ACME, pool="pool_aaaaaaaaaaaaaaaaaaaaaaaaaa")


def test_the_cli_writes_csv_for_billing(world: Any, capsys: pytest.CaptureFixture[str]) -> None:
    import csv
    import io

    import msgspec

    from better_compute.api.http import rpc
    from better_compute.api.http.schemas import RpcRequest
    from better_compute.cli.context import Context
    from better_compute.cli.main import build_parser

    rt, clock, _, _ = world
    clock.advance(hours=23)

    class InProcess:  # the CLI's in-process client, on this test's store and clock
        def call(self, method: str, params: dict[str, Any] | None = None) -> Any:
            request = RpcRequest(method=method, params=msgspec.Raw(msgspec.json.encode(params)))
            answer = rpc.answer(request, rt.services, lambda: OP)
            assert answer.error is msgspec.UNSET, answer.error
            return msgspec.to_builtins(answer.result)

        def close(self) -> None:
            pass

    args = build_parser().parse_args(["usage", "--from", DAY[0], "--to", DAY[1],
                                      "--by", "tenant,day", "-o", "csv"])
    ctx = Context(env={}, args=args)
    ctx._client = InProcess()
    args.run(ctx, args)
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert list(rows[0]) == ["tenantId", "day", "reservations", "bookedGpuSeconds",
                             "bookedGpuHours", "activeGpuSeconds", "activeGpuHours"]
    assert [(r["tenantId"], r["day"], r["bookedGpuSeconds"]) for r in rows] == [
        ("acme", "2031-05-01", "93600"), ("acme", "2031-05-02", "28800"),
        ("globex", "2031-05-01", "3600"), ("globex", "2031-05-02", "3600")]


def test_a_reservation_placed_from_the_queue_or_moved_earlier_counts_from_its_start(
        runtime: Any) -> None:
    """A queued reservation is booked by ``reservation.dequeued`` (no ``reservation.placed``),
    and one moved earlier records its new start in ``reservation.rescheduled``: usage counts
    each from the start it ended up with, as its record shows."""
    clock = Clock()  # 12:00
    runtime.service.clock = clock
    service = runtime.service
    pool = make_pool(service, key="pool-q")
    add_nodes(service, pool, 1)  # 8 GPUs
    service.tenants_create(OP, "acme", None)
    service.pools_offer(OP, pool, "acme", {"gpu": 4})
    rs: ReservationService = runtime.services.reservations

    def reserve(tenant: str, gpus: int, **kw: Any) -> dict[str, Any]:
        return rs.create(OP, tenant_id=tenant, pool_id=pool, gpus=gpus, duration="1h", **kw)

    held = reserve("acme", 4)  # 12:00, acme's whole quota
    queued = reserve("acme", 4, queue=True)  # over the quota: queued
    owner = reserve("root", 4)  # 12:00-13:00, the node's other half
    later = reserve("root", 4, start="earliest")  # 13:00, moved earlier when GPUs free up
    assert (queued["state"], later["start"]) == ("queued", "2031-05-01T13:00:00Z")
    clock.advance(minutes=10)  # 12:10
    rs.release(OP, held["id"])
    rs.release(OP, owner["id"])
    rs.dispatch(pool, actor="controller:reservations")
    assert rs.get_doc(OP, queued["id"])["start"] == "2031-05-01T12:10:00Z"
    assert rs.get_doc(OP, later["id"])["start"] == "2031-05-01T12:10:00Z"
    clock.advance(minutes=30)  # 12:40
    # acme: 4 x 10 min (held) + 4 x 30 min (dequeued at 12:10) = 9600 GPU-seconds;
    # root: 4 x 10 min (owner) + 4 x 30 min (moved from 13:00 to 12:10) = 9600.
    assert booked(report(runtime)) == [("acme", 9600, 0), ("root", 9600, 0)]
    runtime.projections.rebuild("usage")
    assert booked(report(runtime)) == [("acme", 9600, 0), ("root", 9600, 0)]
