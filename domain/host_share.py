"""Host resources: what each booked GPU carries of its host's CPUs and memory.

A node first keeps a reserve for the host itself (the agent, the kernel, the
container runtime): ``max(2, ceil(5% of its CPUs))`` CPUs and
``max(8, ceil(5% of its memory))`` GiB. What is left is split evenly over the
node's GPUs, rounded down to whole CPUs and whole GiB: that is the per-GPU
share. A reservation of N GPUs books N shares on its node, so GPUs and host
resources run out together and a node never promises more CPUs or memory than
it has. A node that did not report its CPUs or memory books a share of 0.

Example: 224 CPUs, 2015.56 GiB, 8 GPUs: the host keeps 12 CPUs and 101 GiB;
each GPU carries 26 CPUs and 239 GiB.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

MIN_HOST_CPUS = 2
MIN_HOST_MEMORY_GIB = 8
HOST_FRACTION = 0.05


@dataclass(frozen=True)
class HostShare:
    reserved_cpus: int
    reserved_memory_gib: int
    cpus_per_gpu: int
    memory_gib_per_gpu: int


def host_share(cpus: int | None, memory_gib: float | None, gpu_count: int) -> HostShare:
    """The host reserve and the per-GPU share of a node with ``gpu_count`` GPUs."""
    if gpu_count <= 0:
        return HostShare(0, 0, 0, 0)
    cpu_total = int(cpus or 0)
    mem_total = float(memory_gib or 0.0)
    reserved_cpus = max(MIN_HOST_CPUS, math.ceil(cpu_total * HOST_FRACTION)) if cpu_total else 0
    reserved_mem = (
        max(MIN_HOST_MEMORY_GIB, math.ceil(mem_total * HOST_FRACTION)) if mem_total else 0
    )
    per_cpu = max(0, (cpu_total - reserved_cpus) // gpu_count)
    per_mem = max(0, math.floor((mem_total - reserved_mem) / gpu_count))
    return HostShare(reserved_cpus, reserved_mem, per_cpu, per_mem)
