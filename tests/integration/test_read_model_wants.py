"""A read model decodes only the events it wants, and its rows are the same as from all.

``ReadModel.wants`` names the event types that can change a read model; the catch-up does
not decode the others for it (a create writes five events; the listings want one of them,
the usage two), while its position still moves past them. Over a history of pools, nodes,
tenants, tokens and reservations created, bound, extended, released and booked for later,
each read model rebuilt from 0 has the same rows as when it is handed every event, and
decodes fewer events.
"""

from __future__ import annotations

from typing import Any

import pytest

from better_compute.api.runtime import StoreEvents
from better_compute.api.store.verify import _comparable
from better_compute.domain.access import LOCAL_OPERATOR as OP
from better_compute.projections.framework import ReadModels
from tests.fleet import offered_pool

NAMES = ("listings", "capacity", "free_gpus", "reservations", "usage")


def _history(runtime: Any) -> None:
    pool = offered_pool(runtime.service, nodes=2, gpus=16)
    runtime.service.tokens_create(OP, "acme", "member", "ci")
    rs = runtime.services.reservations
    for i in range(6):
        doc = rs.create(OP, tenant_id="acme", pool_id=pool, gpus=1 + i % 3, duration="1h",
                        key=f"wants-{i}")
        if i % 2:
            rs.release(OP, doc["id"])
        elif i == 2:
            rs.extend(OP, doc["id"], "30m")
    rs.create(OP, tenant_id="acme", pool_id=pool, gpus=2, duration="1h", start="+2h",
              key="wants-later")


def _rows(runtime: Any, name: str) -> dict[str, Any]:
    position, tables = runtime.projections.rows_at_position(name)
    return {"position": position, **{t: _comparable(rows) for t, rows in tables.items()}}


def _decoded(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    topics: list[str] = []
    real = StoreEvents.decode

    def counted(self: StoreEvents, notification: Any) -> Any:
        topics.append(notification.topic)
        return real(self, notification)

    monkeypatch.setattr(StoreEvents, "decode", counted)
    return topics


@pytest.mark.parametrize("name", NAMES)
def test_a_read_model_from_the_events_it_wants_equals_one_from_all(
        runtime: Any, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    _history(runtime)
    projections = runtime.projections
    projections.catch_up()
    decoded = _decoded(monkeypatch)
    projections.rebuild(name)
    wanted = _rows(runtime, name)
    wanted_decodes = len(decoded)

    # As before ``wants``: every event decoded and handed to the read model's ``apply``.
    monkeypatch.setattr(ReadModels, "_wants", lambda self, projection, notification: True)
    decoded.clear()
    projections.rebuild(name)
    every = _rows(runtime, name)

    assert wanted == every
    assert wanted["position"] == projections.source.head()
    assert len(decoded) == projections.source.head()  # handed all: each event decoded
    assert wanted_decodes < len(decoded), (name, wanted_decodes, len(decoded))


def test_a_create_s_events_are_decoded_only_for_the_read_models_that_want_them(
        runtime: Any) -> None:
    projections = runtime.projections
    wanted = {name: {topic for topic in ("reservation.placed", "reservation.binding",
                                         "bookings.booked", "quota.taken",
                                         "node.devices.assigned")
                     if projections.get(name).wants(_type(topic))}
              for name in NAMES}
    assert wanted == {
        "listings": {"node.devices.assigned"},  # a node's document shows its holds
        "capacity": {"bookings.booked", "node.devices.assigned"},
        "free_gpus": {"bookings.booked"},  # holds change nothing the index keeps
        "reservations": {"reservation.placed", "reservation.binding"},
        "usage": {"reservation.placed", "reservation.binding"},
    }, wanted


def _type(topic: str) -> type[Any]:
    from better_compute.api.store.codec import event_class

    return event_class(topic)
