"""docs/events.md documents every public event type the domain registers."""

from __future__ import annotations

import re
from pathlib import Path

import better_compute.domain  # noqa: F401  (registers every aggregate)
from better_compute.domain.base import TenantOwned

DOC = Path(__file__).resolve().parents[2] / "docs" / "events.md"

# Types whose issue is still open and documents them when it lands; remove a type from
# this set once docs/events.md has its section (the test fails when one is documented).
PENDING: set[str] = set()


def _event_classes(cls: type[TenantOwned.Event]) -> list[type[TenantOwned.Event]]:
    out: list[type[TenantOwned.Event]] = []
    for sub in cls.__subclasses__():
        out.append(sub)
        out.extend(_event_classes(sub))
    return out


def public_types() -> set[str]:
    return {str(c.TOPIC) for c in _event_classes(TenantOwned.Event)
            if not str(c.TOPIC).startswith("bc.")}


def test_every_event_type_is_a_dotted_name_never_a_class_path() -> None:
    for topic in public_types():
        assert re.fullmatch(r"[a-z][A-Za-z]*(\.[a-z][A-Za-z]*)+", topic), topic


def test_every_event_type_has_a_section_in_the_reference() -> None:
    reference = DOC.read_text().split("\n## Event reference\n", 1)[1]
    documented = set(re.findall(r"^### `([^`]+)`$", reference, flags=re.M))
    missing = public_types() - documented - PENDING
    assert not missing, f"docs/events.md has no section for {sorted(missing)}"
    assert not (PENDING & documented), "documented now: remove from PENDING"
    assert not (documented - public_types()), "sections for types no event has"


def test_memory_fields_say_mib_and_gib_as_every_other_document() -> None:
    """Event data says memoryGiB (reservation.placed), as documents do, never memoryGib."""
    from better_compute.domain.events import _camel

    assert [_camel(n) for n in ("memory_gib", "memory_used_mib", "memory_mib", "node_id")] == [
        "memoryGiB", "memoryUsedMiB", "memoryMiB", "nodeId"]
