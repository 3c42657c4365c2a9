"""GPUs as the control plane holds them: the ``Gpu`` value (its health rule, defined once)
and the GPU model a pool holds, read from a user's spelling (the table: domain/gpu_models.py)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from better_compute.domain.errors import InvalidInput
from better_compute.domain.gpu_models import (
    MAX_NAME,
    ambiguous,
    card_model,
    clean,
    is_driver_name,
    known_model,
    model_names,
)


def parse_gpu_model(text: str, flag: str = "--gpu-model") -> str:
    """A user's spelling of a GPU model as the product spells it (``RTX 6000 Ada`` for
    ``rtx-6000-ada``, ``H100`` for ``H100-SXM5-80GB``); a GPU the table does not know is
    given by the name its driver reports (``NVIDIA B40``) and kept as written."""
    shown = clean(text)
    if len(shown) > MAX_NAME:
        raise InvalidInput(f"{flag} is {len(shown):,} characters long: a GPU model is at most "
                           f"{MAX_NAME}, such as H100 or 'RTX 6000 Ada'")
    found = known_model(shown)
    if found is not None:
        return found.name
    choices = ambiguous(shown)
    if choices:
        raise InvalidInput(
            f"{flag} {shown!r} could be any of {', '.join(choices)}: these are different GPUs, "
            f"so name one, as in {flag} {choices[0]!r} (docs/gpu-models.md)"
        )
    if not is_driver_name(shown):
        raise InvalidInput(
            f"{flag} {shown!r} names no GPU family this control plane knows: use one such as "
            f"H100 (known: {', '.join(model_names())}); for a GPU not listed, pass the name its "
            f"driver reports, as in {flag} 'NVIDIA B40' (nvidia-smi --query-gpu=name "
            "--format=csv,noheader prints it)"
        )
    return shown


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
        """Its model (domain/gpu_models.py ``card_model``): the table's model its name (else
        its reported family) names, else the name itself."""
        return card_model(self.name, self.family)

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
    """``Gpu.healthy`` of a GPU document (docs/capacity.md), read from the document without
    making the value: every event of a node checks each of its GPUs (its conditions), so
    this is on the path of every load and every read model's apply
    (tests/unit/test_gpu_value.py holds it equal to ``Gpu.from_doc(gpu).healthy``)."""
    return bool(gpu.get("healthy", True)) and not gpu.get("healthReasons")


def with_health(doc: Mapping[str, Any], healthy: bool, reasons: Iterable[str]) -> dict[str, Any]:
    """The GPU document after a health change (``node.gpu.healthy`` / ``unhealthy``)."""
    return {**doc, "healthy": healthy, "healthReasons": [] if healthy else list(reasons)}
