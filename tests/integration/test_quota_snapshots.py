"""A tenant's quota use is snapshotted, so loading it does not grow with its history.

Every create and release of an offered tenant writes an event to its one ``QuotaUse``
(``quota.taken``, ``quota.refunded``), forever. Like a node's bookings, it is snapshotted
every 100 events (api/store/store.py), so a process that does not hold it in its
aggregate cache (after a restart, or once it was evicted) reads the latest snapshot and
at most 100 events after it, and finds the same state as a replay of every event.
"""

from __future__ import annotations

from typing import Any

from better_compute.domain.quota import QuotaUse
from tests.support import open_runtime


def test_a_quota_use_is_loaded_from_its_latest_snapshot(runtime: Any,
                                                        env: dict[str, str]) -> None:
    store = runtime.store
    use = QuotaUse(tenant_id="acme", pool_id="pool_a")
    store.save(use, actor="local")
    for n in range(130):  # 261 events: 130 takes, 130 refunds, 70 reservations left held
        use = store.load(use.id)
        use.take(f"rsv_{n}", 1 + n % 3, None)
        store.save(use, actor="local")
        if n % 2:
            use = store.load(use.id)
            assert use.refund(f"rsv_{n - 1}")
            store.save(use, actor="local")
    assert use.version == 1 + 130 + 65

    fresh = open_runtime(env)  # nothing cached
    try:
        assert fresh.store.snapshots is not None  # the store keeps snapshots
        snapshots = list(fresh.store.snapshots.get(use.id, desc=True, limit=1))
        assert snapshots and snapshots[0].originator_version == 100, snapshots
        after = list(fresh.store.events.get(use.id, gt=snapshots[0].originator_version))
        assert len(after) == use.version - 100
        loaded = fresh.store.load(use.id)
        replayed = _replayed(fresh.store, use.id)
        assert loaded.held == replayed.held == use.held
        assert loaded.version == replayed.version == use.version
    finally:
        fresh.close()


def _replayed(store: Any, uuid: Any) -> QuotaUse:
    """The aggregate from every one of its events, no snapshot."""
    from better_compute.api.store.aggregate_cache import project

    aggregate = project(None, list(store.events.get(uuid)))
    assert isinstance(aggregate, QuotaUse)
    return aggregate
