"""usage.report: GPU-hours booked and held active, exact to the second (domain/usage.py).

Read from the usage projection (projections/usage.py), caught up first. Who
sees what: the root tenant sees every tenant's usage (or one, with
``tenantId``); any other tenant sees only its own reservations' usage, in
the pools it is offered. ``now`` is database time, as reservations use it.
"""

from __future__ import annotations

from typing import Any

from better_compute.api.services.compute import ComputeService
from better_compute.domain.access import Principal
from better_compute.domain.durations import parse_instant
from better_compute.domain.usage import check_window, parse_by, summarize, to_us
from better_compute.projections.usage import read_usage


def usage_report(service: ComputeService, principal: Principal, *, tenant_id: str | None,
                 pool_id: str | None, start: str, end: str | None,
                 by: str | list[str] | None) -> dict[str, Any]:
    keys = parse_by(by)
    now = service.aggregates.now()
    begin = parse_instant(start, now, flag="--from")
    until = parse_instant(end, now, flag="--to") if end else now
    check_window(begin, until)
    if tenant_id is not None or not principal.is_root:
        tenant: str | None = service.aggregates.scope(principal, tenant_id)
    else:
        tenant = None  # the root tenant, no --tenant: every tenant
    pools = [service.pool(principal, pool_id).public_id] if pool_id else []
    service.projections.catch_up("usage")
    rows = read_usage(service.sql, to_us(begin), to_us(until), tenant_id=tenant,
                      pool_ids=pools)
    report = summarize(rows, begin, until, now, keys)
    report["tenantId"] = tenant
    report["poolId"] = pools[0] if pools else None
    return report
