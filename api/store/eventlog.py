"""Reading the event log as the public sees it: rendered, filtered by tenant and type.

The store's notification log is the event log; a notification's id is the
event's ``sequence``. Sequences always increase, but on PostgreSQL they are
not dense (a failed insert burns ids), so a position is "the last sequence
read", never a count.

Who sees what: a tenant sees only events whose ``tenantId`` is its own; the
root tenant sees every event. ``types`` takes globs of dotted names
(``node.*,reservation.*``). An audit narrows further by ``actor`` (who did it:
``tok_…``, ``node_…``, ``jt_…``, ``controller:…``, ``local``), ``subject`` (the
object's public id) and a time range [``from``, ``to``) on the event's ``time``.

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

from better_compute.api.store.codec import EventMapper, MsgspecTranscoder, event_class, has_tags
from better_compute.api.store.outage import unavailable_on_outage
from better_compute.domain.access import Principal
from better_compute.domain.durations import parse_instant
from better_compute.domain.errors import Expired, InvalidInput
from better_compute.domain.events import (
    _HIDDEN_FIELDS,
    _SUBJECT_PREFIX,
    _camel,
    compile_type_filter,
    public_event,
)

RETENTION_FLOOR = 0
PAGE_SIZE = 500  # notifications read from the store at a time
MAX_LIST_LIMIT = 1000

_ENCODER = msgspec.json.Encoder()
_RAW_FIELDS = msgspec.json.Decoder(dict[str, msgspec.Raw])
_STR = msgspec.json.Decoder(str)
_TENANTS: dict[bytes, str] = {}  # raw JSON of a tenant id -> the id (tenants are few)
_ACTORS: dict[bytes, str] = {}  # raw JSON of an actor -> the actor (tokens, nodes: bounded)
_MAX_ACTORS = 10_000
_MAPPER = EventMapper(MsgspecTranscoder())


@dataclass(frozen=True, slots=True)
class LogEntry:
    """One event of the log, rendered once: what a filter needs and its JSON line."""

    sequence: int
    type: str
    tenant_id: str
    line: bytes  # the public event JSON, without the newline
    subject: str = ""
    actor: str | None = None
    time: str = ""  # RFC 3339, as the line shows it


def entry_time(entry: LogEntry) -> datetime:
    return datetime.fromisoformat(entry.time.replace("Z", "+00:00"))


@dataclass(frozen=True)
class EventFilter:
    """Which events one reader sees: its tenant (None: every tenant) and its type globs,
    narrowed by an audit's actor, subject and time range [since_time, until_time)."""

    tenant_id: str | None = None
    types: re.Pattern[str] | None = None
    actor: str | None = None
    subject: str | None = None
    since_time: datetime | None = None
    until_time: datetime | None = None

    def matches(self, entry: LogEntry) -> bool:
        if self.tenant_id is not None and entry.tenant_id != self.tenant_id:
            return False
        if self.types is not None and self.types.match(entry.type) is None:
            return False
        if self.actor is not None and entry.actor != self.actor:
            return False
        if self.subject is not None and entry.subject != self.subject:
            return False
        if self.since_time is not None or self.until_time is not None:
            at = entry_time(entry)
            if self.since_time is not None and at < self.since_time:
                return False
            if self.until_time is not None and at >= self.until_time:
                return False
        return True


def parse_types(types: str | Sequence[str] | None) -> list[str]:
    if types is None:
        return []
    items = types.split(",") if isinstance(types, str) else [p for t in types for p in t.split(",")]
    return [t.strip() for t in items if t.strip()]


def filter_for(principal: Principal, types: str | Sequence[str] | None, *,
               audit: AuditFilter | None = None) -> EventFilter:
    """The filter of a caller: its own tenant's events (root: all), of the given types,
    narrowed by ``audit`` (actor, subject, time range)."""
    audit = audit or AuditFilter()
    return EventFilter(
        tenant_id=None if principal.is_root else principal.tenant_id,
        types=compile_type_filter(parse_types(types)),
        actor=audit.actor, subject=audit.subject, since_time=audit.since_time,
        until_time=audit.until_time,
    )


@dataclass(frozen=True)
class AuditFilter:
    """What an audit asks of the log besides types: who, about what, when."""

    actor: str | None = None
    subject: str | None = None
    since_time: datetime | None = None
    until_time: datetime | None = None

    @classmethod
    def parse(cls, actor: str | None, subject: str | None, since_time: str | None,
              until_time: str | None, now: datetime) -> AuditFilter:
        """From the params of events.list and /watch (``from``/``to``: domain/durations.py)."""
        start = parse_instant(since_time, now, flag="from") if since_time else None
        end = parse_instant(until_time, now, flag="to") if until_time else None
        if start is not None and end is not None and end <= start:
            raise InvalidInput(f"to={until_time} is not after from={since_time}: the range is "
                               "[from, to), give a later --to")
        for name, value in (("actor", actor), ("subject", subject)):
            if value is not None and (not value.strip() or len(value) > 200):
                raise InvalidInput(f"{name}={value!r} is not an id: give a token id (tok_…), a "
                                   "node id, an object id as the events' subject shows it")
        return cls(actor.strip() if actor else None, subject.strip() if subject else None,
                   start, end)


def _public_name(key: str) -> str | None:
    """The name a stored field has in the public event's ``data`` (None: never shown)."""
    if key in _HIDDEN_FIELDS or key.startswith("_"):
        return None
    return _camel(key)


@dataclass(frozen=True, slots=True)
class _Shape:
    """What rendering needs of one event class, worked out once per topic."""

    type: str
    subject: str | None  # the subject's id prefix; None: the head itself
    tenant_subject: bool  # the subject is the tenant id (tenant.* events)
    names: dict[str, str | None]  # stored field -> public name, filled as fields are seen
    fast: bool  # no upcasting: the stored state is the event's state


@lru_cache(maxsize=512)
def _shape(topic: str) -> _Shape:
    cls = event_class(topic)
    kind = str(cls.TOPIC)
    head = kind.split(".", 1)[0]
    return _Shape(kind, _SUBJECT_PREFIX.get(head) or None, head == "tenant", {},
                  getattr(cls, "class_version", 1) == 1)


_B32 = "abcdefghijklmnopqrstuvwxyz234567"
_B32_PAIRS = [a + b for a in _B32 for b in _B32]  # every 10 bits as two characters
_B32_SHIFTS = tuple(range(120, -1, -10))


def subject_id(prefix: str, value: UUID) -> str:
    """``domain.ids.public_id``, computed 3x faster: 130 bits (the UUID, then 2 zero bits)
    as 26 lower-case base32 characters, read 10 bits at a time."""
    bits = value.int << 2
    return prefix + "_" + "".join([_B32_PAIRS[(bits >> s) & 1023] for s in _B32_SHIFTS])


def _fast_doc(notification: Notification, shape: _Shape) -> dict[str, Any] | None:
    """The public document straight from the stored JSON, or None when that is not possible.

    Possible when the state holds no tagged value (api/store/codec.py): then every
    value is stored exactly as the public log shows it, so the values are
    copied as raw JSON and only the field names change.
    """
    fields = _RAW_FIELDS.decode(notification.state)
    time, tenant = fields.get("timestamp"), fields.get("tenant_id")
    if time is None or tenant is None:
        return None
    tenant_id = _TENANTS.get(bytes(tenant))
    if tenant_id is None:
        tenant_id = _TENANTS.setdefault(bytes(tenant), _STR.decode(tenant))
    actor = _actor(fields.get("actor"))
    if shape.tenant_subject:
        subject = tenant_id
    elif shape.subject is None:
        subject = shape.type.split(".", 1)[0]
    else:
        oid = notification.originator_id
        subject = subject_id(shape.subject, oid if type(oid) is UUID else UUID(str(oid)))
    names = shape.names
    if not names.keys() >= fields.keys():
        for key in fields:
            if key not in names:
                names[key] = _public_name(key)
    data = {name: raw for key, raw in fields.items() if (name := names[key]) is not None}
    return {"sequence": notification.id, "type": shape.type, "time": _STR.decode(time),
            "tenantId": tenant_id, "subject": subject, "actor": actor, "data": data}


def _actor(raw: msgspec.Raw | None) -> str | None:
    if raw is None:
        return None
    key = bytes(raw)
    actor = _ACTORS.get(key)
    if actor is None:
        value = msgspec.json.decode(key)
        if not isinstance(value, str):
            return None
        if len(_ACTORS) < _MAX_ACTORS:
            _ACTORS[key] = value
        return value
    return actor


def render(notification: Notification, decode: Any = None) -> LogEntry:
    """Render a stored event as its public JSON line.

    Straight from the stored bytes when the codec allows it (``_fast_doc``);
    otherwise the domain event is rebuilt (by ``decode``, the store's mapper,
    or the codec's own mapper) and rendered by the domain's ``public_event``.
    Both give the same line (tests/unit/test_codec_roundtrip.py).
    """
    shape = _shape(notification.topic)
    doc = None
    state = notification.state
    if shape.fast and state[:1] == b"{" and not has_tags(state):
        doc = _fast_doc(notification, shape)
    if doc is None:
        event = (decode or _MAPPER.to_domain_event)(notification)
        doc = public_event(notification.id, event)
    return LogEntry(notification.id, doc["type"], str(doc["tenantId"]), _ENCODER.encode(doc),
                    str(doc["subject"]), doc.get("actor"), str(doc["time"]))


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
        with unavailable_on_outage():
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
        with unavailable_on_outage():
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
