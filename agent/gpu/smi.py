"""The nvidia-smi GPU source: the fallback when NVML cannot be loaded from Python."""

from __future__ import annotations

import csv
import logging
import shutil
import subprocess
from collections.abc import Callable, Sequence

from .errors import GpuSourceError, GpuSourceUnavailable
from .host import read_host_facts
from .model import Gpu, Inventory
from .pci import normalize_pci_bus_id, numa_node

__all__ = ["NVIDIA_SMI", "QUERY_FIELDS", "NvidiaSmiSource", "parse_query_gpu"]

log = logging.getLogger(__name__)

NVIDIA_SMI = "nvidia-smi"
TIMEOUT_S = 10.0
# driver_version rides along at the end so one run also gives the driver.
QUERY_FIELDS: tuple[str, ...] = (
    "index",
    "uuid",
    "name",
    "serial",
    "pci.bus_id",
    "memory.total",
    "memory.used",
    "utilization.gpu",
    "temperature.gpu",
    "power.draw",
    "ecc.errors.uncorrected.volatile.total",
    "driver_version",
)
ARGV: tuple[str, ...] = (
    NVIDIA_SMI,
    f"--query-gpu={','.join(QUERY_FIELDS)}",
    "--format=csv,noheader,nounits",
)

Run = Callable[[Sequence[str]], str]


def run_nvidia_smi(argv: Sequence[str]) -> str:
    """Run nvidia-smi and return its standard output.

    A non-zero exit with rows on stdout still returns them: nvidia-smi exits
    non-zero when one GPU is unreadable but prints the others.
    """
    try:
        done = subprocess.run(
            list(argv), capture_output=True, text=True, timeout=TIMEOUT_S, check=False
        )
    except FileNotFoundError as error:
        raise GpuSourceUnavailable(
            f"{argv[0]} is not installed or not on PATH; install the NVIDIA driver utilities, "
            "or set BCD_GPU_SOURCE=fake:FILE to simulate GPUs"
        ) from error
    except subprocess.TimeoutExpired as error:
        raise GpuSourceError(f"{argv[0]} did not answer within {TIMEOUT_S:g} s") from error
    except OSError as error:
        raise GpuSourceError(f"cannot run {argv[0]}: {error.strerror}") from error
    if done.returncode != 0 and not done.stdout.strip():
        detail = (done.stderr or done.stdout).strip() or f"exit status {done.returncode}"
        raise GpuSourceError(f"{argv[0]} failed: {detail}")
    return done.stdout


def _missing(value: str) -> bool:
    # "[N/A]", "[Not Supported]", "[Unknown Error]", "[GPU requires reset]", ...
    return not value or value == "N/A" or (value.startswith("[") and value.endswith("]"))


def _text(value: str) -> str | None:
    return None if _missing(value) else value


def _float(value: str, field: str, line: str) -> float | None:
    if _missing(value):
        return None
    try:
        return float(value)
    except ValueError:
        raise GpuSourceError(
            f"nvidia-smi printed {value!r} for {field}, not a number, in line {line!r}"
        ) from None


def _int(value: str, field: str, line: str) -> int | None:
    number = _float(value, field, line)
    return None if number is None else int(number)


def parse_query_gpu(output: str) -> tuple[list[Gpu], str | None]:
    """Parse ``--query-gpu`` CSV (noheader, nounits) into GPUs and the driver version.

    Lines that are not rows (nvidia-smi prints its complaints about an
    unreadable GPU on stdout) are logged and skipped.
    """
    gpus: list[Gpu] = []
    driver: str | None = None
    for line in output.splitlines():
        if not line.strip():
            continue
        row = next(csv.reader([line], skipinitialspace=True))
        values = [value.strip() for value in row]
        # Rows without the trailing driver_version (the plain query) are read too.
        if len(values) not in (len(QUERY_FIELDS), len(QUERY_FIELDS) - 1):
            log.warning("skipping nvidia-smi line that is not a GPU row: %r", line)
            continue
        field = dict(zip(QUERY_FIELDS, values, strict=False))
        index = _int(field["index"], "index", line)
        uuid = _text(field["uuid"])
        if index is None or uuid is None:
            log.warning("skipping nvidia-smi row without index or uuid: %r", line)
            continue
        ecc = _int(field["ecc.errors.uncorrected.volatile.total"], "ecc", line)
        reasons = ["ecc-uncorrected"] if ecc else []
        gpus.append(
            Gpu(
                index=index,
                uuid=uuid,
                name=_text(field["name"]) or "unknown",
                serial=_text(field["serial"]),
                pci_bus_id=normalize_pci_bus_id(_text(field["pci.bus_id"])),
                memory_mib=_int(field["memory.total"], "memory.total", line),
                memory_used_mib=_int(field["memory.used"], "memory.used", line),
                utilization_pct=_int(field["utilization.gpu"], "utilization.gpu", line),
                temperature_c=_int(field["temperature.gpu"], "temperature.gpu", line),
                power_w=_float(field["power.draw"], "power.draw", line),
                healthy=not reasons,
                health_reasons=reasons,
            )
        )
        driver = driver or _text(field.get("driver_version", ""))
    gpus.sort(key=lambda gpu: gpu.index)
    return gpus, driver


class NvidiaSmiSource:
    """GPUs read by running nvidia-smi on every inventory().

    It sees no NVLink domains, XIDs, retired pages or row remapping; health is
    uncorrected volatile ECC errors only. Prefer NVML where it loads.
    """

    name = "nvidia-smi"

    def __init__(self, run: Run | None = None, *, host_root: str = "/") -> None:
        if run is None and shutil.which(NVIDIA_SMI) is None:
            raise GpuSourceUnavailable(
                f"{NVIDIA_SMI} is not on PATH; install the NVIDIA driver utilities, "
                "or set BCD_GPU_SOURCE=fake:FILE to simulate GPUs"
            )
        self._run: Run = run if run is not None else run_nvidia_smi
        self.host_root = host_root

    def inventory(self) -> Inventory:
        gpus, driver = parse_query_gpu(self._run(ARGV))
        for gpu in gpus:
            gpu.numa_node = numa_node(self.host_root, gpu.pci_bus_id)
        return Inventory(
            host=read_host_facts(self.host_root),
            gpus=gpus,
            source=self.name,
            driver_version=driver,
        )

    def close(self) -> None:
        """Nothing to release."""
