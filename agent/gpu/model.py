"""What a GPU source reports is what bcd sends: the values are the wire's (api/wire/inventory.py)."""

from better_compute.api.wire.inventory import Gpu, HostFacts, Inventory, gpu_family

__all__ = ["Gpu", "HostFacts", "Inventory", "gpu_family"]
