"""capacity.get and capacity.history: a pool's rollup per resource, now and over time
(docs/capacity.md)."""

from __future__ import annotations

from typing import Any

from better_compute.api.http.rpc import Call, method
from better_compute.api.http.schemas import Params


class CapacityGet(Params, kw_only=True):
    pool_id: str


@method("capacity.get", CapacityGet,
        "A pool's capacity per resource (gpu, cpu, memory): total, allocatable, allocated, "
        "reserved, available, and GPUs provisioning, unhealthy, in maintenance, unreachable.")
def capacity_get(call: Call, p: CapacityGet) -> dict[str, Any]:
    return call.services.nodes.capacity(call.principal, p.pool_id)


class CapacityHistory(Params, kw_only=True):
    pool_id: str
    window: str | None = None  # 1h to 7d; default 24h


@method("capacity.history", CapacityHistory,
        "A pool's GPUs over the last window (1h to 7d, default 24h): total, allocatable, "
        "allocated, reserved and available at evenly spaced instants, from the capacity read "
        "model's 5-minute history.")
def capacity_history(call: Call, p: CapacityHistory) -> dict[str, Any]:
    return call.services.nodes.capacity_history(call.principal, p.pool_id, p.window)
