"""The journal entries bcd signs and the gateway takes (the kinds api/wire/gateway.py lists).

An entry is JSON, signed as bytes by the node key. The gateway verifies the signature, then
decodes the entry ONCE into the Struct of its kind (``decode_entry``); the handlers take
typed values from there. Unknown fields are ignored (a newer bcd may send more); a field of
the wrong type is ``EntryInvalid``, which the gateway answers with a Nack.

``gpus`` of ``acceptance.result`` stays the documents bcd sent (camelCase, as the node's
events store them): the control plane keeps a GPU's identity and health from them exactly as
reported (api/services/nodes.py), and ``domain/gpus.py`` ``Gpu`` reads them.
"""

from __future__ import annotations

from typing import Any, TypeVar

import msgspec


class EntryInvalid(ValueError):
    """The entry's JSON does not fit its kind; the message names the field."""


class Entry(msgspec.Struct, rename="camel", kw_only=True):
    """What every entry carries: its kind, the node and session it was written in, when."""

    kind: str
    node_id: str | None = None
    epoch: int | None = None
    time: str | None = None  # RFC 3339, the node's clock


class CheckResult(msgspec.Struct, kw_only=True):
    """One acceptance check as bcd ran it."""

    kind: str | None = None
    passed: bool = False
    message: str | None = None


class AcceptanceResult(Entry, kw_only=True):
    """``acceptance.result``: bcd's verdict on one acceptance attempt."""

    attempt: int
    passed: bool = False
    message: str | None = None
    checks: list[CheckResult] = msgspec.field(default_factory=list)
    gpus: list[dict[str, Any]] = msgspec.field(default_factory=list)  # the inventory's GPUs


class AllocationBound(Entry, kw_only=True):
    """``allocation.bound``: a hold is in place (its CDI devices, env file and slice)."""

    allocation_id: str = ""
    gpus: list[str] = msgspec.field(default_factory=list)
    cdi_devices: list[str] = msgspec.field(default_factory=list)
    env_file: str | None = None
    cgroup_parent: str | None = None
    cdi_spec: str | None = None


class AllocationFailed(Entry, kw_only=True):
    """``allocation.failed``: a hold could not be made (overlap, device-missing, ...)."""

    allocation_id: str = ""
    reason: str | None = None
    message: str | None = None


class AllocationReleased(Entry, kw_only=True):
    """``allocation.released``: a hold is gone from the node."""

    allocation_id: str = ""


E = TypeVar("E", bound=Entry)


def decode_entry(doc: dict[str, Any], kind: type[E]) -> E:
    """The entry document (verified JSON, as builtins) as ``kind``; EntryInvalid names the
    field that does not fit."""
    try:
        return msgspec.convert(doc, kind)
    except msgspec.ValidationError as exc:
        raise EntryInvalid(f"a {doc.get('kind') or 'journal'} entry: {exc}") from None
