"""A GPU source described by a JSON file, for tests, demos and simulated nodes.

The file is read again on every inventory(), so editing it while bcd runs (a GPU
turning unhealthy, say) changes the next report. Unknown keys are refused: in a
hand-written file they are typos, and a typo silently ignored ("healty": false)
would leave a GPU the operator meant to fail looking healthy.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import uuid
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import msgspec

from .errors import GpuSourceError
from .model import Gpu, HostFacts, Inventory
from .pci import normalize_pci_bus_id

__all__ = ["FakeSource", "set_fake_gpu_health", "write_fake_fleet_file"]

H100_NAME = "NVIDIA H100 80GB HBM3"
H100_MEMORY_MIB = 81559
# Bus ids of the eight GPUs of an HGX H100 baseboard, in NVML index order.
HGX_BUS_IDS = (
    "0000:18:00.0",
    "0000:2a:00.0",
    "0000:3a:00.0",
    "0000:5d:00.0",
    "0000:9a:00.0",
    "0000:ab:00.0",
    "0000:ba:00.0",
    "0000:db:00.0",
)
_NAMESPACE = uuid.UUID("6f1d8c52-3c0e-4c55-9a57-bcd000000001")


class _FakeFile(msgspec.Struct, rename="camel"):
    host: HostFacts = msgspec.field(default_factory=HostFacts)
    gpus: list[Gpu] = msgspec.field(default_factory=list)
    driver_version: str | None = None


def _encoded_names(struct: type[msgspec.Struct]) -> frozenset[str]:
    return frozenset(field.encode_name for field in msgspec.structs.fields(struct))


_TOP_KEYS = _encoded_names(_FakeFile)
_HOST_KEYS = _encoded_names(HostFacts)
_GPU_KEYS = _encoded_names(Gpu)


def _unknown(keys: Iterable[str], known: frozenset[str], where: str) -> str | None:
    extra = sorted(set(keys) - known)
    if not extra:
        return None
    return f"unknown field {extra[0]!r} at `{where}` (known fields: {', '.join(sorted(known))})"


def _check_and_fill(raw: Any) -> str | None:
    """Refuse unknown keys and give GPUs without an index their position.

    Returns a message naming the offending path, or None when the shape is fine;
    type errors are left to msgspec, whose messages carry the path too.
    """
    if not isinstance(raw, dict):
        return "expected a JSON object at `$`"
    problem = _unknown(raw, _TOP_KEYS, "$")
    if problem:
        return problem
    host = raw.get("host")
    if isinstance(host, dict) and (problem := _unknown(host, _HOST_KEYS, "$.host")):
        return problem
    gpus = raw.get("gpus")
    if isinstance(gpus, list):
        for position, entry in enumerate(gpus):
            if not isinstance(entry, dict):
                continue
            if problem := _unknown(entry, _GPU_KEYS, f"$.gpus[{position}]"):
                return problem
            entry.setdefault("index", position)
    return None


def _check_unique(gpus: Sequence[Gpu]) -> str | None:
    seen_uuid: dict[str, int] = {}
    seen_index: dict[int, int] = {}
    for position, gpu in enumerate(gpus):
        if gpu.uuid in seen_uuid:
            return (
                f"duplicate uuid {gpu.uuid!r} at `$.gpus[{position}].uuid` "
                f"(also at `$.gpus[{seen_uuid[gpu.uuid]}]`)"
            )
        if gpu.index in seen_index:
            return (
                f"duplicate index {gpu.index} at `$.gpus[{position}].index` "
                f"(also at `$.gpus[{seen_index[gpu.index]}]`)"
            )
        seen_uuid[gpu.uuid] = position
        seen_index[gpu.index] = position
    return None


def _read_raw(path: Path) -> Any:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise GpuSourceError(
            f"fake GPU file {path} does not exist; write one (see write_fake_fleet_file) "
            "or point BCD_GPU_SOURCE=fake:FILE at an existing file"
        ) from None
    except OSError as error:
        raise GpuSourceError(f"cannot read fake GPU file {path}: {error.strerror}") from error
    try:
        return msgspec.json.decode(data)
    except msgspec.DecodeError as error:
        raise GpuSourceError(f"fake GPU file {path} is not valid JSON: {error}") from error


def load_fake_file(path: str | os.PathLike[str]) -> Inventory:
    """Parse a fake GPU file into an Inventory, or raise GpuSourceError naming the field."""
    file = Path(path)
    raw = _read_raw(file)
    if problem := _check_and_fill(raw):
        raise GpuSourceError(f"fake GPU file {file}: {problem}")
    try:
        parsed = msgspec.convert(raw, _FakeFile)
    except msgspec.ValidationError as error:
        raise GpuSourceError(f"fake GPU file {file}: {error}") from error
    if problem := _check_unique(parsed.gpus):
        raise GpuSourceError(f"fake GPU file {file}: {problem}")
    for gpu in parsed.gpus:
        gpu.pci_bus_id = normalize_pci_bus_id(gpu.pci_bus_id)
    return Inventory(
        host=parsed.host,
        gpus=sorted(parsed.gpus, key=lambda gpu: gpu.index),
        source="fake",
        driver_version=parsed.driver_version,
    )


class FakeSource:
    """GPUs and host facts read from a JSON file on every call."""

    name = "fake"

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        # Fail at start-up, where the operator is looking, rather than on the first report.
        load_fake_file(self.path)

    def inventory(self) -> Inventory:
        return load_fake_file(self.path)

    def close(self) -> None:
        """Nothing to release."""


def _write_atomically(path: Path, document: Any) -> None:
    """Write JSON through a temp file and rename, so a reader never sees half a file."""
    data = msgspec.json.format(msgspec.json.encode(document), indent=2) + b"\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(data)
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise


def _digest(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


def _bus_id(index: int) -> str:
    if index < len(HGX_BUS_IDS):
        return HGX_BUS_IDS[index]
    return f"0001:{index:02x}:00.0"


def _fake_macs(seed: int) -> list[str]:
    return [
        f"b8:3f:d2:{(seed >> 16) & 0xFF:02x}:{(seed >> 8) & 0xFF:02x}:{(seed + n) & 0xFF:02x}"
        for n in range(2)
    ]


def fake_gpu_uuid(serial: str, index: int) -> str:
    """The UUID of GPU ``index`` of the fake host ``serial``: hosts never share a GPU."""
    return f"GPU-{uuid.uuid5(_NAMESPACE, f'gpu/{serial}/{index}')}"


def _fake_gpu(serial: str, seed: int, index: int, model: str, memory_mib: int,
              domain: str | None) -> dict[str, Any]:
    """One idle, healthy GPU of a fake host; its identity derives from the host's serial."""
    return {
        "index": index,
        "uuid": fake_gpu_uuid(serial, index),
        "name": model,
        "serial": f"1654{seed % 10**7:07d}{index:02d}",
        "pciBusId": _bus_id(index),
        "memoryMiB": memory_mib,
        "memoryUsedMiB": 0,
        "utilizationPct": 0,
        "temperatureC": 30 + (seed + index) % 6,
        "powerW": 68.5 + index % 3,
        "nvlinkDomain": domain,
        "healthy": True,
    }


def write_fake_fleet_file(
    path: str | os.PathLike[str],
    *,
    gpus: int = 8,
    model: str = H100_NAME,
    serial: str = "SN-7701",
    memory_mib: int = H100_MEMORY_MIB,
    hostname: str | None = None,
    product_uuid: str | None = None,
    macs: Sequence[str] | None = None,
    cpus: int = 224,
    memory_gib: float = 2015.56,
    nvlink: bool = True,
    driver_version: str = "570.133.20",
) -> Inventory:
    """Write a fake file describing a realistic GPU server and return what it reports.

    The default is an HGX H100 host: 8 GPUs on one NVSwitch NVLink domain, idle.
    Every identifier (GPU UUIDs and serials, the product UUID, MACs) derives from
    ``serial``, so hosts with different serials never collide and rewriting the
    file for the same host keeps its GPUs' identity.
    """
    if gpus < 0:
        raise ValueError("gpus must be >= 0")
    seed = _digest(serial)
    host_uuid = product_uuid or str(uuid.uuid5(_NAMESPACE, f"host/{serial}"))
    host_macs = list(macs) if macs is not None else _fake_macs(seed)
    domain = f"{host_uuid}/nvswitch" if nvlink and gpus > 1 else None
    document = {
        "driverVersion": driver_version,
        "host": {
            "serial": serial,
            "productUuid": host_uuid,
            "macs": host_macs,
            "cpus": cpus,
            "memoryGiB": memory_gib,
            "hostname": hostname or f"gpu-{serial.lower()}",
        },
        "gpus": [_fake_gpu(serial, seed, index, model, memory_mib, domain)
                 for index in range(gpus)],
    }
    target = Path(path)
    _write_atomically(target, document)
    return load_fake_file(target)


def set_fake_gpu_health(
    path: str | os.PathLike[str],
    gpu: int | str,
    *,
    healthy: bool,
    reasons: Sequence[str] = (),
) -> None:
    """Mark one GPU of a fake file (by index or UUID) healthy or not, atomically."""
    file = Path(path)
    raw = _read_raw(file)
    if problem := _check_and_fill(raw):
        raise GpuSourceError(f"fake GPU file {file}: {problem}")
    for entry in raw.get("gpus", []):
        if isinstance(entry, dict) and gpu in (entry.get("index"), entry.get("uuid")):
            entry["healthy"] = healthy
            entry["healthReasons"] = list(reasons)
            _write_atomically(file, raw)
            return
    raise GpuSourceError(f"fake GPU file {file} has no GPU {gpu!r}")
