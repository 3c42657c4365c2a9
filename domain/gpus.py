"""GPUs as the control plane holds them: the ``Gpu`` value (its health rule, defined once)
and GPU families (the model a pool holds, derived from a card's name)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from better_compute.domain.errors import InvalidInput

# Longest names first so that H100 is not read as H10, L40S not as L40 or L4.
FAMILIES = (
    "GB300", "GB200", "B300", "B200", "B100", "H200", "H800", "H100", "H20", "GH200",
    "A800", "A100", "A40", "A30", "A16", "A10G", "A10", "A2", "L40S", "L40", "L20", "L4",
    "V100", "T4", "RTX6000", "MI300X", "MI250X",
)
_FAMILY_RE = re.compile(
    r"(?<![A-Z0-9])(" + "|".join(sorted(FAMILIES, key=len, reverse=True)) + r")(?![0-9])"
)


def gpu_family(name: str) -> str | None:
    """The family in a card's name: H100 for "NVIDIA H100 80GB HBM3" and "H100-SXM5-80GB"."""
    compact = name.upper().replace("RTX 6000", "RTX6000")
    match = _FAMILY_RE.search(compact)
    return match.group(1) if match else None


def parse_gpu_model(text: str) -> str:
    family = gpu_family(text)
    if family is None:
        raise InvalidInput(
            f"--gpu-model {text!r} names no GPU family this control plane knows: use a family "
            f"such as H100 (known: {', '.join(sorted(FAMILIES))})"
        )
    return family


@dataclass(frozen=True)
class Gpu:
    """One GPU of a node, read from the document bcd reported for it (its inventory entry:
    camelCase keys, as node events and documents store it; absent keys read as unknown).

    ``healthy`` is THE GPU health rule, used by capacity, ``Node.schedulable``, the free-GPU
    index, the placer, the gateway and every listing: a GPU is healthy when it is not
    reported unhealthy (``healthy`` false) AND carries no ``healthReasons``
    (docs/capacity.md).
    """

    uuid: str
    reported_healthy: bool = True
    health_reasons: tuple[str, ...] = ()
    index: int | None = None
    name: str = ""
    family: str | None = None
    product: str | None = None
    memory_mib: float | None = None
    nvlink_domain: str | None = None

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any]) -> Gpu:
        reasons = doc.get("healthReasons") or ()
        memory = doc.get("memoryMiB")
        index = doc.get("index")
        domain = doc.get("nvlinkDomain")
        return cls(
            uuid=str(doc.get("uuid") or ""),
            reported_healthy=bool(doc.get("healthy", True)),
            health_reasons=tuple(str(r) for r in reasons) if isinstance(reasons, list | tuple)
            else (str(reasons),),
            index=index if isinstance(index, int) and not isinstance(index, bool) else None,
            name=str(doc.get("name") or ""),
            family=str(doc["family"]) if doc.get("family") else None,
            product=str(doc["product"]) if doc.get("product") else None,
            memory_mib=memory if isinstance(memory, int | float)
            and not isinstance(memory, bool) else None,
            nvlink_domain=str(domain) if domain is not None else None,
        )

    @property
    def healthy(self) -> bool:
        return self.reported_healthy and not self.health_reasons

    @property
    def model(self) -> str | None:
        """The family it reported, else the one its name says (H100, L40S, ...)."""
        return self.family or gpu_family(self.name)

    @property
    def why_unhealthy(self) -> str:
        """Its reasons as operators read them (``xid-79, ecc-uncorrected``)."""
        return ", ".join(self.health_reasons) or "unhealthy"

    def health(self) -> tuple[bool, tuple[str, ...]]:
        """What a health change compares: the verdict and the reasons behind it."""
        return self.healthy, self.health_reasons


def gpus_of(docs: Iterable[Mapping[str, Any]]) -> list[Gpu]:
    """The values of GPU documents (a node's ``gpus``, an inventory's)."""
    return [Gpu.from_doc(doc) for doc in docs]


def gpu_is_healthy(gpu: Mapping[str, Any]) -> bool:
    """``Gpu.healthy`` of a GPU document (docs/capacity.md)."""
    return Gpu.from_doc(gpu).healthy


def with_health(doc: Mapping[str, Any], healthy: bool, reasons: Iterable[str]) -> dict[str, Any]:
    """The GPU document after a health change (``node.gpu.healthy`` / ``unhealthy``)."""
    return {**doc, "healthy": healthy, "healthReasons": [] if healthy else list(reasons)}
