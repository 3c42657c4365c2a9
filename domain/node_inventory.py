"""What a node may change of its hardware on its own, and what only an operator may
(docs/nodes.md, "What a node may change").

A node's GPUs (which UUIDs, how many, of which model) are what its join recorded, checked
again at acceptance, and after that what an operator accepted: never what the node last said.
A node changes on its own only its GPUs' health (``node.gpu.*``), its telemetry (reports, not
events) and its bcd version. An ``acceptance.result`` or a report whose GPUs differ (one
added, missing, listed twice, of another model, or another node's) changes nothing: it is
recorded once as ``node.inventory.mismatch`` (condition ``InventoryMatches`` False) until
``nodes.acceptInventory`` takes what the node reports (``node.inventory.accepted``), after a
real repair. Kubernetes' NodeRestriction keeps a kubelet to its own Node object the same way;
Slurm drains a node whose GPUs differ from its configuration rather than believe it.

``compare_inventory`` is the rule (pure); the commands below are methods of ``Node``, assigned
in its class body (domain/node.py): each public one decides, each ``@event`` body assigns.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from eventsourcing.domain import event

from better_compute.domain.base import iso
from better_compute.domain.errors import Conflict
from better_compute.domain.gpus import Gpu

if TYPE_CHECKING:
    from better_compute.domain.node import Node

# What a node's GPU document keeps (its identity, its health): never telemetry.
GPU_KEYS = ("uuid", "name", "serial", "pciBusId", "memoryMiB", "nvlinkDomain", "product",
            "family", "healthy", "healthReasons", "index")
_HEALTH_KEYS = ("healthy", "healthReasons")
SHOWN = 5  # UUIDs a message names of each kind (the event lists them all)


def gpu_doc(gpu: Mapping[str, Any]) -> dict[str, Any]:
    """A reported GPU as a node keeps it: identity and health, known values only."""
    return {k: gpu[k] for k in GPU_KEYS if gpu.get(k) is not None}


@dataclass(frozen=True)
class InventoryDiff:
    """How the GPUs a node reported differ from the ones it has (all empty: they match)."""

    accepted: int  # GPUs the node has
    reported: int  # GPUs it listed (duplicates counted)
    added: tuple[str, ...] = ()  # listed, not the node's
    missing: tuple[str, ...] = ()  # the node's, not listed
    duplicated: tuple[str, ...] = ()  # listed more than once
    changed: tuple[str, ...] = ()  # the node's, listed as another model
    claimed: tuple[str, ...] = ()  # listed, and another node's

    @property
    def matches(self) -> bool:
        return not (self.added or self.missing or self.duplicated or self.changed
                    or self.claimed)

    def message(self) -> str:
        """What differs, for an operator and for the node's Nack."""
        parts = []
        for uuids, what in ((self.claimed, "belong to another node"),
                            (self.added, "are not this node's"),
                            (self.missing, "of this node are missing"),
                            (self.duplicated, "are listed more than once"),
                            (self.changed, "are listed as another model")):
            if uuids:
                named = ", ".join(uuids[:SHOWN]) + (f" and {len(uuids) - SHOWN} more"
                                                     if len(uuids) > SHOWN else "")
                parts.append(f"{len(uuids)} {what} ({named})")
        return (f"the node listed {self.reported} GPUs where {self.accepted} were accepted: "
                + "; ".join(parts) + ". Nothing changed: a node's GPUs change only when an "
                "operator accepts them (`better-compute nodes accept-inventory NODE`) after a "
                "real change of its hardware")

    def to_data(self) -> dict[str, Any]:
        return {"accepted": self.accepted, "reported_count": self.reported,
                "added": list(self.added), "missing": list(self.missing),
                "duplicated": list(self.duplicated), "changed": list(self.changed),
                "claimed": list(self.claimed)}


def compare_inventory(accepted: Sequence[Mapping[str, Any]],
                      reported: Sequence[Mapping[str, Any]],
                      claimed: Iterable[str] = ()) -> InventoryDiff:
    """``reported`` GPUs against the ``accepted`` ones; ``claimed``: the reported UUIDs that
    another node holds (domain/gpu_claims.py)."""
    mine = {g.uuid: g for g in (Gpu.from_doc(doc) for doc in accepted)}
    listed = [Gpu.from_doc(doc) for doc in reported]
    counts = Counter(g.uuid for g in listed)
    others = set(claimed)
    seen: dict[str, Gpu] = {}
    for gpu in listed:
        seen.setdefault(gpu.uuid, gpu)
    return InventoryDiff(
        accepted=len(mine), reported=len(listed),
        added=tuple(u for u in seen if u not in mine and u not in others),
        missing=tuple(u for u in mine if u not in counts),
        duplicated=tuple(u for u, n in counts.items() if n > 1),
        changed=tuple(u for u, g in seen.items() if u in mine and g.model != mine[u].model),
        claimed=tuple(u for u in seen if u in others),
    )


def identity(gpus: Sequence[Mapping[str, Any]]) -> list[list[str | None]]:
    """Which GPUs, in order, and of which model: what a mismatch is about (not health)."""
    return [[g.uuid, g.model] for g in (Gpu.from_doc(doc) for doc in gpus)]


def with_reported_health(accepted: Sequence[Mapping[str, Any]],
                         reported: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The accepted GPUs, with the health (and what the join did not record, such as the
    index) of the same GPUs as reported: what a node is adopted with."""
    by_uuid = {str(g.get("uuid")): g for g in reported}
    out = []
    for doc in accepted:
        seen = by_uuid.get(str(doc.get("uuid")), {})
        merged = {**gpu_doc(seen), **gpu_doc(doc)}
        merged.update({k: seen[k] for k in _HEALTH_KEYS if k in seen})
        out.append(merged)
    return out


# --------------------------------------------------------------- Node's methods

def note_inventory_mismatch(self: Node, diff: InventoryDiff, reported: list[dict[str, Any]],
                            source: str, at: datetime) -> bool:
    """Record that the node listed other GPUs than its own (``source``: ``acceptance.result``
    or ``report``); False when they match, or the pending mismatch already says the same."""
    if diff.matches:
        return False
    pending = self.inventory_mismatch
    if pending is not None and pending.get("identity") == identity(reported) \
            and pending.get("claimed") == list(diff.claimed):
        return False  # the same GPUs again (their health may differ: that is not news)
    self._inventory_mismatch(source=source, message=diff.message(), reported=reported,
                             at=at, **diff.to_data())
    return True


@event("InventoryMismatch", topic="node.inventory.mismatch")
def _inventory_mismatch(self: Node, source: str, message: str, reported: list[dict[str, Any]],
                        at: datetime, accepted: int, reported_count: int, added: list[str],
                        missing: list[str], duplicated: list[str], changed: list[str],
                        claimed: list[str]) -> None:
    self.inventory_mismatch = {"source": source, "message": message, "reported": reported,
                               "identity": identity(reported), "claimed": claimed,
                               "at": iso(at)}
    self._touch(at)


def accept_inventory(self: Node, gpus: list[dict[str, Any]], at: datetime, by: str | None,
                     reason: str) -> None:
    """An operator takes ``gpus`` (what the node reports, checked by the caller against the
    pool and the other nodes) as the node's GPUs, and the pending mismatch ends."""
    if self.removed:
        raise Conflict(f"node {self.public_id} was removed: it has no GPUs to accept")
    self._inventory_accepted(gpus=gpus, previous=[g.uuid for g in self.gpu_values()], at=at,
                             by=by, reason=reason)


@event("InventoryAccepted", topic="node.inventory.accepted")
def _inventory_accepted(self: Node, gpus: list[dict[str, Any]], previous: list[str],
                        at: datetime, by: str | None, reason: str) -> None:
    self.gpus = gpus
    self.inventory_mismatch = None
    self._touch(at)
