"""`bcd status` as text, from the JSON the agent serves (docs/bcd.md shows an example)."""

from __future__ import annotations

from typing import Any


def _session(session: dict[str, Any]) -> str:
    state = session.get("state")
    gateway = session.get("gateway")
    if state == "connected":
        return (f"connected (epoch {session.get('epoch')}) to {gateway} "
                f"since {session.get('since')}")
    text = "connecting" if state == "connecting" else "disconnected"
    if session.get("epoch") is not None:
        text += f" (last epoch {session.get('epoch')})"
    text += f" to {gateway}"
    if session.get("lastError"):
        text += f": {session['lastError']}"
    return text


def _number(value: Any, unit: str, missing: str = "n/a") -> str:
    if value is None:
        return missing
    if isinstance(value, float):
        return f"{value:.1f}{unit}"
    return f"{value}{unit}"


def _gpu(gpu: dict[str, Any]) -> str:
    health = "healthy" if gpu.get("healthy") else (
        "unhealthy (" + (", ".join(gpu.get("healthReasons") or []) or "unknown") + ")")
    used, total = gpu.get("memoryUsedMiB"), gpu.get("memoryMiB")
    memory = f"{_number(used, '')}/{_number(total, '')} MiB"
    line = (f"gpu {gpu.get('index')}  {gpu.get('uuid')}  {gpu.get('name')}  {health}  "
            f"util {_number(gpu.get('utilizationPct'), '%')}  "
            f"temp {_number(gpu.get('temperatureC'), 'C')}  "
            f"power {_number(gpu.get('powerW'), 'W')}  mem {memory}")
    if gpu.get("heldBy"):
        line += f"  held by {gpu['heldBy']}"
    return line


def _kubelet(kubelet: dict[str, Any]) -> str:
    if not kubelet.get("enabled"):
        return f"kubelet  off: {kubelet.get('reason')}"
    resource = kubelet.get("resourceName")
    devices = kubelet.get("devices") or []
    healthy = sum(device.get("health") == "Healthy" for device in devices)
    if kubelet.get("registered"):
        state = f"registered as {resource} since {kubelet.get('since')}"
    else:
        state = f"not registered as {resource}: {kubelet.get('reason')}"
    return (f"kubelet  {state}; {len(devices)} GPUs listed ({healthy} healthy), "
            f"{kubelet.get('streams', 0)} ListAndWatch stream(s), plugin socket "
            f"{kubelet.get('socket')}")


def render_status(status: dict[str, Any]) -> str:
    node = status.get("node") or {}
    spec = status.get("spec") or {}
    lines = [
        f"node     {node.get('id')} (pool {node.get('poolId')}, site {node.get('siteId')}, "
        f"tenant {node.get('tenantId')})",
        f"session  {_session(status.get('session') or {})}",
        f"spec     applied generation {spec.get('appliedGeneration')}, "
        f"observed generation {spec.get('observedGeneration')}",
    ]
    sections = status.get("sections") or {}
    if not sections:
        lines.append("section  (none yet: no desired state received)")
    for name, section in sections.items():
        lines.append(f"section  {name}: {section.get('state')}: {section.get('message')}")
    source = status.get("gpuSource") or {}
    if source.get("error"):
        lines.append(f"gpus     {source.get('name')} source error: {source['error']}")
    gpus = status.get("gpus") or []
    if not gpus and not source.get("error"):
        lines.append(f"gpus     none ({source.get('name')} source)")
    lines.extend(_gpu(gpu) for gpu in gpus)
    shown = {gpu.get("uuid") for gpu in gpus}
    for uuid, allocation in (status.get("holds") or {}).items():
        if uuid not in shown:  # a held GPU the source no longer shows: the hold stays
            lines.append(f"gpu ?  {uuid}  missing from the GPU source  held by {allocation}")
    if status.get("kubernetes"):
        lines.append(_kubelet(status["kubernetes"]))
    journal = status.get("journal") or {}
    lines.append(f"journal  {journal.get('entries', 0)} entries, "
                 f"{journal.get('unacknowledged', 0)} not yet acknowledged")
    return "\n".join(lines) + "\n"
