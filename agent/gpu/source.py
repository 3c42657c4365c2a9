"""The GPU source protocol and the choice among its implementations.

bcd reads GPUs through one small interface with three implementations (NVML,
nvidia-smi, a fake file), the way an HTTP client swaps only its transport. The
rest of the agent never knows which one it has.
"""

from __future__ import annotations

import shutil
from typing import Protocol, runtime_checkable

from . import fake, nvml, smi
from .errors import GpuSourceError, GpuSourceUnavailable
from .model import Inventory

__all__ = ["GpuSource", "GpuSourceError", "GpuSourceUnavailable", "open_source"]

FAKE_PREFIX = "fake:"
SPECS = ("nvml", "nvidia-smi", "fake:FILE")


@runtime_checkable
class GpuSource(Protocol):
    """Where bcd reads its GPUs from."""

    name: str

    def inventory(self) -> Inventory:
        """Read the host and every GPU afresh (nothing is cached between calls)."""
        ...

    def close(self) -> None:
        """Release what the source holds (NVML handles, event sets)."""
        ...


def open_source(spec: str | None, *, host_root: str = "/") -> GpuSource:
    """Open the source named by BCD_GPU_SOURCE.

    ``nvml``, ``nvidia-smi`` and ``fake:FILE`` pick one; None or "" means NVML,
    then nvidia-smi when NVML is absent (library not found, driver not loaded).
    A source that exists but fails is reported, never silently replaced.
    """
    choice = (spec or "").strip()
    if choice.startswith(FAKE_PREFIX):
        path = choice[len(FAKE_PREFIX) :]
        if not path:
            raise GpuSourceError(
                "BCD_GPU_SOURCE=fake: needs a file, e.g. BCD_GPU_SOURCE=fake:/etc/bcd/gpus.json"
            )
        return fake.FakeSource(path)
    if choice == "nvml":
        return nvml.NvmlSource(host_root=host_root)
    if choice == "nvidia-smi":
        return smi.NvidiaSmiSource(host_root=host_root)
    if choice:
        raise GpuSourceError(
            f"BCD_GPU_SOURCE={choice!r} is not a GPU source; use one of: {', '.join(SPECS)}"
        )
    try:
        return nvml.NvmlSource(host_root=host_root)
    except GpuSourceUnavailable as nvml_error:
        if shutil.which(smi.NVIDIA_SMI) is not None:
            return smi.NvidiaSmiSource(host_root=host_root)
        raise GpuSourceUnavailable(
            f"no GPU source found: NVML is unavailable ({nvml_error}) and {smi.NVIDIA_SMI} "
            "is not on PATH. On a GPU server install the NVIDIA driver (it provides "
            "libnvidia-ml.so.1 and nvidia-smi) and load its kernel module; to simulate a "
            "node without GPUs set BCD_GPU_SOURCE=fake:FILE (see write_fake_fleet_file)."
        ) from nvml_error
