"""PCI bus id spelling."""

from __future__ import annotations

import os
from pathlib import Path


def normalize_pci_bus_id(bus_id: str | bytes | None) -> str | None:
    """Return the sysfs spelling of a PCI bus id, e.g. ``0000:18:00.0``.

    NVML and nvidia-smi print an 8-digit upper-case domain (``00000000:1B:00.0``)
    while sysfs, lspci and CDI specs use 4 lower-case digits. One spelling lets
    bcd match a GPU to its /dev/dri nodes and to the vendor CDI spec.
    """
    if bus_id is None:
        return None
    text = bus_id.decode() if isinstance(bus_id, bytes) else bus_id
    text = text.strip().lower()
    if not text:
        return None
    domain, sep, rest = text.partition(":")
    if sep and rest.count(":") == 1 and len(domain) == 8 and domain.startswith("0000"):
        return f"{domain[4:]}:{rest}"
    return text


def numa_node(host_root: str | os.PathLike[str], bus_id: str | None) -> int | None:
    """The NUMA node sysfs gives the PCI device (``-1`` or unreadable: None, unknown)."""
    if not bus_id:
        return None
    path = Path(host_root) / "sys/bus/pci/devices" / bus_id / "numa_node"
    try:
        value = int(path.read_text().strip())
    except (OSError, ValueError):
        return None
    return value if value >= 0 else None
