"""Rules of the node lifecycle that need no aggregate: acceptance checks and capacity shares.

``evaluate_acceptance`` is the control plane's own reading of an
``acceptance.result`` journal entry: bcd says whether its checks passed, and
the control plane checks the GPUs the entry lists against the pool's policy
again, so a node never gets adopted on its word alone.

``node_capacity`` is the one definition of what a node adds to its pool's
capacity rollup (docs/capacity.md); the capacity projection and the property
test that recomputes the rollup from the aggregates both use it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from better_compute.domain.gpu_models import same_model
from better_compute.domain.gpus import gpu_is_healthy, gpus_of

# Session states of a node (docs/nodes.md).
SESSION_NEVER = "never"
SESSION_CONNECTED = "connected"
SESSION_DISCONNECTED = "disconnected"
SESSION_UNREACHABLE = "unreachable"

# Provision states: adopting (joined, acceptance to pass), adopted, removed (out of its pool).
PROVISION_ADOPTING = "adopting"
PROVISION_ADOPTED = "adopted"
PROVISION_REMOVED = "removed"

# Acceptance states: pending (no attempt yet), running, passed, failed (sticky).
ACCEPTANCE_PENDING = "pending"
ACCEPTANCE_RUNNING = "running"
ACCEPTANCE_PASSED = "passed"
ACCEPTANCE_FAILED = "failed"

GPU_FIELDS = ("total", "allocatable", "allocated", "reserved", "available", "provisioning",
              "unhealthy", "maintenance", "unreachable")
HOST_FIELDS = ("total", "allocatable", "allocated", "reserved", "available")
RESOURCES = ("gpu", "cpu", "memory")


def placement_eligible(provision_state: str, session: str, cordoned: bool, draining: bool,
                       gpus: list[dict[str, Any]]) -> bool:
    """May the placer put NEW work on a node? The one rule (docs/nodes.md, "Schedulable").

    Adopted (not adopting, not removed), reachable, neither cordoned nor
    draining, and some GPU healthy. Holds already on a node are never
    affected by this: it decides new placements (and the earliest-start
    search) only.
    """
    return (provision_state == "adopted" and session != SESSION_UNREACHABLE and not cordoned
            and not draining and any(gpu_is_healthy(g) for g in gpus))


def acceptance_checks(policy: dict[str, Any], gpu_model: str) -> list[dict[str, Any]]:
    """The checks a pool's policy asks for, as the ``acceptance`` section carries them."""
    expect = dict(policy.get("expect") or {})
    checks: list[dict[str, Any]] = []
    for check in policy.get("acceptance") or []:
        kind = check.get("kind")
        if kind == "diag.nvml":
            checks.append({"kind": kind, "expect": {"gpuCount": expect.get("gpuCount"),
                                                   "gpuModel": gpu_model}})
        else:  # a kind added to policies later: sent as written
            checks.append(dict(check))
    return checks


def diag_nvml(expect: dict[str, Any], gpus: list[dict[str, Any]]) -> tuple[bool, str]:
    """``diag.nvml``: at least ``gpuCount`` healthy GPUs of the pool's model."""
    count = int(expect.get("gpuCount") or 0)
    model = str(expect.get("gpuModel") or "")
    fitting = [g for g in gpus_of(gpus) if same_model(g.model, model)]
    healthy = [g for g in fitting if g.healthy]
    if len(healthy) >= count:
        return True, f"{len(healthy)} healthy {model} GPUs (expected {count})"
    sick = [f"{g.uuid} ({g.why_unhealthy})" for g in fitting if not g.healthy]
    other = len(gpus) - len(fitting)
    parts = [f"{len(healthy)} healthy {model} GPUs, expected {count}"]
    if sick:
        parts.append("unhealthy: " + "; ".join(sick))
    if other:
        parts.append(f"{other} GPUs of another model")
    return False, ", ".join(parts) + ": fix or replace the GPUs, then run nodes.adopt"


@dataclass(frozen=True)
class AcceptanceVerdict:
    passed: bool
    message: str
    checks: list[dict[str, Any]]


def evaluate_acceptance(checks: list[dict[str, Any]], reported: dict[str, Any]) -> AcceptanceVerdict:
    """Our verdict on an ``acceptance.result`` entry (``reported``: as the gateway decoded it,
    api/wire/journal.py ``AcceptanceResult``, in builtins): every check must pass, ours and
    bcd's."""
    by_kind = {c.get("kind"): c for c in reported.get("checks") or []}
    gpus = list(reported.get("gpus") or [])
    results: list[dict[str, Any]] = []
    for check in checks:
        kind = check.get("kind")
        theirs = by_kind.get(kind)
        if kind == "diag.nvml":
            ok, message = diag_nvml(check.get("expect") or {}, gpus)
        else:
            ok, message = True, "checked by bcd only"
        if not ok:
            pass  # our own reading names the problem best
        elif theirs is None:
            ok, message = False, f"bcd reported no result for {kind}"
        elif not theirs.get("passed"):
            ok, message = False, str(theirs.get("message") or f"bcd says {kind} failed")
        results.append({"kind": kind, "passed": ok, "message": message})
    if not reported.get("passed", False) and all(r["passed"] for r in results):
        results.append({"kind": "bcd", "passed": False,
                        "message": str(reported.get("message") or "bcd reported a failure")})
    failed = [r for r in results if not r["passed"]]
    if failed:
        return AcceptanceVerdict(False, "; ".join(f"{r['kind']}: {r['message']}" for r in failed),
                                 results)
    return AcceptanceVerdict(True, "every acceptance check passed", results)


def node_capacity(provision_state: str, session: str, cordoned: bool,
                  gpus: list[dict[str, Any]], cpus: float, memory_gib: float,
                  holds: list[dict[str, Any]] | tuple[dict[str, Any], ...] = ()
                  ) -> dict[str, dict[str, float]]:
    """What one node adds to its pool's rollup, per resource (docs/capacity.md).

    Each GPU is counted once, in the first of: provisioning (the node is not
    adopted), unreachable, maintenance (cordoned), unhealthy; the rest are
    allocatable. CPUs and memory are allocatable when the node is adopted,
    reachable and not cordoned. ``holds`` are the node's device assignments:
    their GPUs, CPUs and memory are allocated (whatever state the GPU is in:
    a hold is never dropped), and available is allocatable less what holds
    take of it. reserved (booked, not yet held) is 0 here: nodes do not know
    about bookings that have not started.
    """
    if provision_state == "removed":  # it left the pool: it adds nothing
        return {"gpu": dict.fromkeys(GPU_FIELDS, 0.0), "cpu": dict.fromkeys(HOST_FIELDS, 0.0),
                "memory": dict.fromkeys(HOST_FIELDS, 0.0)}
    total = len(gpus)
    gpu = dict.fromkeys(GPU_FIELDS, 0.0)
    gpu["total"] = total
    if provision_state != "adopted":
        gpu["provisioning"] = total
    elif session == SESSION_UNREACHABLE:
        gpu["unreachable"] = total
    elif cordoned:
        gpu["maintenance"] = total
    else:
        sick = sum(1 for g in gpus_of(gpus) if not g.healthy)
        gpu["unhealthy"] = sick
        gpu["allocatable"] = total - sick
    usable = provision_state == "adopted" and session != SESSION_UNREACHABLE and not cordoned
    held = {str(u) for h in holds for u in h.get("gpus") or []}
    known = {g.uuid: g for g in gpus_of(gpus)}
    gpu["allocated"] = sum(1 for u in held if u in known)
    held_allocatable = sum(1 for u in held if u in known and usable and known[u].healthy)
    gpu["available"] = gpu["allocatable"] - held_allocatable
    cpu = dict.fromkeys(HOST_FIELDS, 0.0)
    memory = dict.fromkeys(HOST_FIELDS, 0.0)
    cpu["total"], memory["total"] = float(cpus), float(memory_gib)
    cpu["allocated"] = float(sum(_num(h.get("cpus")) for h in holds))
    memory["allocated"] = float(sum(_num(h.get("memoryGiB")) for h in holds))
    if usable:
        cpu["allocatable"] = float(cpus)
        memory["allocatable"] = float(memory_gib)
        cpu["available"] = max(0.0, cpu["allocatable"] - cpu["allocated"])
        memory["available"] = max(0.0, memory["allocatable"] - memory["allocated"])
    return {"gpu": gpu, "cpu": cpu, "memory": memory}


def _num(value: Any) -> float:
    try:
        return float(value or 0)
    except (TypeError, ValueError):
        return 0.0
