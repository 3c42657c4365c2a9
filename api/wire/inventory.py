"""What a GPU source reports, as bcd sends it in a Report (api/wire/gateway.py): the
inventory (host facts and every GPU) and the telemetry of each GPU.

Field names are camelCase on the wire. Decoding ignores unknown fields so an
older server can read a newer agent's report and the other way round. The
gateway decodes them once, on arrival; what it keeps of them is typed from there.
Every string and list is bounded (api/wire/bounds.py).
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from .bounds import MAX_GPUS, Id, Macs, Name, NonEmptyId, Version
from .gpu_family import gpu_family

__all__ = ["Gpu", "GpuTelemetry", "HostFacts", "Inventory", "Telemetry", "gpu_family"]


class Gpu(msgspec.Struct, rename="camel", kw_only=True):
    """One GPU as a source sees it now.

    ``product`` is the board part number when the card reports one, else its
    name; ``family`` (H100, L40S, ...) is derived from the name when not given.
    A GPU is unhealthy when any reason is listed; ``healthReasons`` uses short
    codes such as ``ecc-uncorrected``, ``gpu-lost`` or ``xid-79``.
    """

    index: Annotated[int, msgspec.Meta(ge=0)]
    uuid: NonEmptyId
    name: Name
    serial: Id | None = None
    pci_bus_id: Id | None = None
    memory_mib: int | None = msgspec.field(default=None, name="memoryMiB")
    memory_used_mib: int | None = msgspec.field(default=None, name="memoryUsedMiB")
    utilization_pct: int | None = None
    temperature_c: int | None = None
    power_w: float | None = None
    nvlink_domain: Name | None = None
    numa_node: int | None = None  # the NUMA node of its PCI device (sysfs), when known
    healthy: bool = True
    health_reasons: Annotated[list[Name], msgspec.Meta(max_length=32)] = \
        msgspec.field(default_factory=list)
    product: Name | None = None
    family: Name | None = None

    def __post_init__(self) -> None:
        if self.product is None:
            self.product = self.name
        if self.family is None:
            self.family = gpu_family(self.name)

    @property
    def is_healthy(self) -> bool:
        """Not reported unhealthy AND no reason listed: the rule of domain/gpus.py ``Gpu.healthy``
        (bcd cannot import the domain; tests/unit/test_gpu_value.py holds the two equal)."""
        return self.healthy and not self.health_reasons

    @property
    def why_unhealthy(self) -> str:
        """Its reasons as operators read them (``xid-79, ecc-uncorrected``)."""
        return ", ".join(self.health_reasons) or "unhealthy"


class HostFacts(msgspec.Struct, rename="camel", kw_only=True):
    """Facts that identify the machine and size its CPUs and memory."""

    serial: Id | None = None
    product_uuid: Id | None = None
    macs: Macs = msgspec.field(default_factory=list)
    cpus: int | None = None
    memory_gib: float | None = msgspec.field(default=None, name="memoryGiB")
    hostname: Name | None = None


class Inventory(msgspec.Struct, rename="camel", kw_only=True):
    """One full read of a node: the host, every GPU, and which source read them."""

    host: HostFacts
    gpus: Annotated[list[Gpu], msgspec.Meta(max_length=MAX_GPUS)]
    source: Name
    driver_version: Version | None = None


Number = int | float  # telemetry as the source read it: kept as sent (90 stays 90, 600.5 stays)


class GpuTelemetry(msgspec.Struct, rename="camel", kw_only=True):
    """One GPU's readings at ``Telemetry.time``."""

    uuid: Id
    utilization_pct: Number | None = None
    temperature_c: Number | None = None
    power_w: Number | None = None
    memory_used_mib: Number | None = msgspec.field(default=None, name="memoryUsedMiB")
    memory_mib: Number | None = msgspec.field(default=None, name="memoryMiB")
    healthy: bool = True

    @classmethod
    def of(cls, gpu: Gpu) -> GpuTelemetry:
        return cls(uuid=gpu.uuid, utilization_pct=gpu.utilization_pct,
                   temperature_c=gpu.temperature_c, power_w=gpu.power_w,
                   memory_used_mib=gpu.memory_used_mib, memory_mib=gpu.memory_mib,
                   healthy=gpu.healthy)


class Telemetry(msgspec.Struct, rename="camel", kw_only=True):
    """The readings of every GPU, read at ``time`` (RFC 3339, the node's clock)."""

    time: Name | None = None
    gpus: Annotated[list[GpuTelemetry], msgspec.Meta(max_length=MAX_GPUS)] = \
        msgspec.field(default_factory=list)

    @classmethod
    def of(cls, inventory: Inventory, time: str | None) -> Telemetry:
        return cls(time=time, gpus=[GpuTelemetry.of(gpu) for gpu in inventory.gpus])
