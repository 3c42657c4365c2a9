"""agent/gpu/smi.py: GPUs read from nvidia-smi's CSV query output."""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from pathlib import Path

import pytest

from better_compute.agent.gpu import GpuSourceError, GpuSourceUnavailable, NvidiaSmiSource, smi

# What an HGX H100 host prints (noheader, nounits); GPU 2 lacks some readings,
# GPU 5 has uncorrected ECC errors, GPU 7 reports power as plain N/A.
H100_OUTPUT = """\
0, GPU-b7ae4e3a-0b6e-2f2b-3c8a-4f1f0a0e5a01, NVIDIA H100 80GB HBM3, 1654922010011, 00000000:18:00.0, 81559, 0, 0, 31, 69.84, 0, 570.133.20
1, GPU-b7ae4e3a-0b6e-2f2b-3c8a-4f1f0a0e5a02, NVIDIA H100 80GB HBM3, 1654922010012, 00000000:2A:00.0, 81559, 40210, 97, 64, 611.20, 0, 570.133.20
2, GPU-b7ae4e3a-0b6e-2f2b-3c8a-4f1f0a0e5a03, NVIDIA H100 80GB HBM3, [Not Supported], 00000000:3A:00.0, 81559, 0, [N/A], [N/A], [N/A], [N/A], 570.133.20
3, GPU-b7ae4e3a-0b6e-2f2b-3c8a-4f1f0a0e5a04, NVIDIA H100 80GB HBM3, 1654922010014, 00000000:5D:00.0, 81559, 0, 0, 30, 70.01, 0, 570.133.20
4, GPU-b7ae4e3a-0b6e-2f2b-3c8a-4f1f0a0e5a05, NVIDIA H100 80GB HBM3, 1654922010015, 00000000:9A:00.0, 81559, 0, 0, 29, 68.90, 0, 570.133.20
5, GPU-b7ae4e3a-0b6e-2f2b-3c8a-4f1f0a0e5a06, NVIDIA H100 80GB HBM3, 1654922010016, 00000000:AB:00.0, 81559, 0, 0, 33, 71.45, 2, 570.133.20
6, GPU-b7ae4e3a-0b6e-2f2b-3c8a-4f1f0a0e5a07, NVIDIA H100 80GB HBM3, 1654922010017, 00000000:BA:00.0, 81559, 0, 0, 32, 69.12, 0, 570.133.20
7, GPU-b7ae4e3a-0b6e-2f2b-3c8a-4f1f0a0e5a08, NVIDIA H100 80GB HBM3, 1654922010018, 00000000:DB:00.0, 81559, 0, 0, 31, N/A, 0, 570.133.20
"""


class Recorder:
    def __init__(self, output: str) -> None:
        self.output = output
        self.argv: list[Sequence[str]] = []

    def __call__(self, argv: Sequence[str]) -> str:
        self.argv.append(argv)
        return self.output


def test_parses_an_eight_gpu_host(tmp_path: Path) -> None:
    run = Recorder(H100_OUTPUT)
    inventory = NvidiaSmiSource(run, host_root=str(tmp_path)).inventory()

    assert inventory.source == "nvidia-smi" and inventory.driver_version == "570.133.20"
    assert run.argv[0][0] == "nvidia-smi"
    assert run.argv[0][1].startswith(
        "--query-gpu=index,uuid,name,serial,pci.bus_id,memory.total,memory.used,"
        "utilization.gpu,temperature.gpu,power.draw,ecc.errors.uncorrected.volatile.total"
    )
    assert run.argv[0][2] == "--format=csv,noheader,nounits"
    assert [gpu.index for gpu in inventory.gpus] == list(range(8))
    first, busy = inventory.gpus[0], inventory.gpus[1]
    assert first.uuid == "GPU-b7ae4e3a-0b6e-2f2b-3c8a-4f1f0a0e5a01"
    assert (first.name, first.family, first.serial) == (
        "NVIDIA H100 80GB HBM3",
        "H100",
        "1654922010011",
    )
    assert first.pci_bus_id == "0000:18:00.0" and busy.pci_bus_id == "0000:2a:00.0"
    assert (busy.memory_mib, busy.memory_used_mib, busy.utilization_pct) == (81559, 40210, 97)
    assert busy.temperature_c == 64 and busy.power_w == pytest.approx(611.2)
    assert first.nvlink_domain is None


def test_not_available_values_are_none(tmp_path: Path) -> None:
    gpus = NvidiaSmiSource(Recorder(H100_OUTPUT), host_root=str(tmp_path)).inventory().gpus
    partial = gpus[2]
    assert partial.serial is None
    assert partial.utilization_pct is None and partial.temperature_c is None
    assert partial.power_w is None and gpus[7].power_w is None
    assert partial.memory_mib == 81559
    assert partial.healthy  # unknown ECC is not a fault


def test_uncorrected_ecc_is_unhealthy(tmp_path: Path) -> None:
    gpus = NvidiaSmiSource(Recorder(H100_OUTPUT), host_root=str(tmp_path)).inventory().gpus
    assert (gpus[5].healthy, gpus[5].health_reasons) == (False, ["ecc-uncorrected"])
    assert [gpu.index for gpu in gpus if not gpu.healthy] == [5]


def test_rows_of_the_plain_query_and_noise_lines(tmp_path: Path) -> None:
    output = (
        "Unable to determine the device handle for GPU0000:DB:00.0: Unknown Error\n"
        "\n"
        "0, GPU-aaaa, NVIDIA L40S, 1322, 00000000:01:00.0, 46068, 1, 0, 25, 33.1, 0\n"
    )
    inventory = NvidiaSmiSource(Recorder(output), host_root=str(tmp_path)).inventory()
    assert [(gpu.uuid, gpu.family) for gpu in inventory.gpus] == [("GPU-aaaa", "L40S")]
    assert inventory.driver_version is None


def test_a_value_that_is_not_a_number_is_an_error(tmp_path: Path) -> None:
    output = H100_OUTPUT.replace("81559, 40210", "81559, lots", 1)
    with pytest.raises(GpuSourceError, match=r"'lots' for memory.used"):
        NvidiaSmiSource(Recorder(output), host_root=str(tmp_path)).inventory()


def test_missing_binary_is_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shutil, "which", lambda name: None)  # smi.py looks nvidia-smi up with it
    with pytest.raises(GpuSourceUnavailable, match="BCD_GPU_SOURCE=fake:FILE"):
        NvidiaSmiSource()
    with pytest.raises(GpuSourceUnavailable, match="not installed or not on PATH"):
        smi.run_nvidia_smi(["/nonexistent/bin/nvidia-smi", "--query-gpu=index"])


def _script(tmp_path: Path, body: str) -> str:
    path = tmp_path / "nvidia-smi"
    path.write_text(f"#!/bin/sh\n{body}\n")
    os.chmod(path, 0o755)
    return str(path)


def test_failing_nvidia_smi_reports_its_complaint(tmp_path: Path) -> None:
    script = _script(
        tmp_path,
        'echo "NVIDIA-SMI has failed because it couldn\'t communicate with the NVIDIA driver." >&2\n'
        "exit 9",
    )
    with pytest.raises(GpuSourceError, match="couldn't communicate with the NVIDIA driver"):
        smi.run_nvidia_smi([script])


def test_rows_printed_despite_a_failing_exit_are_kept(tmp_path: Path) -> None:
    script = _script(
        tmp_path, "echo '0, GPU-a, NVIDIA H100, 1, 0000:18:00.0, 1, 0, 0, 1, 1, 0'\nexit 15"
    )
    assert "GPU-a" in smi.run_nvidia_smi([script])
