"""Applying the desired state, section by section, idempotently.

Applying the same desired state twice does nothing the second time: each fact the
node reports is journaled once under its key (an acceptance attempt, an allocation's
binding), and a key already in the journal is never run or sent again, also after a
restart. A section bcd does not know is recorded as ``unsupported``; a ``devices``
section that is absent changes nothing (an empty one releases every hold), so bcd
never drops a hold on its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

from better_compute.api.wire.journal import AcceptanceResult, decode_entry
from better_compute.api.wire.sections import (
    AcceptanceSection,
    DevicesSection,
    KubernetesSection,
    ProfileSection,
    SectionInvalid,
    read,
)

from ..gpu import Inventory
from ..paths import Paths
from ..toolkit import apply_profile
from .devices import DevicesApplier
from .diag import run_check
from .journal import Entry, Journal
from .state import NodeState, SectionState


@dataclass(frozen=True)
class ApplyContext:
    node_id: str
    epoch: int
    time: str  # RFC 3339, now
    inventory: Inventory | None
    source_error: str | None
    paths: Paths
    devices: DevicesApplier
    cdi_generate: tuple[str, ...] | None = None  # config.toml [container_toolkit]


def _common(ctx: ApplyContext, kind: str) -> dict[str, Any]:
    return {"kind": kind, "nodeId": ctx.node_id, "epoch": ctx.epoch, "time": ctx.time}


def _set(state: NodeState, name: str, section: SectionState, ctx: ApplyContext) -> None:
    old = state.sections.get(name)
    if old is None or (old.state, old.message, old.attempt) != (section.state, section.message,
                                                                 section.attempt):
        section.since = ctx.time
    else:
        section.since = old.since
    state.sections[name] = section


def _acceptance_state(payload: dict[str, Any], generation: int) -> SectionState:
    entry = decode_entry(payload, AcceptanceResult)  # journaled by this bcd: it fits
    detail = "; ".join(check.message or "" for check in entry.checks) or "no checks"
    return SectionState(state="passed" if entry.passed else "failed",
                        message=f"attempt {entry.attempt}: {detail}", generation=generation,
                        attempt=entry.attempt)


def _apply_acceptance(raw: Any, state: NodeState, journal: Journal,
                      ctx: ApplyContext, generation: int) -> Entry | None:
    section = read(raw, AcceptanceSection, "acceptance")
    attempt = section.attempt
    key = f"acceptance.result/{attempt}"
    done = journal.payload_of(key)
    if done is not None:  # this attempt ran already (maybe before a restart): never again
        _set(state, "acceptance", _acceptance_state(done, generation), ctx)
        return None
    results = [run_check(check, ctx.inventory, ctx.source_error) for check in section.checks]
    payload = _common(ctx, "acceptance.result") | {
        "attempt": attempt,
        "passed": all(result.passed for result in results),
        "checks": msgspec.to_builtins(results),
        "gpus": msgspec.to_builtins(ctx.inventory.gpus) if ctx.inventory else [],
    }
    entry = journal.append(key, payload)
    _set(state, "acceptance", _acceptance_state(payload, generation), ctx)
    return entry


def _apply_devices(section: DevicesSection, state: NodeState, journal: Journal,
                   ctx: ApplyContext, generation: int) -> list[Entry]:
    outcome = ctx.devices(section, paths=ctx.paths, inventory=ctx.inventory,
                          holds=dict(state.holds), done=journal.has)
    entries = []
    for key, body in outcome.entries:
        if journal.has(key):
            continue
        kind = str(body.get("kind") or key.partition("/")[0])
        entries.append(journal.append(key, _common(ctx, kind) | body))
    state.holds = dict(outcome.holds)
    _set(state, "devices", SectionState(state=outcome.state, message=outcome.message,
                                        generation=generation), ctx)
    return entries


def _apply_profile(section: ProfileSection, state: NodeState, ctx: ApplyContext,
                   generation: int) -> None:
    result = apply_profile(section, ctx.paths, ctx.inventory, ctx.source_error,
                           ctx.cdi_generate, state.toolkit_fingerprint)
    state.toolkit_fingerprint = result.fingerprint
    _set(state, "profile", SectionState(state=result.state, message=result.message,
                                        generation=generation), ctx)


def _kubernetes_state(section: KubernetesSection, generation: int) -> SectionState:
    return SectionState(state="applied", generation=generation, message=(
        f"device plugin on: GPUs of kubernetes holds go to the kubelet as "
        f"{section.resource_name or None} (bcd status shows the registration)"))


def _apply_section(name: str, section: Any, state: NodeState, journal: Journal,
                   ctx: ApplyContext, generation: int) -> list[Entry]:
    """Apply one section (decoded here, once, as its Struct); the journal entries written."""
    if name == "acceptance":
        entry = _apply_acceptance(section, state, journal, ctx, generation)
        return [entry] if entry else []
    if name == "devices":
        return _apply_devices(read(section, DevicesSection, name), state, journal, ctx,
                              generation)
    if name == "profile":
        _apply_profile(read(section, ProfileSection, name), state, ctx, generation)
    elif name == "kubernetes":
        _set(state, name, _kubernetes_state(read(section, KubernetesSection, name), generation),
             ctx)
    else:
        _set(state, name, SectionState(
            state="unsupported", generation=generation,
            message=f"this bcd does not know the section {name!r}; upgrade bcd"), ctx)
    return []


def apply_desired(state: NodeState, journal: Journal, ctx: ApplyContext) -> list[Entry]:
    """Apply ``state.desired_sections`` (generation ``observed_generation``).

    Returns the journal entries written (already durable); updates ``state`` in place,
    ending with ``applied_generation = observed_generation``. The ``profile`` section goes
    first: a vendor CDI spec it generates is there for the holds ``devices`` binds.
    """
    generation = state.observed_generation
    written: list[Entry] = []
    for name, section in sorted(state.desired_sections.items(), key=lambda i: i[0] != "profile"):
        try:
            written += _apply_section(name, section, state, journal, ctx, generation)
        except SectionInvalid as exc:
            _set(state, name, SectionState(state="failed", generation=generation, message=(
                f"{exc}: this bcd cannot read what the control plane sent; upgrade bcd")), ctx)
    for name in list(state.sections):
        if name not in state.desired_sections and name != "devices":
            del state.sections[name]
    state.applied_generation = generation
    return written
