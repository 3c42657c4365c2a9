"""Domain events as the public event log shows them.

The stored topic of each event is its public type (``site.created``). This
module turns a stored event into the wire shape
``{"sequence", "type", "time", "tenantId", "subject", "actor", "data"}`` and decides
which fields are never published (hashes, sealed keys, idempotency prints).
"""

from __future__ import annotations

import fnmatch
import re
from datetime import datetime
from typing import Any
from uuid import UUID

from better_compute.domain.errors import InvalidInput
from better_compute.domain.ids import public_id

_HIDDEN_FIELDS = frozenset(
    {"originator_id", "originator_version", "timestamp", "originator_topic", "tenant_id",
     "secret_hash", "sealed", "fingerprint", "actor"}
)

# The head of an event type names the aggregate; the subject is its public id.
_SUBJECT_PREFIX: dict[str, str | None] = {
    "tenant": None,  # the subject of a tenant event is the tenant id itself
    "token": "tok",
    "site": "site",
    "pool": "pool",
    "pki": None,
    "joinToken": "jt",
    "node": "node",
    "reservation": "rsv",
    "bookings": None,  # internal: per-node bookings, seen only by the pool's owner
    "quota": None,  # a tenant's GPU use on a pool; data carries the pool and reservation
    "gpu": None,  # internal: which node a GPU UUID belongs to; data carries the UUID and node
}


_UNITS = {"mib": "MiB", "gib": "GiB"}  # memory_gib is memoryGiB, as in every other document


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(_UNITS.get(part) or part[:1].upper() + part[1:] for part in rest)


def _plain(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat().replace("+00:00", "Z")
    if isinstance(value, UUID):
        return str(value)
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def event_type(domain_event: Any) -> str:
    return str(type(domain_event).TOPIC)


def subject_of(domain_event: Any) -> str:
    head = event_type(domain_event).split(".", 1)[0]
    if head == "tenant":
        return str(domain_event.tenant_id)
    prefix = _SUBJECT_PREFIX.get(head)
    if prefix is None:
        return head
    return public_id(prefix, domain_event.originator_id)


def event_data(domain_event: Any) -> dict[str, Any]:
    return {
        _camel(k): _plain(v)
        for k, v in vars(domain_event).items()
        if k not in _HIDDEN_FIELDS and not k.startswith("_")
    }


def public_event(sequence: int, domain_event: Any) -> dict[str, Any]:
    return {
        "sequence": sequence,
        "type": event_type(domain_event),
        "time": _plain(domain_event.timestamp),
        "tenantId": domain_event.tenant_id,
        "subject": subject_of(domain_event),
        "actor": getattr(domain_event, "actor", None),
        "data": event_data(domain_event),
    }


# Names, wildcards and closed bracket sets of name characters ([!...] negates): a bracket
# that is never closed is refused, not read as a literal "[".
_GLOB_RE = re.compile(r"(?:[A-Za-z0-9_.*?-]|\[!?[A-Za-z0-9_.-]+\])+")
MAX_GLOBS = 32
MAX_GLOB_LENGTH = 128


def compile_type_filter(globs: list[str]) -> re.Pattern[str] | None:
    """One regex for a list of globs such as ``node.*,reservation.*``; None matches all."""
    cleaned = [g.strip() for g in globs if g.strip()]
    if not cleaned:
        return None
    if len(cleaned) > MAX_GLOBS:
        raise InvalidInput(f"{len(cleaned)} event type globs: give at most {MAX_GLOBS}")
    for glob in cleaned:
        if len(glob) > MAX_GLOB_LENGTH or not _GLOB_RE.fullmatch(glob):
            shown = glob if len(glob) <= MAX_GLOB_LENGTH else glob[:MAX_GLOB_LENGTH] + "..."
            raise InvalidInput(
                f"event type filter {shown!r} is not a glob of dotted names: use names, * and "
                "?, and close every [ with a ] (for example node.*,reservation.*); at most "
                f"{MAX_GLOB_LENGTH} characters each"
            )
    return re.compile("|".join(f"(?:{fnmatch.translate(g)})" for g in cleaned))
