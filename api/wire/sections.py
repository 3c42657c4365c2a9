"""The sections of a node's desired state (``DesiredState.sections``, api/wire/gateway.py), typed.

The message carries its sections as a JSON object by name, so that a section this bcd does
not know is kept (and reported ``unsupported``); bcd keeps them so in its state file. Each
section it knows is read ONCE where it is used, with :func:`read_section`, as the Struct
below; unknown fields are ignored (a newer control plane may send more), a field of the
wrong type is ``SectionInvalid`` naming it (the section's state says so).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

import msgspec

__all__ = ["AcceptanceSection", "Assignment", "Check", "DevicesSection", "KubernetesSection",
           "ProfileSection", "SectionInvalid", "assignments", "profile_units", "read",
           "read_section"]


class SectionInvalid(ValueError):
    """A section of the desired state does not fit its schema; the message names the field."""


class Check(msgspec.Struct, kw_only=True):
    """One acceptance check: its kind and what the pool's policy expects of it (per kind:
    ``diag.nvml`` expects ``gpuCount`` and ``gpuModel``)."""

    kind: str = ""
    expect: dict[str, Any] = msgspec.field(default_factory=dict)


class AcceptanceSection(msgspec.Struct, kw_only=True):
    """``acceptance``: the checks of one attempt, run once and journaled."""

    attempt: int = 0
    state: str | None = None
    checks: list[Check] = msgspec.field(default_factory=list)


class Assignment(msgspec.Struct, rename="camel", kw_only=True):
    """One hold of the ``devices`` section: a reservation's GPUs, CPUs and memory."""

    allocation_id: str
    reservation_id: str
    gpus: list[str]
    cpus: float | None = None
    memory_gib: float | None = msgspec.field(default=None, name="memoryGiB")
    kubernetes: bool = False  # its GPUs go to the kubelet (docs/kubernetes.md)


class DevicesSection(msgspec.Struct, kw_only=True):
    """``devices``: every hold the node must keep. Each assignment is read on its own (as an
    ``Assignment``), so that one malformed assignment fails alone."""

    assignments: list[Any] = msgspec.field(default_factory=list)


class KubernetesSection(msgspec.Struct, rename="camel", kw_only=True):
    """``kubernetes``: bcd serves its kubelet device plugin for this resource."""

    resource_name: str = ""


class ProfileSection(msgspec.Struct, kw_only=True):
    """``profile``: the units bcd runs on the node (``container-toolkit``)."""

    units: list[str] = msgspec.field(default_factory=list)


S = TypeVar("S", bound=msgspec.Struct)


def read_section(sections: Mapping[str, Any], name: str, kind: type[S]) -> S | None:
    """Section ``name`` of ``sections`` as ``kind``; None when it is absent."""
    raw = sections.get(name)
    return None if raw is None else read(raw, kind, name)


def read(raw: Any, kind: type[S], what: str) -> S:
    """``raw`` (builtins) as ``kind``; SectionInvalid says which field of ``what`` misfits."""
    try:
        return msgspec.convert(raw, kind)
    except msgspec.ValidationError as exc:
        raise SectionInvalid(f"the {what} section: {exc}") from None


def assignments(sections: Mapping[str, Any]) -> list[Assignment]:
    """The well-formed assignments of the ``devices`` section (a malformed one is left out
    here; binding it reports why)."""
    try:
        devices = read_section(sections, "devices", DevicesSection)
    except SectionInvalid:
        return []
    found = []
    for item in devices.assignments if devices is not None else []:
        try:
            found.append(read(item, Assignment, "devices"))
        except SectionInvalid:
            continue
    return found


def profile_units(sections: Mapping[str, Any]) -> list[str]:
    """The units of the ``profile`` section (none when it is absent or does not fit: its
    section state says why)."""
    try:
        profile = read_section(sections, "profile", ProfileSection)
    except SectionInvalid:
        return []
    return profile.units if profile is not None else []
