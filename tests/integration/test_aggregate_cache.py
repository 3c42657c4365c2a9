"""The store's aggregate cache (api/store/aggregate_cache.py).

A cached aggregate is fast-forwarded on every load, so a load sees what another process (a
replica, another worker of ``serve --workers``) saved after it was cached; and every load
hands out a copy, so a command that changes an aggregate and then fails leaves nothing
behind for the next command.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

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
    recordings = store.save(first, None, second_event)
    assert [r.domain_event.originator_id for r in recordings] == [first.id, second.id]
    assert heard == [recordings[-1].notification.id]
    assert not first.pending_events
    assert store.load(first.id).name == "s-a"
    assert store.load(second.id).name == "s-b"  # the bare event's aggregate, from the store
