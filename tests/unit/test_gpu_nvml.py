"""agent/gpu/nvml.py, xid.py, health.py: NVML read through pynvml's real API shape.

FakeNvml stands in for the ``pynvml`` module: its public names are pynvml's
function names (with pynvml's parameter names), its constants and exception
classes ARE pynvml's, and its structs are pynvml's ctypes structs. A test below
checks every public name against the real module so the fake cannot drift.
"""

from __future__ import annotations

import ctypes
import inspect
import uuid as uuidlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pynvml
import pytest

from better_compute.agent.gpu import (
    APPLICATION_XIDS,
    GpuSource,
    GpuSourceError,
    GpuSourceUnavailable,
    HealthTracker,
    NvmlSource,
    XidEvent,
    XidWatcher,
)

MIB = 1024 * 1024
H100 = "NVIDIA H100 80GB HBM3"
HGX_BUS = ["18", "2A", "3A", "5D", "9A", "AB", "BA", "DB"]


@dataclass
class FakeDevice:
    """One GPU behind FakeNvml. ``fails`` maps a pynvml function name to the error it raises."""

    index: int
    uuid: str = ""
    name: str | bytes = H100
    serial: str = ""
    part: str = "692-2G520-0200-000"
    bus: str = ""
    total_bytes: int = 81559 * MIB
    used_bytes: int = 1024 * MIB + 512
    util: int = 57
    temp_c: int = 31
    power_mw: int = 69841
    ecc_uncorrected: int = 0
    pages_pending: bool = False
    rows: tuple[int, int, int, int] = (0, 0, 0, 0)
    fabric: tuple[bytes, int] | None = None  # (cluster uuid, clique id)
    links: list[tuple[int, str]] = field(default_factory=list)  # (remote type, remote bus id)
    fails: dict[str, type[pynvml.NVMLError]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.uuid = self.uuid or f"GPU-{uuidlib.UUID(int=0xA1B2 << 64 | self.index)}"
        self.serial = self.serial or f"16549230{self.index:05d}"
        self.bus = self.bus or f"00000000:{HGX_BUS[self.index % 8]}:00.0"


def _handle(index: int) -> Any:
    return ctypes.cast(ctypes.c_void_p(0x1000 + 0x10 * index), pynvml.c_nvmlDevice_t)


class FakeNvml:
    """pynvml's API over FakeDevices. Everything not in pynvml is underscore-prefixed."""

    NVMLError = pynvml.NVMLError
    NVMLError_NotSupported = pynvml.NVMLError_NotSupported
    NVMLError_NoPermission = pynvml.NVMLError_NoPermission
    NVMLError_FunctionNotFound = pynvml.NVMLError_FunctionNotFound
    NVMLError_GpuIsLost = pynvml.NVMLError_GpuIsLost
    NVMLError_Timeout = pynvml.NVMLError_Timeout
    NVMLError_LibraryNotFound = pynvml.NVMLError_LibraryNotFound
    NVMLError_DriverNotLoaded = pynvml.NVMLError_DriverNotLoaded
    NVMLError_InvalidArgument = pynvml.NVMLError_InvalidArgument
    NVML_SUCCESS = pynvml.NVML_SUCCESS
    NVML_TEMPERATURE_GPU = pynvml.NVML_TEMPERATURE_GPU
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
    NVML_VOLATILE_ECC = pynvml.NVML_VOLATILE_ECC
    NVML_FEATURE_ENABLED = pynvml.NVML_FEATURE_ENABLED
    NVML_FEATURE_DISABLED = pynvml.NVML_FEATURE_DISABLED
    NVML_GPU_FABRIC_STATE_COMPLETED = pynvml.NVML_GPU_FABRIC_STATE_COMPLETED
    NVML_NVLINK_MAX_LINKS = pynvml.NVML_NVLINK_MAX_LINKS
    NVML_NVLINK_DEVICE_TYPE_GPU = pynvml.NVML_NVLINK_DEVICE_TYPE_GPU
    NVML_NVLINK_DEVICE_TYPE_SWITCH = pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH
    nvmlEventTypeXidCriticalError = pynvml.nvmlEventTypeXidCriticalError
    c_nvmlGpuFabricInfoV_t = pynvml.c_nvmlGpuFabricInfoV_t

    def __init__(self, devices: list[FakeDevice], *, init_error: type | None = None) -> None:
        self._devices = devices
        self._init_error = init_error
        self._initialised = 0
        self._events: list[Any] = []
        self._registered: set[int] = set()
        self._sets_freed = 0
        self._calls: list[str] = []

    # -- helpers for tests ----------------------------------------------------

    def _emit_xid(self, index: int | None, xid: int) -> None:
        data = pynvml.c_nvmlEventData_t()
        if index is not None:
            data.device = _handle(index)
        data.eventType = pynvml.nvmlEventTypeXidCriticalError
        data.eventData = xid
        self._events.append(data)

    def _device(self, handle: Any, call: str) -> FakeDevice:
        self._calls.append(call)
        if not self._initialised:
            raise pynvml.NVMLError_Uninitialized()
        address = ctypes.cast(handle, ctypes.c_void_p).value or 0
        device = self._devices[(address - 0x1000) // 0x10]
        if call in device.fails:
            raise device.fails[call]()
        return device

    # -- pynvml ---------------------------------------------------------------

    def nvmlInit(self) -> None:
        if self._init_error is not None:
            raise self._init_error()
        self._initialised += 1

    def nvmlShutdown(self) -> None:
        self._initialised -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        return "570.133.20"

    def nvmlDeviceGetCount(self) -> int:
        return len(self._devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        handle = _handle(index)
        self._device(handle, "nvmlDeviceGetHandleByIndex")
        return handle

    def nvmlDeviceGetName(self, handle: Any) -> str | bytes:
        return self._device(handle, "nvmlDeviceGetName").name

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        return self._device(handle, "nvmlDeviceGetUUID").uuid

    def nvmlDeviceGetSerial(self, handle: Any) -> str:
        return self._device(handle, "nvmlDeviceGetSerial").serial

    def nvmlDeviceGetBoardPartNumber(self, handle: Any) -> str:
        return self._device(handle, "nvmlDeviceGetBoardPartNumber").part

    def nvmlDeviceGetPciInfo(self, handle: Any) -> Any:
        info = pynvml.nvmlPciInfo_t()
        info.busId = self._device(handle, "nvmlDeviceGetPciInfo").bus.encode()
        return info

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: Any = None) -> Any:
        device = self._device(handle, "nvmlDeviceGetMemoryInfo")
        free = device.total_bytes - device.used_bytes
        return pynvml.c_nvmlMemory_t(device.total_bytes, free, device.used_bytes)

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:
        return pynvml.c_nvmlUtilization_t(
            self._device(handle, "nvmlDeviceGetUtilizationRates").util, 3
        )

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return self._device(handle, "nvmlDeviceGetTemperature").temp_c

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        return self._device(handle, "nvmlDeviceGetPowerUsage").power_mw

    def nvmlDeviceGetTotalEccErrors(self, handle: Any, errorType: int, counterType: int) -> int:
        device = self._device(handle, "nvmlDeviceGetTotalEccErrors")
        assert (errorType, counterType) == (
            pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
            pynvml.NVML_VOLATILE_ECC,
        )
        return device.ecc_uncorrected

    def nvmlDeviceGetRetiredPagesPendingStatus(self, device: Any) -> int:
        pending = self._device(device, "nvmlDeviceGetRetiredPagesPendingStatus").pages_pending
        return int(pynvml.NVML_FEATURE_ENABLED if pending else pynvml.NVML_FEATURE_DISABLED)

    def nvmlDeviceGetRemappedRows(self, device: Any) -> tuple[int, int, int, int]:
        return self._device(device, "nvmlDeviceGetRemappedRows").rows

    def nvmlDeviceGetGpuFabricInfoV(self, device: Any, gpuFabricInfo: Any) -> int:
        gpu = self._device(device, "nvmlDeviceGetGpuFabricInfoV")
        info = gpuFabricInfo._obj  # the struct behind ctypes.byref(), as the C call fills it
        assert isinstance(info, pynvml.c_nvmlGpuFabricInfoV_t)
        assert info.version == pynvml.nvmlGpuFabricInfo_v2
        if gpu.fabric is None:
            raise pynvml.NVMLError_NotSupported()
        cluster, clique = gpu.fabric
        ctypes.memmove(info.clusterUuid, cluster, len(cluster))
        info.cliqueId = clique
        info.status = pynvml.NVML_SUCCESS
        info.state = pynvml.NVML_GPU_FABRIC_STATE_COMPLETED
        return int(pynvml.NVML_SUCCESS)

    def nvmlDeviceGetNvLinkState(self, device: Any, link: int) -> int:
        gpu = self._device(device, "nvmlDeviceGetNvLinkState")
        if not gpu.links:
            raise pynvml.NVMLError_NotSupported()
        if link >= len(gpu.links):
            raise pynvml.NVMLError_InvalidArgument()
        return int(pynvml.NVML_FEATURE_ENABLED)

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: Any, link: int) -> int:
        return self._device(handle, "nvmlDeviceGetNvLinkRemoteDeviceType").links[link][0]

    def nvmlDeviceGetNvLinkRemotePciInfo(self, device: Any, link: int) -> Any:
        info = pynvml.nvmlPciInfo_t()
        info.busId = (
            self._device(device, "nvmlDeviceGetNvLinkRemotePciInfo").links[link][1].encode()
        )
        return info

    def nvmlEventSetCreate(self) -> Any:
        return pynvml.c_nvmlEventSet_t()

    def nvmlDeviceRegisterEvents(self, handle: Any, eventTypes: int, eventSet: Any) -> None:
        device = self._device(handle, "nvmlDeviceRegisterEvents")
        assert eventTypes == pynvml.nvmlEventTypeXidCriticalError
        self._registered.add(device.index)

    def nvmlEventSetWait(self, eventSet: Any, timeoutms: int) -> Any:
        if not self._events:
            raise pynvml.NVMLError_Timeout()
        return self._events.pop(0)

    def nvmlEventSetFree(self, eventSet: Any) -> None:
        self._sets_freed += 1


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _host_root(tmp_path: Path) -> Path:
    dmi = tmp_path / "sys/class/dmi/id"
    dmi.mkdir(parents=True)
    (dmi / "product_serial").write_text("SN-7701\n")
    (dmi / "product_uuid").write_text("4c4c4544-0042-3510-8056-b4c04f4e3232\n")
    return tmp_path


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def devices() -> list[FakeDevice]:
    return [FakeDevice(index) for index in range(8)]


@pytest.fixture
def fake(devices: list[FakeDevice]) -> FakeNvml:
    return FakeNvml(devices)


@pytest.fixture
def source(fake: FakeNvml, clock: Clock, tmp_path: Path) -> Iterator[NvmlSource]:
    opened = NvmlSource(
        fake, host_root=str(_host_root(tmp_path)), tracker=HealthTracker(clock=clock)
    )
    yield opened
    opened.close()


# -- the fake matches the real module --------------------------------------


def test_every_name_the_fake_provides_exists_in_real_pynvml() -> None:
    names = [name for name in dir(FakeNvml) if not name.startswith("_")]
    assert len(names) > 30
    missing = [name for name in names if not hasattr(pynvml, name)]
    assert missing == []
    for name in names:
        ours, real = getattr(FakeNvml, name), getattr(pynvml, name)
        if inspect.isfunction(ours):
            ours_params = list(inspect.signature(ours).parameters)[1:]  # drop self
            assert ours_params == list(inspect.signature(real).parameters), name
        else:
            assert ours is real, name


# -- reading GPUs ------------------------------------------------------------


def test_reads_eight_gpus_in_the_right_units(source: NvmlSource, devices: list[FakeDevice]) -> None:
    inventory = source.inventory()
    assert isinstance(source, GpuSource)
    assert (inventory.source, inventory.driver_version) == ("nvml", "570.133.20")
    assert inventory.host.serial == "SN-7701"
    assert inventory.host.product_uuid == "4c4c4544-0042-3510-8056-b4c04f4e3232"
    assert [gpu.index for gpu in inventory.gpus] == list(range(8))
    assert [gpu.uuid for gpu in inventory.gpus] == [device.uuid for device in devices]
    first = inventory.gpus[0]
    assert first.name == H100 and first.family == "H100"
    assert first.serial == "1654923000000"
    assert first.product == "692-2G520-0200-000"
    assert first.pci_bus_id == "0000:18:00.0"
    assert inventory.gpus[1].pci_bus_id == "0000:2a:00.0"
    assert first.memory_mib == 81559
    assert first.memory_used_mib == 1024
    assert first.utilization_pct == 57
    assert first.temperature_c == 31
    assert first.power_w == pytest.approx(69.841)
    assert first.nvlink_domain is None
    assert all(gpu.healthy and gpu.health_reasons == [] for gpu in inventory.gpus)


def test_every_inventory_is_a_fresh_read(source: NvmlSource, devices: list[FakeDevice]) -> None:
    assert source.inventory().gpus[2].temperature_c == 31
    devices[2].temp_c = 80
    devices[2].used_bytes = 40000 * MIB
    again = source.inventory().gpus[2]
    assert (again.temperature_c, again.memory_used_mib) == (80, 40000)


def test_bytes_from_older_bindings_are_decoded(devices: list[FakeDevice], tmp_path: Path) -> None:
    devices[0].name = H100.encode()
    source = NvmlSource(FakeNvml(devices), host_root=str(tmp_path), watch_xids=False)
    gpu = source.inventory().gpus[0]
    assert gpu.name == H100 and gpu.family == "H100"


OPTIONAL_CALLS = [
    "nvmlDeviceGetSerial",
    "nvmlDeviceGetBoardPartNumber",
    "nvmlDeviceGetPciInfo",
    "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetUtilizationRates",
    "nvmlDeviceGetTemperature",
    "nvmlDeviceGetPowerUsage",
    "nvmlDeviceGetTotalEccErrors",
    "nvmlDeviceGetRetiredPagesPendingStatus",
    "nvmlDeviceGetRemappedRows",
    "nvmlDeviceGetGpuFabricInfoV",
    "nvmlDeviceGetNvLinkState",
]


@pytest.mark.parametrize("error", [pynvml.NVMLError_NotSupported, pynvml.NVMLError_NoPermission])
def test_unsupported_optional_calls_give_none_not_failure(
    devices: list[FakeDevice], tmp_path: Path, error: type[pynvml.NVMLError]
) -> None:
    devices[4].fails = dict.fromkeys(OPTIONAL_CALLS, error)
    fake = FakeNvml(devices)
    source = NvmlSource(fake, host_root=str(_host_root(tmp_path)), watch_xids=False)
    gpu = source.inventory().gpus[4]
    assert set(OPTIONAL_CALLS) <= set(fake._calls)
    assert (gpu.uuid, gpu.name) == (devices[4].uuid, H100)
    assert gpu.product == H100  # no part number: the name stands in
    assert gpu.serial is None and gpu.pci_bus_id is None
    assert gpu.memory_mib is None and gpu.memory_used_mib is None
    assert gpu.utilization_pct is None and gpu.temperature_c is None and gpu.power_w is None
    assert gpu.nvlink_domain is None
    assert gpu.healthy and gpu.health_reasons == []


@pytest.mark.parametrize(
    ("fault", "reason"),
    [
        ({"ecc_uncorrected": 3}, "ecc-uncorrected"),
        ({"pages_pending": True}, "retired-pages-pending"),
        ({"rows": (5, 1, 0, 1)}, "remapped-rows-failure"),
    ],
)
def test_memory_faults_make_a_gpu_unhealthy(
    source: NvmlSource, devices: list[FakeDevice], fault: dict[str, Any], reason: str
) -> None:
    for key, value in fault.items():
        setattr(devices[5], key, value)
    gpus = source.inventory().gpus
    assert (gpus[5].healthy, gpus[5].health_reasons) == (False, [reason])
    assert all(gpu.healthy for gpu in gpus if gpu.index != 5)


def test_pending_row_remap_alone_is_not_a_fault(
    source: NvmlSource, devices: list[FakeDevice]
) -> None:
    devices[1].rows = (2, 0, 1, 0)
    assert source.inventory().gpus[1].healthy


def test_lost_gpu_keeps_its_identity_and_is_unhealthy(
    source: NvmlSource, devices: list[FakeDevice]
) -> None:
    assert source.inventory().gpus[6].healthy
    devices[6].fails = {"nvmlDeviceGetHandleByIndex": pynvml.NVMLError_GpuIsLost}
    gpu = source.inventory().gpus[6]
    assert (gpu.uuid, gpu.serial, gpu.pci_bus_id) == (
        devices[6].uuid,
        "1654923000006",
        "0000:ba:00.0",
    )
    assert (gpu.healthy, gpu.health_reasons) == (False, ["gpu-lost"])


def test_gpu_lost_in_the_middle_of_a_read(source: NvmlSource, devices: list[FakeDevice]) -> None:
    devices[2].fails = {"nvmlDeviceGetMemoryInfo": pynvml.NVMLError_GpuIsLost}
    inventory = source.inventory()
    assert (inventory.gpus[2].uuid, inventory.gpus[2].health_reasons) == (
        devices[2].uuid,
        ["gpu-lost"],
    )
    assert len(inventory.gpus) == 8 and all(g.healthy for g in inventory.gpus if g.index != 2)


def test_gpu_lost_before_it_was_ever_read_gets_a_placeholder(
    devices: list[FakeDevice], tmp_path: Path
) -> None:
    devices[0].fails = {"nvmlDeviceGetUUID": pynvml.NVMLError_GpuIsLost}
    source = NvmlSource(FakeNvml(devices), host_root=str(tmp_path), watch_xids=False)
    gpu = source.inventory().gpus[0]
    assert (gpu.uuid, gpu.healthy, gpu.health_reasons) == ("unknown-gpu-0", False, ["gpu-lost"])


# -- NVLink domains ----------------------------------------------------------


def test_fabric_cluster_and_clique_name_the_nvlink_domain(
    devices: list[FakeDevice], tmp_path: Path
) -> None:
    cluster = uuidlib.UUID("9e0a4d56-8b3f-4b77-a4c2-0b1e2f3a4b5c")
    for device in devices:
        device.fabric = (cluster.bytes, 7)
    source = NvmlSource(FakeNvml(devices), host_root=str(tmp_path), watch_xids=False)
    domains = {gpu.nvlink_domain for gpu in source.inventory().gpus}
    assert domains == {f"{cluster}/7"}


def test_zero_cluster_uuid_is_no_fabric_domain(devices: list[FakeDevice], tmp_path: Path) -> None:
    devices[0].fabric = (bytes(16), 0)
    source = NvmlSource(FakeNvml(devices), host_root=str(tmp_path), watch_xids=False)
    assert source.inventory().gpus[0].nvlink_domain is None


def test_gpus_on_the_hosts_nvswitches_share_a_domain(
    devices: list[FakeDevice], tmp_path: Path
) -> None:
    for device in devices[:7]:
        device.links = [(pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH, "00000000:05:00.0")] * 18
    source = NvmlSource(FakeNvml(devices), host_root=str(_host_root(tmp_path)), watch_xids=False)
    domains = [gpu.nvlink_domain for gpu in source.inventory().gpus]
    assert domains[:7] == ["4c4c4544-0042-3510-8056-b4c04f4e3232/nvswitch"] * 7
    assert domains[7] is None


def test_bridged_pairs_are_separate_domains(devices: list[FakeDevice], tmp_path: Path) -> None:
    gpu = pynvml.NVML_NVLINK_DEVICE_TYPE_GPU
    for a, b in ((0, 1), (2, 3)):
        devices[a].links = [(gpu, devices[b].bus)] * 4
        devices[b].links = [(gpu, devices[a].bus)] * 4
    source = NvmlSource(FakeNvml(devices), host_root=str(_host_root(tmp_path)), watch_xids=False)
    domains = [g.nvlink_domain for g in source.inventory().gpus]
    host = "4c4c4544-0042-3510-8056-b4c04f4e3232"
    assert domains[:4] == [f"{host}/nvlink-0000:18:00.0"] * 2 + [f"{host}/nvlink-0000:3a:00.0"] * 2
    assert domains[4:] == [None] * 4


# -- XIDs ----------------------------------------------------------------------


def test_hardware_xid_marks_unhealthy_and_recovers_after_the_window(
    source: NvmlSource, fake: FakeNvml, clock: Clock, devices: list[FakeDevice]
) -> None:
    fake._emit_xid(3, 79)
    gpus = source.inventory().gpus
    assert (gpus[3].healthy, gpus[3].health_reasons) == (False, ["xid-79"])
    assert [g.index for g in gpus if not g.healthy] == [3]

    clock.now += 599
    assert source.inventory().gpus[3].health_reasons == ["xid-79"]
    clock.now += 2
    recovered = source.inventory().gpus[3]
    assert (recovered.healthy, recovered.health_reasons) == (True, [])
    assert recovered.uuid == devices[3].uuid


def test_recovery_waits_for_clean_ecc(
    source: NvmlSource, fake: FakeNvml, clock: Clock, devices: list[FakeDevice]
) -> None:
    fake._emit_xid(2, 48)
    devices[2].ecc_uncorrected = 1
    assert source.inventory().gpus[2].health_reasons == ["ecc-uncorrected", "xid-48"]
    clock.now += 601
    assert source.inventory().gpus[2].health_reasons == ["ecc-uncorrected"]
    devices[2].ecc_uncorrected = 0  # a GPU reset clears volatile counters
    assert source.inventory().gpus[2].healthy


@pytest.mark.parametrize("xid", sorted(APPLICATION_XIDS))
def test_application_xids_do_not_touch_health(source: NvmlSource, fake: FakeNvml, xid: int) -> None:
    fake._emit_xid(1, xid)
    assert source.watch(0) == [XidEvent(uuid=source.inventory().gpus[1].uuid, xid=xid)]
    assert all(gpu.healthy for gpu in source.inventory().gpus)


def test_xid_without_a_device_counts_against_every_gpu(source: NvmlSource, fake: FakeNvml) -> None:
    fake._emit_xid(None, 79)
    assert {tuple(gpu.health_reasons) for gpu in source.inventory().gpus} == {("xid-79",)}


def test_watcher_drains_every_queued_event(fake: FakeNvml, devices: list[FakeDevice]) -> None:
    fake.nvmlInit()
    watcher = XidWatcher(fake)
    assert fake._registered == set(range(8))
    fake._emit_xid(0, 79)
    fake._emit_xid(7, 13)
    assert watcher.poll(100) == [XidEvent(devices[0].uuid, 79), XidEvent(devices[7].uuid, 13)]
    assert watcher.poll(0) == []
    watcher.close()
    watcher.close()
    assert fake._sets_freed == 1


def test_watcher_skips_gpus_that_cannot_deliver_events(devices: list[FakeDevice]) -> None:
    devices[5].fails = {"nvmlDeviceRegisterEvents": pynvml.NVMLError_NotSupported}
    fake = FakeNvml(devices)
    fake.nvmlInit()
    watcher = XidWatcher(fake)
    assert watcher.unwatched == [5]
    assert fake._registered == set(range(8)) - {5}


def test_tracker_window_is_configurable(clock: Clock) -> None:
    tracker = HealthTracker(60, clock=clock)
    assert tracker.record("GPU-a", 79) is True
    assert tracker.record("GPU-a", 13) is False
    assert tracker.reasons("GPU-a") == ["xid-79"] and tracker.reasons("GPU-b") == []
    clock.now += 61
    assert tracker.reasons("GPU-a") == []
    with pytest.raises(ValueError):
        HealthTracker(0)


# -- opening and closing -------------------------------------------------------


@pytest.mark.parametrize(
    ("error", "hint"),
    [
        (pynvml.NVMLError_LibraryNotFound, "install the NVIDIA driver"),
        (pynvml.NVMLError_DriverNotLoaded, "modprobe nvidia"),
    ],
)
def test_missing_library_or_driver_is_unavailable(
    devices: list[FakeDevice], error: type[pynvml.NVMLError], hint: str
) -> None:
    with pytest.raises(GpuSourceUnavailable, match=hint):
        NvmlSource(FakeNvml(devices, init_error=error))


def test_other_init_failures_are_errors_not_unavailability(devices: list[FakeDevice]) -> None:
    with pytest.raises(GpuSourceError) as caught:
        NvmlSource(FakeNvml(devices, init_error=pynvml.NVMLError_NoPermission))
    assert not isinstance(caught.value, GpuSourceUnavailable)
    assert "Insufficient Permissions" in str(caught.value)


def test_close_shuts_nvml_down_once(fake: FakeNvml, tmp_path: Path) -> None:
    source = NvmlSource(fake, host_root=str(tmp_path))
    assert fake._initialised == 1
    source.close()
    source.close()
    assert (fake._initialised, fake._sets_freed) == (0, 1)
    with pytest.raises(GpuSourceError, match="closed"):
        source.inventory()
