"""The hardware facts bcd reports when it joins: the machine's identity and its GPUs.

Identity (serial, product UUID, MACs) comes from sysfs under BCD_ROOT
(``sys/class/dmi/id/*``, ``sys/class/net/*/address``); a fake GPU source's
``host`` block, where it sets a field, stands for the machine's own facts. GPUs
come from the GPU source (BCD_GPU_SOURCE).
"""

from __future__ import annotations

from collections.abc import Mapping

from better_compute.api.wire.join import HardwareFacts, HardwareGpu

from .errors import BcdError
from .gpu import GpuSourceError, HostFacts, Inventory, open_source, read_host_facts
from .paths import Paths

SOURCE_ENV = "BCD_GPU_SOURCE"


def read_inventory(paths: Paths, env: Mapping[str, str]) -> Inventory:
    """One read of the GPU source named by BCD_GPU_SOURCE; BcdError with its fix."""
    try:
        source = open_source(env.get(SOURCE_ENV), host_root=str(paths.root))
        try:
            return source.inventory()
        finally:
            source.close()
    except GpuSourceError as exc:
        raise BcdError(f"cannot read the GPUs: {exc}") from None


def _merge(primary: HostFacts, fallback: HostFacts) -> HostFacts:
    return HostFacts(
        serial=primary.serial or fallback.serial,
        product_uuid=primary.product_uuid or fallback.product_uuid,
        macs=primary.macs or fallback.macs,
        cpus=primary.cpus or fallback.cpus,
        memory_gib=primary.memory_gib or fallback.memory_gib,
        hostname=primary.hostname or fallback.hostname,
    )


def hardware_facts(inventory: Inventory, paths: Paths) -> HardwareFacts:
    host = _merge(inventory.host, read_host_facts(str(paths.root)))
    return HardwareFacts(
        serial=host.serial,
        product_uuid=host.product_uuid,
        macs=[mac.lower() for mac in host.macs],
        hostname=host.hostname,
        cpus=host.cpus,
        memory_gib=host.memory_gib,
        gpus=[
            HardwareGpu(
                uuid=gpu.uuid, name=gpu.name, serial=gpu.serial, pci_bus_id=gpu.pci_bus_id,
                memory_mib=gpu.memory_mib, nvlink_domain=gpu.nvlink_domain, healthy=gpu.healthy,
            )
            for gpu in inventory.gpus
        ],
    )


def collect(paths: Paths, env: Mapping[str, str]) -> HardwareFacts:
    return hardware_facts(read_inventory(paths, env), paths)
