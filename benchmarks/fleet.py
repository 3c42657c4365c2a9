"""Simulated fleets: pools and adopted nodes in a store, for benchmarks and tests.

Nodes are made the way the join and the acceptance make them (``Node`` joined,
then an acceptance attempt that passes), without a real bcd.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from better_compute.api.wire.inventory import Gpu
from better_compute.domain.access import LOCAL_OPERATOR, Principal
from better_compute.domain.gpu_claims import GpuClaim
from better_compute.domain.ids import new_uuid, public_id
from better_compute.domain.node import NODE_ROLE, Node

H100_MIB = 81559
H100_NAME = "NVIDIA H100 80GB HBM3"


def gpu_docs(count: int, host: str, *, domains: Sequence[int] | None = None,
             memory_mib: int = H100_MIB, name: str = H100_NAME) -> list[dict[str, Any]]:
    """``count`` GPUs as bcd reports them; ``domains[i]`` puts GPU i in NVLink domain i. A card
    other than the H100 gets the product and family bcd derives from its name."""
    card = Gpu(index=0, uuid="GPU-x", name=name)
    product, family = ("H100-SXM5-80GB", "H100") if name == H100_NAME else (card.product, card.family)
    out = []
    for i in range(count):
        domain = f"{host}/nvlink-{domains[i]}" if domains is not None else f"{host}/nvswitch"
        out.append({
            "index": i, "uuid": f"GPU-{host}-{i:02d}", "name": name, "memoryMiB": memory_mib,
            "nvlinkDomain": domain, "healthy": True, "healthReasons": [],
            "product": product, "family": family,
        })
    return out


def make_pool(service: Any, principal: Principal = LOCAL_OPERATOR, key: str = "pool-a",
              gpu_count: int = 8) -> str:
    site = service.sites_create(principal, "shared", "eu-1", None, f"site-{key}")
    pool = service.pools_create(
        principal, site["id"], "metal-host", "H100",
        {"acceptance": [{"kind": "diag.nvml"}], "expect": {"gpuCount": gpu_count}}, None, key,
    )
    return str(pool["id"])


def build_node(pool_id: str, owner: str = "root", *, gpus: int = 8, cpus: int = 224,
               memory_gib: float = 2015.56, domains: Sequence[int] | None = None,
               adopted: bool = True, at: datetime | None = None, gpu_name: str = H100_NAME,
               hostname: str | None = None) -> Node:
    uuid = new_uuid()
    host = public_id("node", uuid)[5:13]
    docs = gpu_docs(gpus, host, domains=domains, name=gpu_name)
    at = at or datetime.now(UTC)
    hardware: dict[str, Any] = {"serial": host, "cpus": cpus, "memoryGib": memory_gib,
                                "macs": []}
    if hostname is not None:
        hardware["hostname"] = hostname
    node = Node(
        id=uuid, tenant_id=owner, pool_id=pool_id, site_id="site_x", join_token_id="jt_x",
        role=NODE_ROLE, hardware_key=f"serial:{host}",
        hardware=hardware,
        gpus=docs, key_pin="sha256/x", certificate_serial="1",
        certificate_not_after=at + timedelta(days=365), bcd_version="test",
    )
    if adopted:
        attempt = node.start_acceptance(at, [{"kind": "diag.nvml"}], "test", None)
        node.finish_acceptance(attempt, True, "ok", [], docs, at)
    return node


def claims(node: Node) -> list[GpuClaim]:
    """The claims an adoption saves with its node: one per GPU (domain/gpu_claims.py)."""
    out = []
    for gpu in node.gpus:
        claim = GpuClaim(tenant_id=node.tenant_id, uuid=gpu["uuid"])
        claim.claim(node.public_id, node.tenant_id, node.adopted_at or datetime.now(UTC))
        out.append(claim)
    return out


def add_nodes(service: Any, pool_id: str, count: int, owner: str = "root", **kwargs: Any
              ) -> list[str]:
    """``count`` nodes saved, each adopted one with its GPUs' claims as an adoption saves
    them."""
    nodes = [build_node(pool_id, owner, **kwargs) for _ in range(count)]
    for start in range(0, len(nodes), 100):
        batch = nodes[start:start + 100]
        service.store.save(*batch, *(c for n in batch if n.adopted for c in claims(n)), actor="local")
    return [n.public_id for n in nodes]
