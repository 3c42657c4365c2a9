"""The journal entries bcd signs and the gateway takes (the kinds api/wire/gateway.py lists).

An entry is JSON, signed as bytes by the node key. The gateway verifies the signature, then
decodes the entry ONCE into the Struct of its kind (``decode_entry``); the handlers take
typed values from there. Unknown fields are ignored (a newer bcd may send more); a field of
the wrong type is ``EntryInvalid``, which the gateway answers with a Nack.

``gpus`` of ``acceptance.result`` are the inventory's GPUs (api/wire/inventory.py ``Gpu``):
the control plane checks them against the GPUs the node joined with and keeps their health
(api/services/nodes.py, domain/node_inventory.py). Every string and list is bounded
(api/wire/bounds.py): an entry past a bound is ``EntryInvalid``.
"""

from __future__ import annotations

from typing import Annotated, Any, TypeVar

import msgspec

from .bounds import MAX_GPUS, MAX_ITEMS, FilePath, Id, Ids, Name, Names, clip
from .inventory import Gpu


class EntryInvalid(ValueError):
    """The entry's JSON does not fit its kind; the message names the field."""


class Entry(msgspec.Struct, rename="camel", kw_only=True):
    """What every entry carries: its kind, the node and session it was written in, when."""

    kind: Name
    node_id: Id | None = None
    epoch: int | None = None
    time: Name | None = None  # RFC 3339, the node's clock


class CheckResult(msgspec.Struct, kw_only=True):
    """One acceptance check as bcd ran it."""

    kind: Name | None = None
    passed: bool = False
    message: str | None = None  # cut to MAX_MESSAGE characters (api/wire/bounds.py)

    def __post_init__(self) -> None:
        self.message = clip(self.message)


class AcceptanceResult(Entry, kw_only=True):
    """``acceptance.result``: bcd's verdict on one acceptance attempt."""

    attempt: int
    passed: bool = False
    message: str | None = None  # cut to MAX_MESSAGE characters
    checks: Annotated[list[CheckResult], msgspec.Meta(max_length=MAX_ITEMS)] = \
        msgspec.field(default_factory=list)
    gpus: Annotated[list[Gpu], msgspec.Meta(max_length=MAX_GPUS)] = \
        msgspec.field(default_factory=list)  # the inventory's GPUs

    def __post_init__(self) -> None:
        self.message = clip(self.message)


class AllocationBound(Entry, kw_only=True):
    """``allocation.bound``: a hold is in place (its CDI devices, env file and slice)."""

    allocation_id: Id = ""
    gpus: Ids = msgspec.field(default_factory=list)
    cdi_devices: Names = msgspec.field(default_factory=list)
    env_file: FilePath | None = None
    cgroup_parent: Name | None = None
    cdi_spec: FilePath | None = None


class AllocationFailed(Entry, kw_only=True):
    """``allocation.failed``: a hold could not be made (overlap, device-missing, ...)."""

    allocation_id: Id = ""
    reason: Name | None = None
    message: str | None = None  # cut to MAX_MESSAGE characters

    def __post_init__(self) -> None:
        self.message = clip(self.message)


class AllocationReleased(Entry, kw_only=True):
    """``allocation.released``: a hold is gone from the node."""

    allocation_id: Id = ""


E = TypeVar("E", bound=Entry)


def decode_entry(doc: dict[str, Any], kind: type[E]) -> E:
    """The entry document (verified JSON, as builtins) as ``kind``; EntryInvalid names the
    field that does not fit."""
    try:
        return msgspec.convert(doc, kind)
    except msgspec.ValidationError as exc:
        raise EntryInvalid(f"a {doc.get('kind') or 'journal'} entry: {exc}") from None
