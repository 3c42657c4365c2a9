"""bcd's Prometheus metrics: each GPU as dcgm-exporter shows it, plus who holds it.

Read at scrape time from what the agent already has in memory (the last GPU read,
taken every poll interval, and the holds): a scrape touches no GPU and no file.
Every per-GPU series carries the labels ``gpu`` (index), ``uuid``, ``model``,
``pci_bus_id``, ``node`` and ``pool``, and ``allocation`` / ``reservation`` naming
the hold (empty when the GPU is free). docs/metrics.md lists them.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, disable_created_metrics
from prometheus_client.core import GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.exposition import generate_latest

from better_compute.api.wire.sections import assignments

from ..version import bcd_version

if TYPE_CHECKING:
    from .agent import NodeAgent

disable_created_metrics()  # type: ignore[no-untyped-call]
NS = "bcd"
GPU_LABELS = ["gpu", "uuid", "model", "pci_bus_id", "node", "pool", "allocation", "reservation"]
_MIB = 1024 * 1024
_GPU_GAUGES = (  # name, help, read from a Gpu, scale
    ("gpu_utilization_ratio", "GPU utilization, 0 to 1 (DCGM_FI_DEV_GPU_UTIL / 100)",
     "utilization_pct", 0.01),
    ("gpu_temperature_celsius", "GPU temperature (DCGM_FI_DEV_GPU_TEMP)", "temperature_c", 1),
    ("gpu_power_watts", "GPU power draw (DCGM_FI_DEV_POWER_USAGE)", "power_w", 1),
    ("gpu_memory_used_bytes", "GPU memory used (DCGM_FI_DEV_FB_USED)", "memory_used_mib", _MIB),
    ("gpu_memory_total_bytes", "GPU memory (DCGM_FI_DEV_FB_USED + FB_FREE)", "memory_mib",
     _MIB),
)


class _Collector:
    def __init__(self, agent: NodeAgent) -> None:
        self.agent = agent

    def collect(self) -> Iterator[Metric]:
        agent = self.agent
        identity = agent.settings.identity
        info = InfoMetricFamily(f"{NS}_build", "bcd's version and its GPU source")
        info.add_metric([], {"version": bcd_version(), "gpu_source": agent.source.name})
        session = GaugeMetricFamily(f"{NS}_session_connected", "1 while the session with the "
                                    "gateway is up", labels=["node", "pool"])
        session.add_metric([identity.node_id, identity.pool_id],
                           1 if agent.session.state == "connected" else 0)
        source = GaugeMetricFamily(f"{NS}_gpu_source_up", "1 when the last GPU read worked")
        source.add_metric([], 0 if agent.source_error else 1)
        yield from (info, session, source)
        yield from self._gpus(identity)

    def _gpus(self, identity: Any) -> Iterator[Metric]:
        agent = self.agent
        reservations = {a.allocation_id: a.reservation_id
                        for a in assignments(agent.state.desired_sections)}
        families = {field: (GaugeMetricFamily(f"{NS}_{name}", text, labels=GPU_LABELS), scale)
                    for name, text, field, scale in _GPU_GAUGES}
        healthy = GaugeMetricFamily(f"{NS}_gpu_healthy", "1 healthy, 0 unhealthy (the "
                                    "reasons are in bcd_gpu_health_reason)", labels=GPU_LABELS)
        held = GaugeMetricFamily(f"{NS}_gpu_held", "1 while an allocation holds the GPU",
                                 labels=GPU_LABELS)
        reasons = GaugeMetricFamily(f"{NS}_gpu_health_reason", "1 for each reason a GPU is "
                                    "unhealthy (ecc-uncorrected, xid-79 …)",
                                    labels=[*GPU_LABELS, "reason"])
        for gpu in agent.inventory.gpus if agent.inventory else []:
            allocation = agent.state.holds.get(gpu.uuid, "")
            labels = [str(gpu.index), gpu.uuid, gpu.name, gpu.pci_bus_id or "", identity.node_id,
                      identity.pool_id, allocation, reservations.get(allocation, "")]
            for field, (family, scale) in families.items():
                value = getattr(gpu, field)
                if value is not None:
                    family.add_metric(labels, value * scale)
            healthy.add_metric(labels, 1 if gpu.is_healthy else 0)
            held.add_metric(labels, 1 if allocation else 0)
            for reason in gpu.health_reasons:
                reasons.add_metric([*labels, reason], 1)
        yield from (family for family, _ in families.values())
        yield from (healthy, held, reasons)


def registry_for(agent: NodeAgent) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector(agent))
    return registry


def render(registry: CollectorRegistry) -> bytes:
    return bytes(generate_latest(registry))
