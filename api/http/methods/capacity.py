"""capacity.get: the rollup of a pool per resource (docs/capacity.md)."""

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
