"""What a GPU source reports: the wire messages from agent to server.

Field names are camelCase on the wire. Decoding ignores unknown fields so an
older server can read a newer agent's report and the other way round.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from .family import gpu_family

__all__ = ["Gpu", "HostFacts", "Inventory", "gpu_family"]


class Gpu(msgspec.Struct, rename="camel", kw_only=True):
    """One GPU as a source sees it now.

    ``product`` is the board part number when the card reports one, else its
    name; ``family`` (H100, L40S, ...) is derived from the name when not given.
    A GPU is unhealthy when any reason is listed; ``healthReasons`` uses short
    codes such as ``ecc-uncorrected``, ``gpu-lost`` or ``xid-79``.
    """

    index: Annotated[int, msgspec.Meta(ge=0)]
    uuid: Annotated[str, msgspec.Meta(min_length=1)]
    name: str
    serial: str | None = None
    pci_bus_id: str | None = None
    memory_mib: int | None = msgspec.field(default=None, name="memoryMiB")
    memory_used_mib: int | None = msgspec.field(default=None, name="memoryUsedMiB")
    utilization_pct: int | None = None
    temperature_c: int | None = None
    power_w: float | None = None
    nvlink_domain: str | None = None
    numa_node: int | None = None  # the NUMA node of its PCI device (sysfs), when known
    healthy: bool = True
    health_reasons: list[str] = msgspec.field(default_factory=list)
    product: str | None = None
    family: str | None = None

    def __post_init__(self) -> None:
        if self.product is None:
            self.product = self.name
        if self.family is None:
            self.family = gpu_family(self.name)


class HostFacts(msgspec.Struct, rename="camel", kw_only=True):
    """Facts that identify the machine and size its CPUs and memory."""

    serial: str | None = None
    product_uuid: str | None = None
    macs: list[str] = msgspec.field(default_factory=list)
    cpus: int | None = None
    memory_gib: float | None = msgspec.field(default=None, name="memoryGiB")
    hostname: str | None = None


class Inventory(msgspec.Struct, rename="camel", kw_only=True):
    """One full read of a node: the host, every GPU, and which source read them."""

    host: HostFacts
    gpus: list[Gpu]
    source: str
    driver_version: str | None = None
