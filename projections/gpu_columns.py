"""The JSON columns of the free-GPU index, parsed once per distinct value.

Every placement reads ~16 node rows and their bookings, and every batch of the index
re-reads the rows of the nodes it touched; a node's ``gpus`` column changes only when its
GPUs do, a booking's never. Parsing them again each time would be 7 to 10 % of a
reservation create's server time, so each distinct text is parsed once per process and the result is
shared: immutable values (tuples, frozensets, read-only mappings), keyed by the text
itself, so a changed column is a new key and nothing can go stale.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from types import MappingProxyType

from better_compute.domain.placement import FreeGpu
from better_compute.projections import jsontext


@dataclass(frozen=True)
class NodeGpus:
    count: int  # every GPU of the node, healthy or not
    healthy: tuple[FreeGpu, ...]  # the healthy ones, in the column's order

    @property
    def healthy_uuids(self) -> list[str]:
        return [g.uuid for g in self.healthy]


@lru_cache(maxsize=16_384)
def parsed_node_gpus(raw: str) -> NodeGpus:
    """A node row's ``gpus`` column: ``[{"uuid", "index", "attributes"}, ...]``."""
    gpus = jsontext.loads(raw)
    healthy = tuple(FreeGpu(g["uuid"], int(g["index"]), MappingProxyType(g["attributes"]))
                    for g in gpus if g["attributes"].get("healthy"))
    return NodeGpus(len(gpus), healthy)


@lru_cache(maxsize=65_536)
def parsed_booking_gpus(raw: str) -> frozenset[str]:
    """A booking row's ``gpus`` column: the UUIDs it holds."""
    return frozenset(jsontext.loads(raw))
