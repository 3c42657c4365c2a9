"""GPU families: the model a pool holds, derived from a card's name."""

from __future__ import annotations

import re
from collections.abc import Mapping
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


def gpu_is_healthy(gpu: Mapping[str, Any]) -> bool:
    """THE GPU health rule, used by capacity, ``Node.schedulable``, the free-GPU index,
    the placer and every listing: a GPU is healthy when it is not reported unhealthy
    (``healthy`` false) AND carries no ``healthReasons`` (docs/capacity.md)."""
    return bool(gpu.get("healthy", True)) and not gpu.get("healthReasons")
