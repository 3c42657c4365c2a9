"""agent/gpu/host.py: host identity and size read under a configurable root."""

from __future__ import annotations

import os
from pathlib import Path

from better_compute.agent.gpu import read_host_facts


def _net(root: Path, name: str, mac: str, *, physical: bool) -> None:
    iface = root / "sys/class/net" / name
    iface.mkdir(parents=True)
    (iface / "address").write_text(mac + "\n")
    if physical:
        (iface / "device").mkdir()


def test_reads_dmi_macs_and_memory(tmp_path: Path) -> None:
    dmi = tmp_path / "sys/class/dmi/id"
    dmi.mkdir(parents=True)
    (dmi / "product_serial").write_text("SN-7701\n")
    (dmi / "product_uuid").write_text("4c4c4544-0042-3510-8056-b4c04f4e3232\n")
    _net(tmp_path, "lo", "00:00:00:00:00:00", physical=False)
    _net(tmp_path, "eno1", "B8:3F:D2:11:22:33", physical=True)
    _net(tmp_path, "eno2", "b8:3f:d2:11:22:34", physical=True)
    _net(tmp_path, "docker0", "02:42:ac:11:00:01", physical=False)
    _net(tmp_path, "ib0", "00:00:00:00:00:00", physical=True)
    (tmp_path / "proc/sys/kernel").mkdir(parents=True)
    (tmp_path / "proc/meminfo").write_text("MemTotal:       2113389696 kB\nMemFree: 1 kB\n")
    (tmp_path / "proc/sys/kernel/hostname").write_text("gpu-17\n")

    host = read_host_facts(str(tmp_path))
    assert host.serial == "SN-7701"
    assert host.product_uuid == "4c4c4544-0042-3510-8056-b4c04f4e3232"
    assert host.macs == ["b8:3f:d2:11:22:33", "b8:3f:d2:11:22:34"]
    assert host.memory_gib == 2015.49
    assert host.cpus == os.cpu_count()
    assert host.hostname == "gpu-17"


def test_virtual_interfaces_count_when_there_is_nothing_else(tmp_path: Path) -> None:
    _net(tmp_path, "eth0", "02:42:ac:11:00:02", physical=False)
    assert read_host_facts(str(tmp_path)).macs == ["02:42:ac:11:00:02"]


def test_missing_and_placeholder_facts_are_none(tmp_path: Path) -> None:
    dmi = tmp_path / "sys/class/dmi/id"
    dmi.mkdir(parents=True)
    (dmi / "product_serial").write_text("To Be Filled By O.E.M.\n")
    host = read_host_facts(str(tmp_path))
    assert (host.serial, host.product_uuid, host.memory_gib, host.hostname) == (None,) * 4
    assert host.macs == []
