"""The store's aggregate cache (api/store/aggregate_cache.py).

A cached aggregate is fast-forwarded on every load, so a load sees what another process (a
replica, another worker of ``serve --workers``) saved after it was cached; and every load
hands out a copy, so a command that changes an aggregate and then fails leaves nothing
behind for the next command.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from eventsourcing.persistence import StoredEvent

from better_compute.domain.access import LOCAL_OPERATOR as OP
from better_compute.domain.ids import parse_id
from better_compute.domain.reservation import Reservation
from tests.fleet import add_nodes, make_pool
from tests.support import open_runtime


def _reserve(runtime: Any) -> tuple[str, Any]:
    pool = make_pool(runtime.service)
    add_nodes(runtime.service, pool, 1)
    doc = runtime.services.reservations.create(OP, tenant_id=None, pool_id=pool, gpus=1,
                                               duration="1h", key="cache-test")
    return doc["id"], parse_id("rsv", doc["id"])


def test_a_cached_aggregate_shows_what_another_process_saved(env: dict[str, str],
                                                               runtime: Any) -> None:
    rsv_id, uuid = _reserve(runtime)
    aggregates = runtime.services.aggregates
    first = aggregates.get(Reservation, uuid)
    assert first is not None and first.state == "binding"  # it started: bound in its save
    assert runtime.store.cache._entries[uuid][0] == first.version  # it is cached

    other = open_runtime(env)
    try:
        other.services.reservations.release(OP, rsv_id)
    finally:
        other.close()

    again = aggregates.get(Reservation, uuid)
    assert again is not None
    assert again.state == "released"
    assert again.version > first.version
    assert runtime.services.reservations.release(OP, rsv_id)["state"] == "released"


def test_a_change_never_saved_leaves_the_cache_as_it_was(runtime: Any) -> None:
    _, uuid = _reserve(runtime)
    aggregates = runtime.services.aggregates
    loaded = aggregates.get(Reservation, uuid)
    assert loaded is not None and loaded.state == "binding"
    assert loaded.release(datetime.now(UTC), reason="never saved")  # a command that then fails
    assert loaded.state == "released" and loaded.pending_events

    fresh = aggregates.get(Reservation, uuid)
    assert fresh is not None and fresh is not loaded
    assert fresh.state == "binding" and not fresh.pending_events
    assert fresh.version == loaded.version - 1


def test_a_save_records_every_object_s_events_tells_listeners_and_caches_them(
        runtime: Any) -> None:
    """ComputeStore.save collects events without the library's runtime-Protocol checks: the
    same events are recorded, in the order given, from aggregates and bare events alike."""
    from better_compute.domain.site import Site

    store = runtime.store
    heard: list[int] = []
    store.add_commit_listener(heard.append)
    first = Site(tenant_id="root", kind="shared", region="eu-1", name="s-a", key=None,
                 fingerprint="-")
    second = Site(tenant_id="root", kind="shared", region="eu-1", name="s-b", key=None,
                  fingerprint="-")
    second_event = second.collect_events()[0]
    recordings = store.save(first, None, second_event, actor="local")
    assert [r.domain_event.originator_id for r in recordings] == [first.id, second.id]
    assert heard == [recordings[-1].notification.id]
    assert not first.pending_events
    assert store.load(first.id).name == "s-a"
    assert store.load(second.id).name == "s-b"  # the bare event's aggregate, from the store


def test_a_copy_on_write_quota_use_is_kept_as_an_object_and_copies_stay_apart(
        runtime: Any) -> None:
    """A tenant's quota use lists each of its live reservations; it is kept as an object and
    handed out as shallow copies (no pickling per load), which its events never change under
    one another: each event gives ``held`` a new dict."""
    import copy as deep

    from better_compute.domain.quota import QuotaUse, quota_uuid
    from tests.fleet import offered_pool

    pool = offered_pool(runtime.service, nodes=2, gpus=16)
    rs = runtime.services.reservations
    made = [rs.create(OP, tenant_id="acme", pool_id=pool, gpus=1, duration="1h")["id"]
            for _ in range(3)]
    uuid = quota_uuid(pool, "acme")
    assert not isinstance(runtime.store.cache._entries[uuid][1], bytes)  # kept, not pickled

    first, second = runtime.store.load(uuid), runtime.store.load(uuid)
    assert isinstance(first, QuotaUse) and first is not second
    before = {k: deep.deepcopy(v) for k, v in vars(second).items() if k != "_pending_events"}
    first.take("rsv_never_saved", 2, None)  # a command that fails before its save
    assert first.refund(made[0])
    assert first.in_use == 4 and len(first.pending_events) == 2
    assert {k: v for k, v in vars(second).items() if k != "_pending_events"} == before
    assert second.pending_events == [] and second.in_use == 3
    assert runtime.store.load(uuid).in_use == 3  # nothing of it in the cache either

    rs.release(OP, made[1])  # saved: the next copy shows it, the old ones do not
    assert runtime.store.load(uuid).in_use == 2 and second.in_use == 3


def test_the_create_s_aggregates_are_kept_as_objects_and_changes_stay_in_their_copy(
        runtime: Any) -> None:
    """A create loads the pool, the node and its bookings and saves those with the
    reservation: all four are kept as objects (``COPY_ON_WRITE``: no pickle per load or
    save) and handed out as shallow copies, which a command's events never change under
    another copy, saved or not."""
    import copy as deep

    from better_compute.domain.bookings import NodeBookings, bookings_uuid
    from better_compute.domain.node import Node
    from better_compute.domain.pool import Pool

    _, uuid = _reserve(runtime)
    store = runtime.store
    rsv = store.load(uuid)
    kinds = {Reservation: uuid, Pool: parse_id("pool", rsv.pool_id),
             Node: parse_id("node", rsv.node_id), NodeBookings: bookings_uuid(rsv.node_id)}
    for cls, each in kinds.items():
        kept = store.cache._entries[each][1]
        assert type(kept) is cls, f"{cls.__name__} kept as {type(kept).__name__}"

    def state(aggregate: Any) -> dict[str, Any]:
        return {k: deep.deepcopy(v) for k, v in vars(aggregate).items()
                if k != "_pending_events"}

    copies = {cls: store.load(each) for cls, each in kinds.items()}
    before = {cls: state(copy) for cls, copy in copies.items()}
    now = datetime.now(UTC)
    changed = {cls: store.load(each) for cls, each in kinds.items()}  # never saved
    changed[Reservation].extend(changed[Reservation].end.replace(year=2099))
    changed[Reservation].release(now, reason="never saved")
    changed[NodeBookings].extend(rsv.allocation_id, rsv.end.replace(year=2099))
    changed[NodeBookings].end(rsv.allocation_id, now)
    changed[Node].unassign_devices(rsv.allocation_id, now)
    changed[Node].cordon("never saved", now, None)
    changed[Pool].offer("acme", {"gpu": 3})
    assert all(aggregate.pending_events for aggregate in changed.values())
    for cls, each in kinds.items():
        assert state(copies[cls]) == before[cls], cls.__name__
        assert state(store.load(each)) == before[cls], cls.__name__

    runtime.services.reservations.release(OP, rsv.public_id)  # saved: the next copy has it
    assert store.load(uuid).state == "released" and copies[Reservation].state == "binding"
    assert rsv.allocation_id not in store.load(kinds[NodeBookings]).bookings
    assert rsv.allocation_id in copies[NodeBookings].bookings


def test_a_token_is_kept_and_a_revocation_elsewhere_counts_at_the_next_call(
        env: dict[str, str], runtime: Any, monkeypatch: Any) -> None:
    """Every call authenticates its token as stored now: from the aggregate cache, which
    reads only the events after the kept version (none: nothing to decode), so another
    process's revocation still refuses the very next call."""
    import pytest

    from better_compute.domain.errors import Unauthenticated
    from better_compute.domain.token import ApiToken, token_hash, token_uuid

    service = runtime.service
    made = service.tokens_create(OP, "root", "admin", "cached")
    uuid = token_uuid(token_hash(made["token"]))
    assert service.authenticate(made["token"]).token_id == made["id"]
    assert type(runtime.store.cache._entries[uuid][1]) is ApiToken  # kept, not pickled
    decoded: list[Any] = []
    mapper = runtime.store.mapper  # this runtime's alone (the other one below decodes too)
    real = mapper.to_domain_event

    def to_domain_event(stored: StoredEvent) -> Any:
        decoded.append(stored)
        return real(stored)

    monkeypatch.setattr(mapper, "to_domain_event", to_domain_event)
    for _ in range(3):
        assert service.authenticate(made["token"]).tenant_id == "root"
    assert decoded == []  # nothing new: nothing read back into events

    other = open_runtime(env)
    try:
        other.service.tokens_revoke(OP, made["id"])
    finally:
        other.close()
    with pytest.raises(Unauthenticated, match="unknown or revoked"):
        service.authenticate(made["token"])
    assert len(decoded) == 1  # the revocation alone
