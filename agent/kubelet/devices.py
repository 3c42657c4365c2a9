"""What bcd's device plugin tells the kubelet, decided without sockets.

* :func:`advertised`: the devices ListAndWatch lists. Exactly the GPUs held on this node
  by assignments marked ``kubernetes`` in the desired state: a hold of a plain reservation,
  a GPU nobody holds, or a hold whose assignment left the desired state (a release under
  way) is never listed. Device id = the GPU's UUID; ``Healthy`` / ``Unhealthy`` follow the
  GPU source (a held GPU the source no longer shows, or a source that cannot be read, is
  Unhealthy: the kubelet then places no new pod on it, and nothing drops the hold).
* :func:`allocate`: Allocate's answer for one container: the CDI names of the GPUs (the
  hold's spec defines them) and envs naming the allocation; an id that is not listed now
  is refused with :class:`NotHeld`, which names it.
* :func:`preferred`: GetPreferredAllocation: GPUs of one reservation and one NVLink domain
  first.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from better_compute.api.wire.sections import (
    Assignment,
    KubernetesSection,
    SectionInvalid,
    assignments,
    read_section,
)

from ..cdi import device_name
from ..gpu.model import Inventory

HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"


@dataclass(frozen=True)
class KubeletDevice:
    """One GPU as the kubelet sees it, with the hold it belongs to."""

    id: str  # the GPU UUID
    healthy: bool
    allocation_id: str
    reservation_id: str
    index: int | None = None
    numa_node: int | None = None
    nvlink_domain: str | None = None
    reasons: tuple[str, ...] = ()

    @property
    def health(self) -> str:
        return HEALTHY if self.healthy else UNHEALTHY


def resource_name(sections: Mapping[str, Any]) -> str | None:
    """The resource to register (the ``kubernetes`` section), or None: no plugin here."""
    try:
        section = read_section(sections, "kubernetes", KubernetesSection)
    except SectionInvalid:
        return None
    return (section.resource_name or None) if section is not None else None


def _kubernetes_assignments(sections: Mapping[str, Any]) -> dict[str, Assignment]:
    """The assignments that hand their GPUs to the kubelet (a malformed one hands none)."""
    return {a.allocation_id: a for a in assignments(sections) if a.kubernetes}


def advertised(sections: Mapping[str, Any], holds: Mapping[str, str],
               inventory: Inventory | None, source_error: str | None = None
               ) -> list[KubeletDevice]:
    """The devices to list: GPUs held here for kubernetes assignments, in GPU index order.

    ``holds`` maps GPU UUID -> allocation id (bcd's state); ``sections`` is the desired
    state the holds are judged against, so passing the NEW desired state before a release
    is applied withdraws the released GPUs first.
    """
    kubernetes = _kubernetes_assignments(sections)
    gpus = {gpu.uuid: gpu for gpu in inventory.gpus} if inventory is not None else {}
    out: list[KubeletDevice] = []
    for uuid, allocation_id in holds.items():
        assignment = kubernetes.get(allocation_id)
        if assignment is None or uuid not in assignment.gpus:
            continue
        gpu = gpus.get(uuid)
        reservation_id = assignment.reservation_id
        if gpu is None:
            why = f"GPU source error: {source_error}" if inventory is None else \
                "missing from the GPU source"
            out.append(KubeletDevice(uuid, False, allocation_id, reservation_id, reasons=(why,)))
            continue
        out.append(KubeletDevice(
            uuid, gpu.is_healthy, allocation_id, reservation_id,
            index=gpu.index, numa_node=gpu.numa_node, nvlink_domain=gpu.nvlink_domain,
            reasons=tuple(gpu.health_reasons)))
    out.sort(key=lambda d: (d.index if d.index is not None else 1 << 30, d.id))
    return out


class NotHeld(Exception):
    """Allocate asked for GPUs this node does not hold for a kubernetes reservation."""

    def __init__(self, ids: Sequence[str], resource: str) -> None:
        self.ids = list(ids)
        super().__init__(
            f"{', '.join(self.ids)} {'is' if len(self.ids) == 1 else 'are'} not held for a "
            f"kubernetes reservation on this node, so bcd does not hand "
            f"{'it' if len(self.ids) == 1 else 'them'} out as {resource}: reserve with "
            "`better-compute reserve --kubernetes` (the kubelet's list may be stale: it gets "
            "a new one whenever a hold comes or goes)"
        )


@dataclass(frozen=True)
class ContainerGrant:
    """Allocate's answer for one container."""

    cdi_devices: list[str]
    envs: dict[str, str]


def _joined(values: Iterable[str]) -> str:
    return ",".join(sorted(set(values)))


def allocate(requested: Sequence[str], devices: Sequence[KubeletDevice],
             resource: str) -> ContainerGrant:
    """The CDI names and envs for ``requested`` GPU ids; NotHeld names any that is not listed."""
    listed = {device.id: device for device in devices}
    wanted = list(dict.fromkeys(requested))
    missing = [uuid for uuid in wanted if uuid not in listed]
    if missing:
        raise NotHeld(missing, resource)
    chosen = [listed[uuid] for uuid in wanted]
    cdi_devices = [device_name(device.id) for device in chosen]
    envs = {
        "NVIDIA_VISIBLE_DEVICES": ",".join(device.id for device in chosen),
        "BCD_ALLOCATION_ID": _joined(device.allocation_id for device in chosen),
        "BCD_RESERVATION_ID": _joined(device.reservation_id for device in chosen),
        "BCD_CDI_DEVICES": ",".join(cdi_devices),
    }
    return ContainerGrant(cdi_devices, envs)


def preferred(available: Sequence[str], must_include: Sequence[str], size: int,
              devices: Sequence[KubeletDevice]) -> list[str]:
    """``size`` ids from ``available`` (``must_include`` first): one reservation, one domain.

    Starting from ``must_include``, the rest comes from their reservation and NVLink domain
    first. With nothing to start from: the smallest group of one reservation AND one domain
    that holds ``size`` (best fit keeps bigger groups whole for bigger pods), else the
    smallest reservation that does, else the smallest domain, else the biggest groups first.
    Ties go to the lower GPU index.
    """
    known = {device.id: device for device in devices}
    order = {device.id: n for n, device in enumerate(devices)}

    def rank(uuid: str) -> tuple[int, str]:
        return order.get(uuid, len(order)), uuid

    def allocation(uuid: str) -> str:
        device = known.get(uuid)
        return device.allocation_id if device else ""

    def domain(uuid: str) -> str | None:
        device = known.get(uuid)
        return device.nvlink_domain if device else None

    picked = list(dict.fromkeys(must_include))
    need = size - len(picked)
    if need <= 0:
        return picked
    rest = sorted({uuid for uuid in available if uuid not in picked}, key=rank)
    if picked:
        allocations = {allocation(uuid) for uuid in picked}
        domains = {domain(uuid) for uuid in picked if domain(uuid) is not None}
        rest.sort(key=lambda u: (allocation(u) not in allocations, domain(u) not in domains,
                                 rank(u)))
        return picked + rest[:need]
    for key in (lambda u: (allocation(u), domain(u)), allocation, domain):
        groups: dict[Any, list[str]] = {}
        for uuid in rest:
            groups.setdefault(key(uuid), []).append(uuid)
        fits = [g for k, g in groups.items() if len(g) >= need and k not in (None, "", ("", None))]
        if fits:
            return min(fits, key=lambda g: (len(g), rank(g[0])))[:need]
    sizes: dict[Any, int] = {}
    for uuid in rest:
        for group_key in (allocation(uuid), (allocation(uuid), domain(uuid))):
            sizes[group_key] = sizes.get(group_key, 0) + 1
    rest.sort(key=lambda u: (-sizes[allocation(u)], -sizes[(allocation(u), domain(u))],
                             rank(u)))
    return rest[:need]
