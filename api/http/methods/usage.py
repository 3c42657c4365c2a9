"""usage.report: GPU-hours for billing, from the usage projection."""

from __future__ import annotations

from typing import Any

import msgspec

from better_compute.api.http.methods import Call
from better_compute.api.http.schemas import Params
from better_compute.api.services.usage import usage_report


class UsageReport(Params, kw_only=True):
    from_: str = msgspec.field(name="from")
    to: str | None = None
    tenant_id: str | None = None
    pool_id: str | None = None
    by: str | list[str] | None = None


def usage_report_method(call: Call, p: UsageReport) -> dict[str, Any]:
    return usage_report(call.service, call.principal, tenant_id=p.tenant_id, pool_id=p.pool_id,
                        start=p.from_, end=p.to, by=p.by)
