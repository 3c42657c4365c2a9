"""Acceptance checks bcd runs for the control plane before a node is adopted.

``diag.nvml``: passes when the GPU source (NVML, nvidia-smi or the fake file) shows
exactly ``expect.gpuCount`` healthy GPUs of the family ``expect.gpuModel`` (the pool's
``--gpu-model``; the family is derived from each card's name, agent/gpu/family.py),
and no GPU of another family. Without ``gpuCount`` any number of at least one passes;
without ``gpuModel`` any family does. The message says which GPUs fell short and why.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import msgspec

from ..gpu import Gpu, Inventory


class CheckResult(msgspec.Struct, kw_only=True):
    kind: str
    passed: bool
    message: str


def _describe(gpu: Gpu) -> str:
    return f"GPU {gpu.index} ({gpu.uuid}) is unhealthy ({gpu.why_unhealthy})"


def diag_nvml(expect: Mapping[str, Any], inventory: Inventory | None,
              source_error: str | None = None) -> CheckResult:
    kind = "diag.nvml"
    if inventory is None:
        return CheckResult(kind=kind, passed=False,
                           message=f"the GPU source cannot be read: {source_error or 'no inventory'}")
    model = expect.get("gpuModel")
    count = expect.get("gpuCount")
    wanted = str(model).lower() if model else None

    def of_model(gpu: Gpu) -> bool:
        return wanted is None or (gpu.family or "").lower() == wanted

    healthy = [gpu for gpu in inventory.gpus if gpu.is_healthy and of_model(gpu)]
    problems = [_describe(gpu) for gpu in inventory.gpus if not gpu.is_healthy]
    strangers = [gpu for gpu in inventory.gpus if not of_model(gpu)]
    problems += [f"GPU {gpu.index} is a {gpu.name} (family {gpu.family or 'unknown'}), "
                 f"not {model}" for gpu in strangers]
    label = f"healthy {model} GPUs" if model else "healthy GPUs"
    if isinstance(count, int) and not isinstance(count, bool):
        passed = len(healthy) == count and not strangers
        summary = f"{len(healthy)} {label}, expected {count}"
    else:
        passed = bool(healthy) and not problems
        summary = f"{len(healthy)} {label} of {len(inventory.gpus)}"
    if passed:
        return CheckResult(kind=kind, passed=True, message=f"{summary} ({inventory.source})")
    detail = "; ".join(problems) if problems else "fewer GPUs than the pool expects"
    return CheckResult(kind=kind, passed=False,
                       message=f"{summary} ({inventory.source}): {detail}")


CheckFunction = Callable[[Mapping[str, Any], Inventory | None, str | None], CheckResult]
CHECKS: dict[str, CheckFunction] = {"diag.nvml": diag_nvml}


def run_check(check: Mapping[str, Any], inventory: Inventory | None,
              source_error: str | None) -> CheckResult:
    kind = str(check.get("kind", ""))
    function = CHECKS.get(kind)
    if function is None:
        return CheckResult(kind=kind, passed=False, message=(
            f"bcd does not know the check {kind!r} (it knows {', '.join(sorted(CHECKS))}): "
            "upgrade bcd or remove the check from the pool's policy"))
    expect = check.get("expect") or {}
    return function(expect if isinstance(expect, Mapping) else {}, inventory, source_error)
