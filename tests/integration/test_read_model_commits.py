"""Read models commit without waiting for the disk; saves of events always wait
(api/store/store.py SqlRunner.transaction, api/store/sqlite_writers.py, docs/architecture.md).

A create flushes to disk once, for its save (the free-GPU index is applied inside the save
itself; the other read models, which its follower applies, do not wait for the disk). What
the read models write is derived from the events and applied again from their tracked
position, so only the save's commit must be on disk before the answer.
"""

from __future__ import annotations

from typing import Any

from better_compute.domain.access import LOCAL_OPERATOR as OP
from tests.fleet import offered_pool


def _level(sql: Any, cursor: Any) -> str:
    if sql.postgres:  # set here (SET LOCAL), or the server's own (the test cluster's is off)
        cursor.execute("SELECT setting, source FROM pg_settings "
                       "WHERE name = 'synchronous_commit'")
        row = cursor.fetchone()
        return "off here" if row["source"] == "session" and row["setting"] == "off" \
            else "the server's"
    cursor.execute("PRAGMA synchronous")
    return {1: "normal", 2: "full"}[int(cursor.fetchone()[0])]


def test_read_model_commits_skip_the_flush_and_event_saves_never_do(runtime: Any,
                                                                     monkeypatch: Any) -> None:
    sql = runtime.projections.sql
    durable, derived = ("the server's", "off here") if sql.postgres else ("full", "normal")
    seen: list[tuple[str, str]] = []

    recorder = runtime.store.recorder
    if not sql.postgres:  # the level is the connection's: it must not leak into a save
        real_insert = recorder._insert_events

        def insert(cursor: Any, *args: Any, **kwargs: Any) -> Any:
            seen.append(("save", _level(sql, cursor)))
            return real_insert(cursor, *args, **kwargs)

        monkeypatch.setattr(recorder, "_insert_events", insert)
    framework = type(runtime.projections)
    real_apply = framework._apply_in

    def apply_in(self: Any, cursor: Any, *args: Any) -> None:
        seen.append(("read model", _level(sql, cursor)))
        real_apply(self, cursor, *args)

    monkeypatch.setattr(framework, "_apply_in", apply_in)

    pool = offered_pool(runtime.service, nodes=2, gpus=16)
    rs = runtime.services.reservations
    for i in range(6):  # every connection of the pool takes turns at both
        doc = rs.create(OP, tenant_id="acme", pool_id=pool, gpus=1, duration="1h",
                        key=f"commits-{i}")
        rs.release(OP, doc["id"])
        runtime.projections.catch_up()  # a read model's commit after each

    saves = {level for what, level in seen if what == "save"}
    read_models = {level for what, level in seen if what == "read model"}
    # PostgreSQL's saves are one statement at the server's level; SET LOCAL ends
    # with its transaction, which the loop below shows on the same pool.
    assert saves == (set() if sql.postgres else {durable}), seen
    assert read_models == {derived}, seen
    assert sum(1 for what, _ in seen if what == "read model") >= 6

    # And a plain write of the store's own SQL stays durable after a derived one.
    for _ in range(8):
        with sql.transaction(commit=True, durable=False) as cursor:
            assert _level(sql, cursor) == derived
        with sql.transaction(commit=True) as cursor:
            assert _level(sql, cursor) == durable
