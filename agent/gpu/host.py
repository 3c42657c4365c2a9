"""Host facts read from sysfs and procfs (under a configurable root for tests)."""

from __future__ import annotations

import os
import socket
from pathlib import Path

from .model import HostFacts

_ZERO_MAC = "00:00:00:00:00:00"


def _read_text(path: Path) -> str | None:
    try:
        text = path.read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return None
    return text or None


def _dmi(root: Path, name: str) -> str | None:
    value = _read_text(root / "sys/class/dmi/id" / name)
    # Vendors leave placeholders in unset DMI fields; they identify nothing.
    if value is None or value.lower() in {"to be filled by o.e.m.", "default string", "none"}:
        return None
    return value


def read_macs(root: Path) -> list[str]:
    """MAC addresses of the host's network interfaces, sorted.

    Skips loopback and all-zero addresses. When some interfaces are backed by a
    device (``/sys/class/net/X/device`` exists) only those are kept, so bridges,
    veths and bonds, whose addresses change between boots, do not make the same
    machine look new.
    """
    net = root / "sys/class/net"
    try:
        names = sorted(entry.name for entry in net.iterdir())
    except OSError:
        return []
    physical: set[str] = set()
    other: set[str] = set()
    for name in names:
        if name == "lo":
            continue
        mac = _read_text(net / name / "address")
        if mac is None or mac.lower() == _ZERO_MAC:
            continue
        (physical if (net / name / "device").exists() else other).add(mac.lower())
    return sorted(physical or other)


def read_memory_gib(root: Path) -> float | None:
    text = _read_text(root / "proc/meminfo")
    if text is None:
        return None
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if key == "MemTotal":
            fields = rest.split()
            try:
                kib = int(fields[0])
            except (IndexError, ValueError):
                return None
            return round(kib / (1024 * 1024), 2)
    return None


def read_hostname(root: Path) -> str | None:
    name = _read_text(root / "proc/sys/kernel/hostname")
    if name is None and root == Path("/"):
        name = socket.gethostname() or None
    return name


def read_host_facts(host_root: str | os.PathLike[str] = "/") -> HostFacts:
    """Read the host's identity and size; anything missing or unreadable is None."""
    root = Path(host_root)
    return HostFacts(
        serial=_dmi(root, "product_serial"),
        product_uuid=_dmi(root, "product_uuid"),
        macs=read_macs(root),
        cpus=os.cpu_count(),
        memory_gib=read_memory_gib(root),
        hostname=read_hostname(root),
    )
