"""Several aggregates read together (``ComputeStore.load_each``) are what ``load`` reads of each.

A batch of a fleet's node changes reads its nodes together (on PostgreSQL two queries for
all, not one or two each: docs/performance.md, "A fleet on one server"). Whatever each one's
state in this process: kept and current, kept while another process saved more of it, not
kept and read from its latest snapshot, not kept and never snapshotted, or not there at all.
"""

from __future__ import annotations

from typing import Any
from uuid import uuid4

from better_compute.domain.quota import QuotaUse
from tests.support import open_runtime


def _use(store: Any, pool: str, changes: int) -> QuotaUse:
    use = QuotaUse(tenant_id="acme", pool_id=pool)
    store.save(use, actor="local")
    for n in range(changes):
        use = store.load(use.id)
        use.take(f"rsv_{n}", 1, None)
        store.save(use, actor="local")
    return use


def test_aggregates_read_together_are_each_as_load_reads_it(runtime: Any,
                                                           env: dict[str, str]) -> None:
    store = runtime.store
    current = _use(store, "pool_current", 3)  # kept here, nothing newer
    stale = _use(store, "pool_stale", 2)  # kept here; another process saves more of it
    snapshotted = _use(store, "pool_snapshotted", 120)  # snapshot at 100, 21 events after
    plain = _use(store, "pool_plain", 4)  # never snapshotted
    other = open_runtime(env)
    try:
        more = other.store.load(stale.id)
        more.take("rsv_other", 2, None)
        other.store.save(more, actor="local")
    finally:
        other.close()

    fresh = open_runtime(env)  # none of them kept
    try:
        fresh.store.load(current.id)
        fresh.store.load(stale.id)
        more = runtime.store.load(stale.id)
        more.take("rsv_later", 1, None)
        runtime.store.save(more, actor="local")  # newer than what ``fresh`` keeps of it
        missing = uuid4()
        ids = [current.id, stale.id, snapshotted.id, plain.id, missing, current.id]
        together = fresh.store.load_each(ids)
        assert sorted(together, key=str) == sorted(set(ids) - {missing}, key=str)
        for uuid, got in together.items():
            alone = runtime.store.load(uuid)
            assert (got.version, got.held) == (alone.version, alone.held), uuid
        assert together[stale.id].held["rsv_later"] == 1
        assert together[snapshotted.id].version == 121
        # What it read is kept: read again, each is the same, with nothing new to apply.
        again = fresh.store.load_each(ids)
        assert {u: a.version for u, a in again.items()} == \
            {u: a.version for u, a in together.items()}
    finally:
        fresh.close()
