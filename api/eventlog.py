"""Reading the event log as the public sees it: rendered, filtered by tenant and type.

The store's notification log is the event log; a notification's id is the
event's ``sequence``. Sequences always increase, but on PostgreSQL they are
not dense (a failed insert burns ids), so a position is "the last sequence
read", never a count.

Who sees what: a tenant sees only events whose ``tenantId`` is its own; the
root tenant sees every event. ``types`` takes globs of dotted names
(``node.*,reservation.*``).

Retention: every event is kept today, so the retention floor is 0. A
position below the floor, or beyond the head of this store (a log that was
reset, or another store), is ``Expired``: the reader must start again from a
position it can trust instead of silently skipping events.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from typing import Any
from uuid import UUID

import msgspec
from eventsourcing.persistence import Notification
from eventsourcing.utils import resolve_topic

from better_compute.domain.access import Principal
from better_compute.domain.errors import Expired, InvalidInput
from better_compute.domain.events import compile_type_filter, public_event

RETENTION_FLOOR = 0
PAGE_SIZE = 500  # notifications read from the store at a time
MAX_LIST_LIMIT = 1000

_ENCODER = msgspec.json.Encoder()
_STATE = msgspec.json.Decoder()


@dataclass(frozen=True, slots=True)
class LogEntry:
    """One event of the log, rendered once: what a filter needs and its JSON line."""

    sequence: int
    type: str
    tenant_id: str
    line: bytes  # the public event JSON, without the newline


@dataclass(frozen=True)
class EventFilter:
    """Which events one reader sees: its tenant (None: every tenant) and its type globs."""

    tenant_id: str | None = None
    types: re.Pattern[str] | None = None

    def matches(self, entry: LogEntry) -> bool:
        if self.tenant_id is not None and entry.tenant_id != self.tenant_id:
            return False
        return self.types is None or self.types.match(entry.type) is not None


def parse_types(types: str | Sequence[str] | None) -> list[str]:
    if types is None:
        return []
    items = types.split(",") if isinstance(types, str) else [p for t in types for p in t.split(",")]
    return [t.strip() for t in items if t.strip()]


def filter_for(principal: Principal, types: str | Sequence[str] | None) -> EventFilter:
    """The filter of a caller: its own tenant's events (root: all), of the given types."""
    return EventFilter(
        tenant_id=None if principal.is_root else principal.tenant_id,
        types=compile_type_filter(parse_types(types)),
    )


def _revive(value: Any) -> Any:
    """The library's JSON transcodings ({"_type_", "_data_"}) back to Python values."""
    if type(value) is dict:
        kind = value.get("_type_")
        if kind is not None and len(value) == 2 and "_data_" in value:
            data = value["_data_"]
            if kind == "datetime_iso":
                return datetime.fromisoformat(data)
            if kind == "uuid_hex":
                return UUID(data)
            return _revive(data)
        return {k: _revive(v) for k, v in value.items()}
    if type(value) is list:
        return [_revive(v) for v in value]
    return value


@lru_cache(maxsize=512)
def _event_class(topic: str) -> type[Any]:
    return resolve_topic(topic)  # type: ignore[no-any-return]


def render(notification: Notification, decode: Any = None) -> LogEntry:
    """Render a stored event as its public JSON line.

    Rebuilds the domain event the way the library's mapper does (class from
    the topic, state into ``__dict__``) with a faster JSON decoder, then uses
    the domain's own ``public_event``. A state the fast path cannot read (a
    compressed or encrypted store) goes through ``decode``, the mapper.
    """
    state = notification.state
    if state[:1] == b"{":
        event = object.__new__(_event_class(notification.topic))
        fields = {k: _revive(v) for k, v in _STATE.decode(state).items()}
        fields["originator_id"] = notification.originator_id
        fields["originator_version"] = notification.originator_version
        event.__dict__.update(fields)
    elif decode is not None:
        event = decode(notification)
    else:  # pragma: no cover - only stores with a cipher or compressor
        raise ValueError(f"cannot decode event {notification.id} without the store's mapper")
    doc = public_event(notification.id, event)
    return LogEntry(notification.id, doc["type"], str(doc["tenantId"]), _ENCODER.encode(doc))


@dataclass(frozen=True)
class Page:
    """Events of one reader after a position, and how far the log was read.

    ``next`` is where to continue (pass it as ``since``); every event up to
    ``next`` that the reader may see is in this page or an earlier one.
    ``head`` is the head of the log when the page was read.
    """

    entries: list[LogEntry]
    head: int
    next: int

    @property
    def more(self) -> bool:
        return self.next < self.head


class EventLog:
    """The notification log of one store, read page by page."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.recorder = store.recorder
        self._decode = store.mapper.to_domain_event

    def head(self) -> int:
        return int(self.recorder.max_notification_id() or 0)

    def floor(self) -> int:
        return RETENTION_FLOOR

    def check_position(self, since: int, head: int | None = None) -> int:
        """Refuse a position this log cannot continue from; returns the head it checked."""
        if since < 0:
            raise InvalidInput(
                f"since={since} is not a sequence: use 0 for the whole log, or the sequence of "
                "the last event you read"
            )
        head = self.head() if head is None else head
        if since < self.floor():
            raise Expired(
                f"the event log no longer holds events after sequence {since} (it starts after "
                f"{self.floor()}): start again with --since {self.floor()} and rebuild what you "
                "derived from the events",
                data={"since": since, "floor": self.floor(), "head": head},
            )
        if since > head:
            raise Expired(
                f"sequence {since} is beyond the head ({head}) of this event log: it comes from "
                "another store or one that was reset; start again with --since 0",
                data={"since": since, "floor": self.floor(), "head": head},
            )
        return head

    def read(self, after: int, limit: int = PAGE_SIZE, stop: int | None = None) -> list[LogEntry]:
        """Every event after ``after`` (up to ``stop``), rendered, whoever owns it."""
        notifications = self.recorder.select_notifications(
            start=after, limit=limit, stop=stop, inclusive_of_start=False
        )
        return [render(n, self._decode) for n in notifications]

    def scan(self, flt: EventFilter, after: int, *, limit: int = PAGE_SIZE,
             stop: int | None = None) -> tuple[list[LogEntry], int]:
        """One store read: the events ``flt`` lets through, and the last sequence read."""
        if after < self.floor():
            self.check_position(after)
        entries = self.read(after, limit, stop)
        position = entries[-1].sequence if entries else after
        return [e for e in entries if flt.matches(e)], position

    def page(self, flt: EventFilter, since: int, limit: int, *,
             max_scan: int = 50_000) -> Page:
        """Up to ``limit`` visible events after ``since``, read against one head.

        Reads at most ``max_scan`` notifications, so a narrow filter over a
        long log answers promptly; ``next`` then says where to continue.
        """
        if not 1 <= limit <= MAX_LIST_LIMIT:
            raise InvalidInput(f"limit={limit} is out of range: use 1 to {MAX_LIST_LIMIT}")
        head = self.check_position(since)
        found: list[LogEntry] = []
        position = since
        scanned = 0
        while position < head and len(found) < limit and scanned < max_scan:
            batch = self.read(position, PAGE_SIZE, stop=head)
            if not batch:
                position = head
                break
            scanned += len(batch)
            for entry in batch:
                position = entry.sequence
                if flt.matches(entry):
                    found.append(entry)
                    if len(found) == limit:
                        break
        if len(found) < limit and scanned < max_scan:
            position = head
        return Page(found, head, position)


def decode_lines(entries: Iterable[LogEntry]) -> list[dict[str, Any]]:
    """The public documents of entries (for JSON-RPC answers)."""
    return [msgspec.json.decode(e.line) for e in entries]
