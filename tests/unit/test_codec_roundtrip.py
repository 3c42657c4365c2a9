"""The stored-event codec (api/store/codec.py): every event type reads back exactly as written.

Events are built from their class annotations with representative values
(datetimes with microseconds, tricky strings, nested dicts holding datetimes,
UUIDs and Decimals where the class says ``Any``), stored by the project's
mapper and read back; the values and their types must be equal. The public
line rendered straight from the stored bytes must equal the domain's
``public_event`` of the decoded event.
"""

from __future__ import annotations

import inspect
import math
import typing
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any
from uuid import UUID, uuid4

import msgspec
import pytest
from eventsourcing.domain import Snapshot
from eventsourcing.persistence import (
    DatetimeAsISO,
    DecimalAsStr,
    JSONTranscoder,
    Mapper,
    Notification,
    TranscodingNotRegisteredError,
    UUIDAsHex,
)
from eventsourcing.utils import get_topic
from hypothesis import given, settings
from hypothesis import strategies as st

import better_compute.domain.aggregates
from better_compute.api.store.actor import MissingActor, stamp
from better_compute.api.store.codec import EventMapper, MsgspecTranscoder, field_kinds, has_tags
from better_compute.api.store.eventlog import render
from better_compute.domain.events import public_event
from better_compute.domain.site import Site

MAPPER = EventMapper(MsgspecTranscoder())
WHEN = datetime(2026, 11, 29, 22, 38, 0, 34368, tzinfo=UTC)
TEXT = 'quote " backslash \\ newline \n unicode é ✓ "_type_"'


def _library_mapper() -> Mapper[Any]:
    transcoder = JSONTranscoder()
    for transcoding in (UUIDAsHex(), DecimalAsStr(), DatetimeAsISO()):
        transcoder.register(transcoding)
    return Mapper(transcoder)


def _any_value() -> dict[str, Any]:
    return {"n": 1, "f": 1.5, "ok": True, "none": None, "s": TEXT, "list": [1, "x", None],
            "nested": {"at": WHEN, "id": UUID(int=7), "amount": Decimal("1.10")}}


def _sample(tp: Any) -> Any:
    """A representative value of an annotation; fails on a type the codec has not met."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is datetime:
        return WHEN
    if tp is UUID:
        return UUID(int=42)
    if tp is str:
        return TEXT
    if tp is bool:
        return True
    if tp is int:
        return 7
    if tp is float:
        return 2.5
    if tp is Any:
        return _any_value()
    if origin in (typing.Union, __import__("types").UnionType):
        return _sample(next(a for a in args if a is not type(None)))
    if origin is list:
        return [_sample(args[0]), _sample(args[0])]
    if origin is dict:
        return {"k": _sample(args[1])}
    raise AssertionError(f"no sample for {tp!r}: add one, and check the codec stores it")


def _event_classes() -> list[type[Any]]:
    from eventsourcing.utils import _topic_cache  # the registered topics

    assert better_compute.domain  # imported: every event topic is registered
    found = {
        cls for cls in _topic_cache.values()
        if inspect.isclass(cls) and hasattr(cls, "TOPIC") and hasattr(cls, "mutate")
        and "." in str(cls.TOPIC) and not str(cls.TOPIC).startswith("bc.")
    }
    return sorted(found, key=lambda c: str(c.TOPIC))


def _make(cls: type[Any], *, nones: bool = False) -> Any:
    hints = typing.get_type_hints(cls)
    state: dict[str, Any] = {"originator_id": uuid4(), "originator_version": 3}
    for name, tp in hints.items():
        if name in state or typing.get_origin(tp) is typing.ClassVar:
            continue
        optional = type(None) in typing.get_args(tp)
        state[name] = None if nones and optional else _sample(tp)
    state["tenant_id"] = "acme"
    state["actor"] = "tok_who"  # every stored event has one (api/store/actor.py)
    if "originator_topic" in state:
        state["originator_topic"] = "better_compute.domain.site:Site"
    event = object.__new__(cls)
    event.__dict__.update(state)
    return event


def _typed(value: Any) -> Any:
    """A value with every type spelled out, so equal-but-differently-typed values differ."""
    if isinstance(value, dict):
        return {k: _typed(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_typed(v) for v in value]
    return (type(value).__name__, value)


EVENT_CLASSES = _event_classes()


def test_every_public_event_type_is_covered() -> None:
    topics = {str(cls.TOPIC) for cls in EVENT_CLASSES}
    assert {"site.created", "node.joined", "reservation.placed", "bookings.booked"} <= topics
    assert len(topics) >= 40


def test_the_store_keeps_the_actor_stamped_on_the_event() -> None:
    cls = next(c for c in EVENT_CLASSES if str(c.TOPIC) == "site.created")
    event = _make(cls)
    del event.__dict__["actor"]
    stamp([event], "tok_abc")
    stored = MAPPER.to_stored_event(event)
    assert MAPPER.to_domain_event(stored).actor == "tok_abc"
    notification = Notification(id=3, originator_id=stored.originator_id, originator_version=3,
                                topic=stored.topic, state=stored.state)
    line = msgspec.json.decode(render(notification).line)
    assert line["actor"] == "tok_abc" and "actor" not in line["data"]


def test_an_event_without_an_actor_is_refused() -> None:
    cls = next(c for c in EVENT_CLASSES if str(c.TOPIC) == "site.created")
    event = _make(cls)
    del event.__dict__["actor"]
    with pytest.raises(MissingActor, match=r"site\.created .* has no actor: the command that "
                       r"saves it passes its actor to the save"):
        MAPPER.to_stored_event(event)
    stamp([event], None)  # None stamps nothing: still refused
    with pytest.raises(MissingActor):
        MAPPER.to_stored_event(event)


@pytest.mark.parametrize("nones", [False, True])
@pytest.mark.parametrize("cls", EVENT_CLASSES, ids=lambda c: str(c.TOPIC))
def test_every_event_type_round_trips(cls: type[Any], nones: bool) -> None:
    event = _make(cls, nones=nones)
    stored = MAPPER.to_stored_event(event)
    assert stored.topic == get_topic(cls)
    back = MAPPER.to_domain_event(stored)
    assert type(back) is cls
    assert _typed(vars(back)) == _typed(vars(event))
    # Datetime fields of the class are stored natively, exactly as the public log writes them.
    # (a class is hashable, but mypy checks type[Any] against lru_cache's Hashable and fails)
    for name in field_kinds(cls):  # type: ignore[arg-type]
        value = vars(event)[name]
        if value is not None:
            assert msgspec.json.encode(value.isoformat().replace("+00:00", "Z")) in stored.state


@pytest.mark.parametrize("cls", EVENT_CLASSES, ids=lambda c: str(c.TOPIC))
def test_the_library_format_reads_back_the_same(cls: type[Any]) -> None:
    event = _make(cls)
    stored = _library_mapper().to_stored_event(event)
    assert _typed(vars(MAPPER.to_domain_event(stored))) == _typed(vars(event))


@pytest.mark.parametrize("cls", EVENT_CLASSES, ids=lambda c: str(c.TOPIC))
def test_the_public_line_from_stored_bytes_equals_public_event(cls: type[Any]) -> None:
    event = _make(cls)
    # Remove Any values holding datetimes: such states carry tags and take the slow path.
    for name, value in list(vars(event).items()):
        if isinstance(value, dict | list) and has_tags(MAPPER.transcoder.encode(value)):
            event.__dict__[name] = {"plain": [1, "two", None]} if isinstance(value, dict) else []
    stored = MAPPER.to_stored_event(event)
    assert not has_tags(stored.state)
    for state, sequence in ((stored.state, 11), (_library_mapper().to_stored_event(event).state, 12)):
        notification = Notification(id=sequence, originator_id=stored.originator_id,
                                    originator_version=stored.originator_version,
                                    topic=stored.topic, state=state)
        expected = public_event(sequence, MAPPER.to_domain_event(notification))
        assert msgspec.json.decode(render(notification).line) == expected


def test_a_tagged_state_renders_through_the_domain_event() -> None:
    cls = next(c for c in EVENT_CLASSES if str(c.TOPIC) == "node.joined")
    event = _make(cls)
    stored = MAPPER.to_stored_event(event)
    assert has_tags(stored.state)  # the hardware dict holds a datetime
    notification = Notification(id=5, originator_id=stored.originator_id, originator_version=1,
                                topic=stored.topic, state=stored.state)
    doc = msgspec.json.decode(render(notification).line)
    assert doc == msgspec.json.decode(msgspec.json.encode(public_event(5, event)))
    assert doc["data"]["hardware"]["k"]["nested"]["at"] == "2026-11-29T22:38:00.034368Z"


def test_a_string_in_a_datetime_field_stays_a_string() -> None:
    cls = next(c for c in EVENT_CLASSES if str(c.TOPIC) == "reservation.placed")
    event = _make(cls)
    event.__dict__["start"] = "2026-01-01T00:00:00Z"
    back = MAPPER.to_domain_event(MAPPER.to_stored_event(event))
    assert back.start == "2026-01-01T00:00:00Z"


@pytest.mark.parametrize("when", [
    datetime(2026, 1, 1, tzinfo=UTC),  # no microseconds
    datetime(2026, 1, 1, 1, 2, 3, 500, tzinfo=timezone(timedelta(hours=-7))),
    datetime(2026, 1, 1, tzinfo=timezone(timedelta(hours=5, seconds=15))),  # seconds offset
    datetime(2026, 1, 1, 1, 2, 3),  # naive
])
def test_datetimes_keep_their_instant_and_offset(when: datetime) -> None:
    cls = next(c for c in EVENT_CLASSES if str(c.TOPIC) == "reservation.placed")
    event = _make(cls)
    event.__dict__["end"] = when
    back = MAPPER.to_domain_event(MAPPER.to_stored_event(event))
    assert back.end == when and back.end.utcoffset() == when.utcoffset()


@pytest.mark.parametrize("bad", [{1, 2}, b"bytes", float("nan"), math.inf,
                                 datetime(2026, 1, 1).date()])
def test_values_json_cannot_hold_are_refused(bad: Any) -> None:
    cls = next(c for c in EVENT_CLASSES if str(c.TOPIC) == "reservation.active")
    event = _make(cls)
    event.__dict__["binding"] = {"value": bad}
    with pytest.raises(TranscodingNotRegisteredError):
        MAPPER.to_stored_event(event)


def test_an_aggregate_snapshot_round_trips() -> None:
    site = Site(tenant_id="root", kind="shared", region="eu-1", name="a", key=None,
                fingerprint="-")
    site.collect_events()
    snapshot = Snapshot.take(site)
    back = MAPPER.to_domain_event(MAPPER.to_stored_event(snapshot))
    assert _typed(vars(back)) == _typed(vars(snapshot))
    restored = back.mutate(None)
    assert _typed(vars(restored)) == _typed(vars(site))


_JSON_LEAVES = (st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1)
                | st.floats(allow_nan=False, allow_infinity=False) | st.text())
_KEYS = st.text().filter(lambda k: k not in ("_type_", "_data_"))  # the tag keys
_VALUES = st.recursive(
    _JSON_LEAVES | st.datetimes(timezones=st.just(UTC)) | st.uuids()
    | st.decimals(allow_nan=False, allow_infinity=False),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_KEYS, inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=200, deadline=None)
@given(value=_VALUES)
def test_any_value_round_trips_through_the_transcoder(value: Any) -> None:
    transcoder = MsgspecTranscoder()
    assert _typed(transcoder.decode(transcoder.encode(value))) == _typed(value)


@settings(max_examples=200, deadline=None)
@given(value=st.uuids())
def test_the_fast_subject_id_is_the_domain_public_id(value: UUID) -> None:
    from better_compute.api.store.eventlog import subject_id
    from better_compute.domain.ids import public_id

    assert subject_id("node", value) == public_id("node", value)
