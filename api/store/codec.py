"""How events are stored: JSON written and read by msgspec, typed by each event class.

The library's own mapper encodes an event's state with Python's ``json`` and
tags every datetime and UUID (``{"_type_": "datetime_iso", "_data_": ...}``),
so reading an event costs a Python call per object. This mapper stores the
same information in plain JSON that msgspec reads in C:

- a top-level field that the event class annotates as ``datetime`` or
  ``UUID`` (``timestamp``, ``start``, ``expires_at``, ...) is stored natively
  (RFC 3339 / canonical UUID strings) and turned back into its type on
  reading, guided by the annotation;
- every other value is stored as JSON, except datetimes, UUIDs and Decimals
  found where the class does not say so (inside ``dict[str, Any]`` fields,
  snapshots of aggregate state): those keep the library's tags, and are
  revived on reading. A string stored in a field annotated as a datetime or
  UUID is tagged ``"str"`` so it stays a string.

So a stored event reads back exactly as it was written, with the same types;
the library's format (tags everywhere) reads back too. The native encoding of
a datetime or UUID is exactly what the public event log shows (``...Z`` /
canonical), which lets ``api/store/eventlog.py`` render a public event line
straight from the stored bytes, without rebuilding the domain event, whenever
the state has no tag (``has_tags``).

Values the library cannot store either (sets, bytes, dates, non-finite
floats) raise ``TranscodingNotRegisteredError`` instead of being stored as
something else.
"""

from __future__ import annotations

import inspect
import math
import types
import typing
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from functools import lru_cache
from typing import Any
from uuid import UUID

import msgspec
from eventsourcing.persistence import (
    Mapper,
    MapperDeserialisationError,
    StoredEvent,
    Transcoder,
    TranscodingNotRegisteredError,
    find_id_convertor,
)
from eventsourcing.utils import get_topic, resolve_topic

from better_compute.api.store.actor import MissingActor
from better_compute.domain.base import TenantOwned

TAG = b'"_type_"'
_ENCODER = msgspec.json.Encoder()
_DECODER = msgspec.json.Decoder()
_UTC = UTC
_JSON_SCALARS = (str, int, bool, type(None))

# Field kinds a class annotation can give: what a stored string turns back into.
_KINDS: dict[str, Callable[[str], Any]] = {"datetime": datetime.fromisoformat, "uuid": UUID}
_TAGGED: dict[str, Callable[[str], Any]] = {
    "datetime_iso": datetime.fromisoformat,
    "uuid_hex": UUID,
    "decimal_str": Decimal,
    "str": str,
}


def has_tags(state: bytes) -> bool:
    """Whether a stored state holds tagged values (then it needs the full decoder)."""
    return TAG in state


# ------------------------------------------------------------------- plans

def _kind_of(annotation: Any) -> str | None:
    if isinstance(annotation, str):  # an annotation typing could not resolve
        text = annotation.replace(" ", "")
        for name, kind in (("datetime", "datetime"), ("UUID", "uuid")):
            if text in (name, f"{name}|None", f"None|{name}", f"Optional[{name}]",
                        f"datetime.{name}", f"uuid.{name}"):
                return kind
        return None
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        if len(args) != 1:
            return None
        annotation = args[0]
    if annotation is datetime:
        return "datetime"
    if annotation is UUID:
        return "uuid"
    return None


@lru_cache(maxsize=1024)
def field_kinds(cls: Any) -> dict[str, str]:
    """The top-level fields of ``cls`` stored natively, and their kind (from annotations)."""
    try:
        hints: dict[str, Any] = typing.get_type_hints(cls)
    except Exception:  # an annotation that does not resolve: read the strings
        hints = {}
        for klass in reversed(cls.__mro__):
            hints.update(inspect.get_annotations(klass))
    kinds = {}
    for name, annotation in hints.items():
        if name in ("originator_id", "originator_version"):
            continue
        kind = _kind_of(annotation)
        if kind is not None:
            kinds[name] = kind
    return kinds


# ----------------------------------------------------------------- encoding

def _offset_is_whole_minutes(value: datetime) -> bool:
    if value.tzinfo is _UTC or value.tzinfo is None:
        return True
    offset = value.utcoffset()
    return offset is None or offset % timedelta(minutes=1) == timedelta(0)


def _tag(name: str, data: str) -> dict[str, str]:
    return {"_type_": name, "_data_": data}


def _untyped(value: Any) -> Any:
    """``value`` as plain JSON, with the library's tags for datetimes, UUIDs and Decimals."""
    kind = type(value)
    if kind in _JSON_SCALARS:
        return value
    if kind is float:
        if not math.isfinite(value):
            raise TranscodingNotRegisteredError(
                f"cannot store the float {value!r}: JSON has no NaN or infinity; store None "
                "or a string instead"
            )
        return value
    if kind is dict:
        return {k: _untyped(v) for k, v in value.items()}
    if kind is list or kind is tuple:
        return [_untyped(v) for v in value]
    if kind is datetime:
        return _tag("datetime_iso", value.isoformat())
    if kind is UUID:
        return _tag("uuid_hex", value.hex)
    if kind is Decimal:
        return _tag("decimal_str", str(value))
    if isinstance(value, str | int) and not isinstance(value, bool):  # str/int enums
        return value
    raise TranscodingNotRegisteredError(
        f"Object of type {kind} is not serializable: events hold JSON values, datetimes, "
        "UUIDs and Decimals; convert it to one of those before recording the event"
    )


def _native(kind: str, value: Any) -> bool:
    """Whether ``value`` is stored as-is in a field of ``kind`` (and reads back the same)."""
    if kind == "datetime":
        return type(value) is datetime and _offset_is_whole_minutes(value)
    return type(value) is UUID


def encode_state(kinds: dict[str, str], state: dict[str, Any]) -> bytes:
    """The stored bytes of an event's state (``kinds``: its natively stored fields)."""
    out: dict[str, Any] = {}
    for key, value in state.items():
        kind = kinds.get(key)
        if kind is None:
            out[key] = _untyped(value)
        elif value is None or _native(kind, value):
            out[key] = value
        elif type(value) is str:
            out[key] = _tag("str", value)  # a string where a datetime/UUID is expected
        else:
            out[key] = _untyped(value)
    return _ENCODER.encode(out)


# ----------------------------------------------------------------- decoding

def _revive(value: Any) -> Any:
    kind = type(value)
    if kind is dict:
        if len(value) == 2 and "_type_" in value and "_data_" in value:
            name = value["_type_"]
            convert = _TAGGED.get(name) if isinstance(name, str) else None
            if convert is None:
                raise TranscodingNotRegisteredError(
                    f"Data serialized with name {name!r} is not deserializable: this store "
                    "holds an event written by a newer or different version"
                )
            return convert(value["_data_"])
        return {k: _revive(v) for k, v in value.items()}
    if kind is list:
        return [_revive(v) for v in value]
    return value


def decode_state(kinds: dict[str, str], data: bytes) -> dict[str, Any]:
    """An event's state from its stored bytes (this format or the library's JSON)."""
    state: dict[str, Any] = _DECODER.decode(data)
    for key, kind in kinds.items():
        value = state.get(key)
        if type(value) is str:
            state[key] = _KINDS[kind](value)
    if TAG in data:
        state = {k: _revive(v) for k, v in state.items()}
    return state


# ------------------------------------------------------------- the mapper

class MsgspecTranscoder(Transcoder):
    """Plain values (no class to guide it): JSON with tags, as the library's transcoder."""

    def encode(self, obj: Any) -> bytes:
        return _ENCODER.encode(_untyped(obj))

    def decode(self, data: bytes) -> Any:
        value = _DECODER.decode(data)
        return _revive(value) if TAG in data else value


@lru_cache(maxsize=1024)
def event_class(topic: str) -> type[Any]:
    return resolve_topic(topic)  # type: ignore[no-any-return]


class EventMapper(Mapper[Any]):
    """The library's Mapper with the per-class msgspec encoding above.

    A compressor or cipher, when the store is configured with one, applies to
    the encoded bytes exactly as in the library's mapper.
    """

    def to_stored_event(self, domain_event: Any) -> StoredEvent:
        cls: Any = type(domain_event)
        state = dict(vars(domain_event))
        if isinstance(domain_event, TenantOwned.Event) and not state.get("actor"):
            raise MissingActor(
                f"event {get_topic(cls)} of {state.get('originator_id')} has no actor: the "
                "command that saves it passes its actor to the save (ComputeStore.save(..., "
                "actor=...), api/store/actor.py)")
        originator_id = state.pop("originator_id")
        originator_version = state.pop("originator_version")
        class_version = getattr(cls, "class_version", 1)
        if class_version > 1:
            state["class_version"] = class_version
        stored = encode_state(field_kinds(cls), state)
        if self.compressor:
            stored = self.compressor.compress(stored)
        if self.cipher:
            stored = self.cipher.encrypt(stored)
        return StoredEvent(originator_id=originator_id, originator_version=originator_version,
                           topic=get_topic(cls), state=stored)

    def to_domain_event(self, stored_event: StoredEvent) -> Any:
        cls: Any = event_class(stored_event.topic)
        data = stored_event.state
        try:
            if self.cipher:
                data = self.cipher.decrypt(data)
            if self.compressor:
                data = self.compressor.decompress(data)
            state = decode_state(field_kinds(cls), data)
        except Exception as exc:
            raise MapperDeserialisationError(
                f"Failed to deserialise state of stored event with topic "
                f"'{stored_event.topic}', originator_id '{stored_event.originator_id}' and "
                f"originator_version {stored_event.originator_version}: {exc}"
            ) from exc
        id_type: Any = type(stored_event.originator_id)
        convert = find_id_convertor(cls, id_type)
        state["originator_id"] = convert(stored_event.originator_id)
        state["originator_version"] = stored_event.originator_version
        class_version = getattr(cls, "class_version", 1)
        from_version = state.pop("class_version", 1)
        while from_version < class_version:
            getattr(cls, f"upcast_v{from_version}_v{from_version + 1}")(state)
            from_version += 1
        event = object.__new__(cls)
        object.__setattr__(event, "__dict__", state)
        return event
