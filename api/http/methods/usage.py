"""usage.report: GPU-hours for billing, from the usage projection."""

from __future__ import annotations

from typing import Any

import msgspec

from better_compute.api.http.rpc import Call, method
from better_compute.api.http.schemas import Params
from better_compute.api.services.usage import usage_report


class UsageReport(Params, kw_only=True):
    from_: str = msgspec.field(name="from")
    to: str | None = None
    tenant_id: str | None = None
    pool_id: str | None = None
    by: str | list[str] | None = None


@method("usage.report", UsageReport,
        "GPU-hours booked and held active in [from, to), exact to the second, by tenant, pool "
        "and/or day; running reservations count to now. Root sees every tenant; others their "
        "own.")
def usage_report_method(call: Call, p: UsageReport) -> dict[str, Any]:
    return usage_report(call.service, call.principal, tenant_id=p.tenant_id, pool_id=p.pool_id,
                        start=p.from_, end=p.to, by=p.by)
