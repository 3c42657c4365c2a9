"""The default placer: a pure function from a request and candidate nodes to a placement.

``place(request, candidates)`` takes plain values (what the free-GPU projection
read for the requested interval) and decides; it reads no clock and no store.

The rule (docs/reservations.md, "Placement"):

1. A GPU qualifies when it is healthy, free for the whole interval, of the
   requested ``model`` / ``product`` (when given) and the selector is true
   for it.
2. With ``nvlink``, the GPUs must share one NVLink domain: on each node the
   placer takes the smallest domain that still holds enough qualifying GPUs.
   A single GPU is always in one domain.
3. The node must also have the host CPUs and memory the GPUs carry (the
   per-GPU share times the GPU count, see domain/host_share.py).
4. Packing: among the nodes that fit, the one with the FEWEST free GPUs wins,
   so large holes stay whole for large requests; ties go to the smallest node
   id, so the choice is deterministic.
5. On the chosen node (or domain), the GPUs with the lowest indexes are taken.

With a ``NodePartition`` (one of ``serve --workers N``'s processes), rule 4 applies first
among the nodes of the process's own partition (a stable hash of the node id, one partition
per process), then among the others: processes that place side by side pack different
nodes instead of all choosing the same fullest node, where all but one would lose the save
and place again.

When nothing fits, it raises ``NoCapacity`` saying what is available now.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from better_compute.domain.errors import NoCapacity
from better_compute.domain.gpu_models import card_model, same_model, stored_model
from better_compute.domain.gpus import Gpu
from better_compute.domain.selectors import Selector


def gpu_attributes(gpu: Mapping[str, Any]) -> dict[str, Any]:
    """A GPU as selectors see it, from the inventory document bcd reported.

    ``vramGiB`` is the card's memory rounded to the nearest GiB, the way cards
    are sold (an H100 80GB reports 81,559 MiB: 80 GiB).
    """
    value = Gpu.from_doc(gpu)
    return {
        "vramGiB": round(value.memory_mib / 1024) if value.memory_mib is not None else None,
        "model": value.model,
        "product": value.product or value.name or None,
        "name": value.name or None,
        "nvlinkDomain": gpu.get("nvlinkDomain"),
        "index": gpu.get("index"),
        "healthy": value.healthy,
    }


@dataclass(frozen=True)
class FreeGpu:
    uuid: str
    index: int
    attributes: Mapping[str, Any] = field(default_factory=dict)

    @property
    def healthy(self) -> bool:
        return bool(self.attributes.get("healthy", True))

    @property
    def nvlink_domain(self) -> str | None:
        domain = self.attributes.get("nvlinkDomain")
        return str(domain) if domain else None


@dataclass(frozen=True)
class Candidate:
    """One schedulable node and what is free on it for the requested interval."""

    node_id: str
    free_gpus: tuple[FreeGpu, ...]
    cpus_per_gpu: int = 0
    memory_gib_per_gpu: int = 0
    free_cpus: int = 0
    free_memory_gib: int = 0
    gpu_count: int = 0  # every GPU of the node (its host share's divisor); 0: not known


@dataclass(frozen=True)
class PlacementRequest:
    gpus: int
    model: str | None = None
    product: str | None = None
    selector: Selector | None = None
    nvlink: bool = False
    exclude_nodes: frozenset[str] = frozenset()

    def __post_init__(self) -> None:  # a stored reservation's model, read with today's names
        object.__setattr__(self, "model", stored_model(self.model))

    def qualifies(self, gpu: FreeGpu) -> bool:
        attrs = gpu.attributes
        if not gpu.healthy:
            return False
        if self.model is not None and not same_model(
                card_model(attrs.get("name"), attrs.get("model")), self.model):
            return False
        if self.product is not None and attrs.get("product") != self.product:
            return False
        return self.selector is None or self.selector.matches(attrs)

    def describe(self) -> str:
        parts = [f"{self.gpus} GPU{'s' if self.gpus != 1 else ''}"]
        if self.model:
            parts.append(f"model {self.model}")
        if self.product:
            parts.append(f"product {self.product!r}")
        if self.selector is not None:
            parts.append(f"selector {self.selector.text!r}")
        if self.nvlink:
            parts.append("in one NVLink domain")
        return ", ".join(parts)


@dataclass(frozen=True)
class NodePartition:
    """The share of a pool's nodes one of ``count`` placing processes packs first: the nodes
    whose id hashes to ``index``."""

    index: int
    count: int

    def __post_init__(self) -> None:
        if not 0 <= self.index < self.count:
            raise ValueError(f"partition {self.index} of {self.count}")

    def holds(self, node_id: str) -> bool:
        return zlib.crc32(node_id.encode()) % self.count == self.index


@dataclass(frozen=True)
class Placement:
    node_id: str
    gpus: tuple[str, ...]
    cpus: int
    memory_gib: int
    # The node's whole host share (CPUs, GiB of memory), which its bookings may not pass,
    # when the candidate knew it (the booking then reads nothing more); None: not known.
    host: tuple[int, int] | None = field(default=None, compare=False)


def _pick_gpus(request: PlacementRequest, gpus: Sequence[FreeGpu]) -> list[FreeGpu] | None:
    ordered = sorted(gpus, key=lambda g: (g.index, g.uuid))
    if len(ordered) < request.gpus:
        return None
    if not request.nvlink or request.gpus == 1:
        return ordered[: request.gpus]
    domains: dict[str, list[FreeGpu]] = {}
    for gpu in ordered:
        if gpu.nvlink_domain is not None:
            domains.setdefault(gpu.nvlink_domain, []).append(gpu)
    fitting = [(len(members), name) for name, members in domains.items()
               if len(members) >= request.gpus]
    if not fitting:
        return None
    _, best = min(fitting)
    return domains[best][: request.gpus]


def _largest_group(request: PlacementRequest, gpus: Sequence[FreeGpu]) -> int:
    if not request.nvlink:
        return len(gpus)
    counts: dict[str | None, int] = {}
    for gpu in gpus:
        counts[gpu.nvlink_domain] = counts.get(gpu.nvlink_domain, 0) + 1
    best = max((n for d, n in counts.items() if d is not None), default=0)
    return max(best, 1 if gpus else 0)


def place(request: PlacementRequest, candidates: Iterable[Candidate],
          pool_gpus: Mapping[str, float] | None = None,
          partition: NodePartition | None = None) -> Placement:
    """Choose a node and its GPUs for ``request``; raises NoCapacity when none fits.

    ``pool_gpus`` is the pool's GPU rollup (docs/capacity.md); with it the error names the
    true cause of what is missing (GPUs in maintenance, unhealthy, unreachable, held).
    ``partition``: the nodes of this partition are preferred (see the module's docstring)."""
    best: tuple[tuple[int, int, str], Placement] | None = None
    qualifying_total = 0
    nodes_seen = 0
    largest = 0
    short_of_host = 0
    for candidate in candidates:
        if candidate.node_id in request.exclude_nodes:
            continue
        nodes_seen += 1
        qualifying = [g for g in candidate.free_gpus if request.qualifies(g)]
        qualifying_total += len(qualifying)
        largest = max(largest, _largest_group(request, qualifying))
        chosen = _pick_gpus(request, qualifying)
        if chosen is None:
            continue
        cpus = candidate.cpus_per_gpu * request.gpus
        memory = candidate.memory_gib_per_gpu * request.gpus
        if cpus > candidate.free_cpus or memory > candidate.free_memory_gib:
            short_of_host += 1
            continue
        other_partition = 0 if partition is None or partition.holds(candidate.node_id) else 1
        rank = (other_partition, len(candidate.free_gpus), candidate.node_id)
        if best is None or rank < best[0]:
            host = (candidate.cpus_per_gpu * candidate.gpu_count,
                    candidate.memory_gib_per_gpu * candidate.gpu_count) \
                if candidate.gpu_count else None
            placement = Placement(candidate.node_id, tuple(g.uuid for g in chosen), cpus, memory,
                                  host)
            best = (rank, placement)
    if best is None:
        raise _no_capacity(request, nodes_seen, qualifying_total, largest, short_of_host,
                           pool_gpus)
    return best[1]


# Why a pool's GPUs are out of reach, in the order the rollup counts them, with the fix.
_OUT_OF_REACH = (
    ("provisioning", "provisioning (nodes not adopted yet: `better-compute nodes list --pool` "
                     "shows their acceptance)"),
    ("unreachable", "unreachable (their bcd is away: see `better-compute nodes get NODE "
                    "--query session`)"),
    ("maintenance", "in maintenance (cordoned or draining nodes: `better-compute nodes "
                    "uncordon NODE` ends it)"),
    ("unhealthy", "unhealthy (see `better-compute nodes get NODE --query gpus`)"),
    ("allocated", "held by running reservations"),
    ("reserved", "booked for later reservations"),
)


def _causes(request: PlacementRequest, gpu: Mapping[str, float]) -> tuple[str, str]:
    """What keeps the pool's GPUs from the request, and the advice that follows from it."""
    total = int(gpu.get("total", 0))
    if total == 0:
        return ("The pool has no nodes: join a machine to it (`better-compute join-tokens "
                "create --pool …`, then `bcd join`)", "")
    parts = [f"{int(gpu[k])} GPU{'s' if gpu[k] != 1 else ''} {text}"
             for k, text in _OUT_OF_REACH if gpu.get(k)]
    usable = int(gpu.get("allocatable", 0))
    if request.gpus > total:
        advice = f"Ask for at most {total} GPUs"
    elif request.gpus > usable:
        advice = "Wait until enough of them are back, or ask for fewer GPUs"
    elif gpu.get("allocated") or gpu.get("reserved"):
        advice = "Start later with --start, or ask for fewer GPUs"
    else:
        advice = "Relax --model/--product/--selector/--nvlink, or ask for fewer GPUs"
    picture = f"Of the pool's {total} GPUs: " + "; ".join(parts) if parts else ""
    return picture, advice


def _no_capacity(request: PlacementRequest, nodes: int, free: int, largest: int,
                 short_of_host: int, pool_gpus: Mapping[str, float] | None = None
                 ) -> NoCapacity:
    if nodes == 0:
        now = "no node of the pool is adopted and schedulable now"
    else:
        group = "in one NVLink domain" if request.nvlink else "on one node"
        now = (f"available now: {free} matching free GPU{'s' if free != 1 else ''} on "
               f"{nodes} schedulable node{'s' if nodes != 1 else ''}, at most {largest} {group}")
        if short_of_host:
            now += (f"; {short_of_host} node{'s' if short_of_host != 1 else ''} had the GPUs "
                    "but not the host CPUs or memory they carry")
    advice = ("Ask for fewer GPUs, relax --model/--product/--selector/--nvlink, or start later "
              "with --start")
    if pool_gpus is not None:
        picture, better = _causes(request, pool_gpus)
        now = f"{now}. {picture}" if picture else now
        advice = better
    return NoCapacity(
        f"no capacity for {request.describe()}: {now}" + (f". {advice}" if advice else ""),
        data={"requested": request.gpus, "freeGpus": free, "largestFit": largest,
              "schedulableNodes": nodes},
    )
