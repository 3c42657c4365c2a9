"""Following a read model past this process's own saves needs no read of the log.

A create follows the free-GPU index and the reservations read model, which lack just the
events of the create before it: this process saved them and kept their notifications
(``StoreEvents.recent``), so they are applied as kept. Another process's saves that this
process's event hub has read (the /watch hub of a server) are kept too, so a worker of
``serve --workers N`` follows the others' creates without reading them a second time. When
anything no one here read lies between, or the read model's position was reset elsewhere,
the log is read as before. Either way the rows are those of the read model rebuilt from
the whole log.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import anyio
import pytest

from better_compute.api.runtime import StoreEvents
from better_compute.domain.access import LOCAL_OPERATOR as OP
from tests.fleet import offered_pool
from tests.integration.test_read_model_wants import _rows
from tests.support import open_runtime

FOLLOWED = ("free_gpus", "reservations")


def _reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The ``after`` of every read of the log from now on."""
    reads: list[int] = []
    real = StoreEvents.select

    def counted(self: StoreEvents, after: int, limit: int) -> Any:
        reads.append(after)
        return real(self, after, limit)

    monkeypatch.setattr(StoreEvents, "select", counted)
    return reads


def _create(runtime: Any, pool: str, key: str) -> dict[str, Any]:
    return dict(runtime.services.reservations.create(
        OP, tenant_id="acme", pool_id=pool, gpus=1, duration="1h", key=key))


def _followed_pool(runtime: Any, key: str) -> str:
    """A pool with one reservation (``key``), the followed read models applied up to it."""
    pool = offered_pool(runtime.service, nodes=3, gpus=24)
    _create(runtime, pool, key)
    for name in FOLLOWED:
        runtime.projections.follow(name)
    return pool


def _rebuilt(env: dict[str, str], name: str) -> dict[str, Any]:
    other: Any = open_runtime(env)
    try:
        other.projections.rebuild(name)
        return _rows(other, name)
    finally:
        other.close()


def test_own_saves_are_followed_without_a_read(runtime: Any, env: dict[str, str],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    pool = offered_pool(runtime.service, nodes=3, gpus=24)
    rs = runtime.services.reservations
    first = _create(runtime, pool, "own-0")
    reads = _reads(monkeypatch)
    for i in range(1, 5):
        doc = _create(runtime, pool, f"own-{i}")
        if i % 2:
            rs.release(OP, doc["id"])
    rs.release(OP, first["id"])
    for name in FOLLOWED:
        assert runtime.projections.follow(name) is False  # applied as kept: nothing read
    assert reads == []
    for name in FOLLOWED:
        assert _rows(runtime, name) == _rebuilt(env, name)


def test_a_catch_up_reads_only_past_what_this_process_has(
        runtime: Any, env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """``catch_up`` (a ``list``, a controller's pass) must see every process's commits, so it
    reads the log; what this process saved since the read model's hint is applied first,
    so that read starts at the newest of them and finds nothing."""
    pool = _followed_pool(runtime, "known-0")
    for i in range(1, 4):
        _create(runtime, pool, f"known-{i}")
    head = runtime.projections.source.head()
    reads = _reads(monkeypatch)
    applied = [runtime.projections.catch_up(name) for name in FOLLOWED]
    assert applied[0] > 0  # the three creates (the others came along in its transaction)
    assert reads == [head] * len(FOLLOWED)  # each read starts past what was kept
    for name in FOLLOWED:
        assert _rows(runtime, name) == _rebuilt(env, name)


def test_another_process_s_save_in_between_is_read(runtime: Any, env: dict[str, str],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    pool = offered_pool(runtime.service, nodes=3, gpus=24)
    _create(runtime, pool, "mine-0")
    other: Any = open_runtime(env)  # its saves are not this process's: never kept here
    try:
        theirs = _create(other, pool, "theirs")
    finally:
        other.close()
    reads = _reads(monkeypatch)
    _create(runtime, pool, "mine-1")  # lacks "theirs", which lies before it: read
    assert reads, "the other process's save was never read"
    for name in FOLLOWED:
        runtime.projections.follow(name)
        assert _rows(runtime, name) == _rebuilt(env, name)
    listed = runtime.services.reservations.list(OP, "acme", None, None)
    assert theirs["id"] in {r["id"] for r in listed}


def test_a_position_reset_elsewhere_is_read_from_where_it_is(
        runtime: Any, env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    pool = _followed_pool(runtime, "reset-0")
    other: Any = open_runtime(env)
    try:  # an upgrade's reset: tables emptied, position 0; this process's hints are ahead
        with other.projections.sql.transaction(commit=True) as cursor:
            for name in FOLLOWED:
                projection = other.projections.get(name)
                for table in projection.table_names():
                    other.projections.sql.execute(cursor, f"DELETE FROM {table}")
                other.projections._reset_tracking(cursor, projection)
    finally:
        other.close()
    reads = _reads(monkeypatch)
    _create(runtime, pool, "reset-1")  # own save, but the read model is behind it
    assert 0 in reads  # read again from 0
    for name in FOLLOWED:
        runtime.projections.follow(name)
        assert _rows(runtime, name) == _rebuilt(env, name)


def test_another_process_s_saves_the_hub_read_are_followed_without_a_second_read(
        runtime: Any, env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    from better_compute.api.http.watch import running_hub

    pool = _followed_pool(runtime, "mine-0")
    state = SimpleNamespace(runtime=runtime, extra={})
    reads: dict[str, list[int]] = {}

    async def main() -> None:
        with anyio.fail_after(60):
            async with running_hub(state) as hub:  # as the server's lifespan runs it
                other: Any = open_runtime(env)
                try:
                    theirs = _create(other, pool, "theirs")
                    their_release = other.services.reservations.release(OP, theirs["id"])
                    head = other.projections.source.head()
                finally:
                    other.close()
                while hub.head < head:  # the hub reads the other process's saves
                    await hub.wait_beyond(hub.head, timeout=5)
                reads["log"] = _reads(monkeypatch)  # the read models' reads from here on
                for name in FOLLOWED:
                    assert runtime.projections.follow(name) is False  # kept: nothing read
                assert their_release["state"] == "released"

    anyio.run(main)
    assert reads == {"log": []}
    for name in FOLLOWED:
        assert _rows(runtime, name) == _rebuilt(env, name)
