"""capacity.get and capacity.history: a pool's rollup per resource, now and over time
(docs/capacity.md)."""

from __future__ import annotations

from typing import Any

from better_compute.api.http.methods import Call
from better_compute.api.http.schemas import Params


class CapacityGet(Params, kw_only=True):
    pool_id: str


def capacity_get(call: Call, p: CapacityGet) -> dict[str, Any]:
    return call.services.nodes.capacity(call.principal, p.pool_id)


class CapacityHistory(Params, kw_only=True):
    pool_id: str
    window: str | None = None  # 1h to 7d; default 24h


def capacity_history(call: Call, p: CapacityHistory) -> dict[str, Any]:
    return call.services.nodes.capacity_history(call.principal, p.pool_id, p.window)
