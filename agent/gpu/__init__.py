"""Where bcd reads its GPUs: one GpuSource protocol, three implementations.

``open_source(os.environ.get("BCD_GPU_SOURCE"))`` picks NVML, nvidia-smi or a
fake file; the rest of the agent only calls ``inventory()`` and ``close()``.
"""

from .errors import GpuSourceError, GpuSourceUnavailable
from .fake import FakeSource, load_fake_file, set_fake_gpu_health, write_fake_fleet_file
from .family import gpu_family
from .health import APPLICATION_XIDS, HealthTracker, is_application_xid
from .host import read_host_facts
from .model import Gpu, HostFacts, Inventory
from .nvml import NvmlSource
from .pci import normalize_pci_bus_id
from .smi import NvidiaSmiSource, parse_query_gpu
from .source import GpuSource, open_source
from .xid import XidEvent, XidWatcher

__all__ = [
    "APPLICATION_XIDS",
    "FakeSource",
    "Gpu",
    "GpuSource",
    "GpuSourceError",
    "GpuSourceUnavailable",
    "HealthTracker",
    "HostFacts",
    "Inventory",
    "NvidiaSmiSource",
    "NvmlSource",
    "XidEvent",
    "XidWatcher",
    "gpu_family",
    "is_application_xid",
    "load_fake_file",
    "normalize_pci_bus_id",
    "open_source",
    "parse_query_gpu",
    "read_host_facts",
    "set_fake_gpu_health",
    "write_fake_fleet_file",
]
