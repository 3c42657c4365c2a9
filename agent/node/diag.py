"""Acceptance checks bcd runs for the control plane before a node is adopted.

``diag.nvml``: passes when the GPU source (NVML, nvidia-smi or the fake file) shows
exactly ``expect.gpuCount`` healthy GPUs of the model ``expect.gpuModel`` (the pool's
``--gpu-model``; each card's model is read from its name by the one table of GPU models,
domain/gpu_models.py, through agent/gpu/family.py),
and no GPU of another family. Without ``gpuCount`` any number of at least one passes;
without ``gpuModel`` any family does. The message says which GPUs fell short and why.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import msgspec

from better_compute.api.wire.sections import Check, SectionInvalid, read

from ..gpu import Gpu, Inventory
from ..gpu.family import card_model, same_model


class NvmlExpect(msgspec.Struct, rename="camel", kw_only=True):
    """What ``diag.nvml`` expects (the pool's policy): how many GPUs, of which family."""

    gpu_count: int | None = None
    gpu_model: str | None = None


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
    try:
        wants = read(expect, NvmlExpect, "acceptance")
    except SectionInvalid as exc:
        return CheckResult(kind=kind, passed=False, message=f"{exc}: the pool's policy is "
                           "not one this bcd reads; upgrade bcd")
    model, count = wants.gpu_model, wants.gpu_count

    def of_model(gpu: Gpu) -> bool:  # the one table's rule (domain/gpu_models.py)
        return not model or same_model(card_model(gpu.name, gpu.family), model)

    healthy = [gpu for gpu in inventory.gpus if gpu.is_healthy and of_model(gpu)]
    problems = [_describe(gpu) for gpu in inventory.gpus if not gpu.is_healthy]
    strangers = [gpu for gpu in inventory.gpus if not of_model(gpu)]
    problems += [f"GPU {gpu.index} is a {gpu.name} (family {gpu.family or 'unknown'}), "
                 f"not {model}" for gpu in strangers]
    label = f"healthy {model} GPUs" if model else "healthy GPUs"
    if count is not None:
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


def run_check(check: Check, inventory: Inventory | None,
              source_error: str | None) -> CheckResult:
    function = CHECKS.get(check.kind)
    if function is None:
        return CheckResult(kind=check.kind, passed=False, message=(
            f"bcd does not know the check {check.kind!r} (it knows "
            f"{', '.join(sorted(CHECKS))}): upgrade bcd or remove the check from the pool's "
            "policy"))
    return function(check.expect, inventory, source_error)
