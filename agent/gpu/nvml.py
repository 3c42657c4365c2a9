"""The NVML GPU source, through NVIDIA's ``pynvml`` binding (the nvidia-ml-py distribution).

The binding is passed in (``nvml``), defaulting to the real ``pynvml`` module, so
tests drive this code with a stand-in that has pynvml's names, constants and
exception classes.
"""

from __future__ import annotations

import ctypes
import importlib
import logging
import uuid as uuidlib
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from .errors import GpuSourceError, GpuSourceUnavailable
from .health import HealthTracker
from .host import read_host_facts
from .model import Gpu, HostFacts, Inventory
from .pci import normalize_pci_bus_id, numa_node
from .xid import XidEvent, XidWatcher

__all__ = ["NvmlSource"]

log = logging.getLogger(__name__)

MIB = 1024 * 1024
# Optional calls that fail with these simply have no value on this GPU or driver.
_ABSENT_ERRORS = ("NVMLError_NotSupported", "NVMLError_NoPermission", "NVMLError_FunctionNotFound")


class _GpuLost(Exception):
    """A call on this GPU answered NVML_ERROR_GPU_IS_LOST."""


def _text(value: Any) -> str | None:
    """Decode a string from the binding (older bindings return bytes); '' is None."""
    if value is None:
        return None
    text = value.decode(errors="replace") if isinstance(value, bytes) else str(value)
    text = text.strip()
    return text or None


@dataclass
class _Read:
    """One GPU's report plus what the NVLink pass needs."""

    gpu: Gpu
    handle: Any = None
    switch: bool = False
    peers: set[str] = field(default_factory=set)


class NvmlSource:
    """GPUs read through NVML, with XID events folded into their health.

    nvmlInit runs once here; every inventory() reads every GPU afresh. Optional
    values a GPU does not support are None. A GPU is unhealthy while it has
    uncorrected volatile ECC errors, retired pages pending, a row-remapping
    failure, a hardware XID within the tracker's window, or is lost.
    """

    name = "nvml"

    def __init__(
        self,
        nvml: ModuleType | Any | None = None,
        *,
        host_root: str = "/",
        tracker: HealthTracker | None = None,
        watch_xids: bool = True,
    ) -> None:
        if nvml is None:
            try:
                nvml = importlib.import_module("pynvml")
            except ImportError as error:
                raise GpuSourceUnavailable(
                    "the pynvml module is missing; install NVIDIA's nvidia-ml-py package"
                ) from error
        self._nvml = nvml
        self.host_root = host_root
        self.tracker = tracker if tracker is not None else HealthTracker()
        self._absent = tuple(getattr(nvml, name) for name in _ABSENT_ERRORS if hasattr(nvml, name))
        self._known: dict[int, Gpu] = {}
        self._closed = True
        try:
            nvml.nvmlInit()
        except nvml.NVMLError_LibraryNotFound as error:
            raise GpuSourceUnavailable(
                f"NVML: {error} (libnvidia-ml.so.1); install the NVIDIA driver"
            ) from error
        except nvml.NVMLError_DriverNotLoaded as error:
            raise GpuSourceUnavailable(
                f"NVML: {error}; load the NVIDIA kernel module (modprobe nvidia) or install the driver"
            ) from error
        except nvml.NVMLError as error:
            raise GpuSourceError(f"NVML failed to initialise: {error}") from error
        self._closed = False
        self._watcher: XidWatcher | None = None
        if watch_xids:
            try:
                self._watcher = XidWatcher(nvml)
            except GpuSourceError as error:
                log.warning("XID events will not be seen: %s", error)

    # -- XIDs -----------------------------------------------------------------

    def watch(self, timeout_ms: int = 0) -> list[XidEvent]:
        """Wait up to ``timeout_ms`` for XID events and record them in the tracker.

        inventory() drains pending events itself; a thread of bcd may call this in
        a loop to see faults as they happen. Application XIDs are returned (to be
        logged) but do not touch health.
        """
        if self._watcher is None or self._closed:
            return []
        events = self._watcher.poll(timeout_ms)
        for event in events:
            self.tracker.record(event.uuid, event.xid)
        return events

    # -- inventory ------------------------------------------------------------

    def inventory(self) -> Inventory:
        if self._closed:
            raise GpuSourceError("the NVML GPU source is closed")
        nvml = self._nvml
        try:
            self.watch(0)
        except GpuSourceError as error:
            log.warning("%s", error)
        try:
            count = nvml.nvmlDeviceGetCount()
        except nvml.NVMLError as error:
            raise GpuSourceError(f"NVML cannot count GPUs: {error}") from error
        host = read_host_facts(self.host_root)
        reads = [self._read(index) for index in range(count)]
        self._assign_local_domains(reads, host)
        return Inventory(
            host=host,
            gpus=[read.gpu for read in reads],
            source=self.name,
            driver_version=_text(self._optional("nvmlSystemGetDriverVersion")),
        )

    def _optional(self, function: str, *args: Any) -> Any:
        """Call an NVML function whose value a GPU may lack; None when it does."""
        nvml = self._nvml
        call = getattr(nvml, function, None)
        if call is None:  # an older binding without this function
            return None
        try:
            return call(*args)
        except self._absent:
            return None
        except nvml.NVMLError_GpuIsLost as error:
            raise _GpuLost from error
        except nvml.NVMLError as error:
            log.warning("%s failed: %s", function, error)
            return None

    def _read(self, index: int) -> _Read:
        nvml = self._nvml
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            uuid = _text(nvml.nvmlDeviceGetUUID(handle))
            name = _text(nvml.nvmlDeviceGetName(handle))
        except nvml.NVMLError as error:
            lost = isinstance(error, nvml.NVMLError_GpuIsLost)
            log.warning("GPU %d cannot be read: %s", index, error)
            return _Read(self._unreachable(index, "gpu-lost" if lost else "nvml-error"))
        if uuid is None or name is None:
            return _Read(self._unreachable(index, "nvml-error"))
        try:
            return _Read(self._read_gpu(index, handle, uuid, name), handle)
        except _GpuLost:
            return _Read(self._unreachable(index, "gpu-lost", uuid=uuid, name=name))

    def _read_gpu(self, index: int, handle: Any, uuid: str, name: str) -> Gpu:
        nvml = self._nvml
        pci = self._optional("nvmlDeviceGetPciInfo", handle)
        memory = self._optional("nvmlDeviceGetMemoryInfo", handle)
        utilization = self._optional("nvmlDeviceGetUtilizationRates", handle)
        temperature = self._optional("nvmlDeviceGetTemperature", handle, nvml.NVML_TEMPERATURE_GPU)
        power_mw = self._optional("nvmlDeviceGetPowerUsage", handle)
        bus_id = normalize_pci_bus_id(_text(pci.busId)) if pci is not None else None
        gpu = Gpu(
            index=index,
            uuid=uuid,
            name=name,
            serial=_text(self._optional("nvmlDeviceGetSerial", handle)),
            pci_bus_id=bus_id,
            numa_node=numa_node(self.host_root, bus_id),
            memory_mib=int(memory.total) // MIB if memory is not None else None,
            memory_used_mib=int(memory.used) // MIB if memory is not None else None,
            utilization_pct=int(utilization.gpu) if utilization is not None else None,
            temperature_c=int(temperature) if temperature is not None else None,
            power_w=round(int(power_mw) / 1000, 3) if power_mw is not None else None,
            nvlink_domain=self._fabric_domain(handle),
            product=_text(self._optional("nvmlDeviceGetBoardPartNumber", handle)) or name,
        )
        self._known[index] = gpu
        return self._with_health(gpu, self._device_faults(handle))

    def _device_faults(self, handle: Any) -> list[str]:
        nvml = self._nvml
        faults: list[str] = []
        ecc = self._optional(
            "nvmlDeviceGetTotalEccErrors",
            handle,
            nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
            nvml.NVML_VOLATILE_ECC,
        )
        if ecc is not None and int(ecc) > 0:
            faults.append("ecc-uncorrected")
        pending = self._optional("nvmlDeviceGetRetiredPagesPendingStatus", handle)
        if pending == nvml.NVML_FEATURE_ENABLED:
            faults.append("retired-pages-pending")
        rows = self._optional("nvmlDeviceGetRemappedRows", handle)
        if rows is not None and int(rows[3]):  # (corrected, uncorrected, pending, failure)
            faults.append("remapped-rows-failure")
        return faults

    def _with_health(self, gpu: Gpu, faults: list[str]) -> Gpu:
        reasons = [*faults, *self.tracker.reasons(gpu.uuid)]
        gpu.healthy = not reasons
        gpu.health_reasons = reasons
        return gpu

    def _unreachable(
        self, index: int, reason: str, *, uuid: str | None = None, name: str | None = None
    ) -> Gpu:
        """Report a GPU NVML cannot read, under the identity it had when last read.

        It stays in the report (unhealthy) rather than vanishing, so the server
        sees a broken GPU instead of a host that shrank. A GPU never read before
        gets a placeholder UUID.
        """
        known = self._known.get(index)
        gpu = Gpu(
            index=index,
            uuid=uuid or (known.uuid if known else f"unknown-gpu-{index}"),
            name=name or (known.name if known else "unknown"),
            serial=known.serial if known else None,
            pci_bus_id=known.pci_bus_id if known else None,
            memory_mib=known.memory_mib if known else None,
            product=known.product if known else None,
        )
        return self._with_health(gpu, [reason])

    # -- NVLink domains -------------------------------------------------------

    def _fabric_domain(self, handle: Any) -> str | None:
        """``<cluster uuid>/<clique id>`` from GPU fabric info (multi-node NVLink, e.g. GB200 NVL72)."""
        nvml = self._nvml
        info_type = getattr(nvml, "c_nvmlGpuFabricInfoV_t", None)
        if info_type is None:
            return None
        info = info_type()
        if self._optional("nvmlDeviceGetGpuFabricInfoV", handle, ctypes.byref(info)) is None:
            return None
        if info.state != nvml.NVML_GPU_FABRIC_STATE_COMPLETED or info.status != nvml.NVML_SUCCESS:
            return None
        cluster = bytes(info.clusterUuid)
        if not any(cluster):  # all zero: the GPU is not part of a multi-node fabric
            return None
        return f"{uuidlib.UUID(bytes=cluster)}/{int(info.cliqueId)}"

    def _nvlink_peers(self, read: _Read, gpu_bus_ids: set[str]) -> None:
        """Fill ``read.switch``/``read.peers`` from the GPU's active NVLinks."""
        nvml = self._nvml
        for link in range(int(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18))):
            # Past the GPU's last link, or on a GPU without NVLink, this fails; skip.
            if self._optional("nvmlDeviceGetNvLinkState", read.handle, link) != (
                nvml.NVML_FEATURE_ENABLED
            ):
                continue
            remote = self._optional("nvmlDeviceGetNvLinkRemotePciInfo", read.handle, link)
            remote_bus = normalize_pci_bus_id(_text(remote.busId)) if remote is not None else None
            if remote_bus is not None and remote_bus in gpu_bus_ids:
                read.peers.add(remote_bus)
                continue
            kind = self._optional("nvmlDeviceGetNvLinkRemoteDeviceType", read.handle, link)
            if kind == getattr(nvml, "NVML_NVLINK_DEVICE_TYPE_SWITCH", None):
                read.switch = True

    def _assign_local_domains(self, reads: list[_Read], host: HostFacts) -> None:
        """Give GPUs joined by NVLink inside this host a shared domain.

        Single-host NVLink (an HGX board's NVSwitches, or bridged PCIe pairs) has
        no fabric cluster UUID, yet its GPUs form one NVLink domain. GPUs on the
        host's NVSwitches share ``<host>/nvswitch``; GPUs linked directly share
        ``<host>/nvlink-<lowest bus id>``. GPUs that already have a fabric domain
        keep it; a GPU with no active NVLink has none.
        """
        host_key = host.product_uuid or host.serial or host.hostname
        pending = [read for read in reads if read.handle is not None and not read.gpu.nvlink_domain]
        if host_key is None or not pending:
            return
        gpu_bus_ids = {read.gpu.pci_bus_id for read in reads if read.gpu.pci_bus_id}
        for read in pending:
            try:
                self._nvlink_peers(read, gpu_bus_ids)
            except _GpuLost:
                read.gpu = self._unreachable(read.gpu.index, "gpu-lost")
                read.handle = None
        by_bus = {read.gpu.pci_bus_id: read for read in pending if read.gpu.pci_bus_id}
        parent: dict[int, int] = {id(read): id(read) for read in pending}

        def root(key: int) -> int:
            while parent[key] != key:
                parent[key] = parent[parent[key]]
                key = parent[key]
            return key

        def join(a: _Read, b: _Read) -> None:
            parent[root(id(a))] = root(id(b))

        switched = [read for read in pending if read.switch]
        for read in switched[1:]:
            join(read, switched[0])
        for read in pending:
            for bus in read.peers:
                if bus in by_bus:
                    join(read, by_bus[bus])
        groups: dict[int, list[_Read]] = {}
        for read in pending:
            groups.setdefault(root(id(read)), []).append(read)
        for members in groups.values():
            if any(member.switch for member in members):
                domain = f"{host_key}/nvswitch"
            elif len(members) > 1:
                lowest = min(member.gpu.pci_bus_id or "" for member in members)
                domain = f"{host_key}/nvlink-{lowest}"
            else:
                continue
            for member in members:
                if member.handle is not None:
                    member.gpu.nvlink_domain = domain

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._watcher is not None:
            self._watcher.close()
        try:
            self._nvml.nvmlShutdown()
        except self._nvml.NVMLError as error:
            log.debug("nvmlShutdown failed: %s", error)
