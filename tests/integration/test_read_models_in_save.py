"""On SQLite a save carries the read models every create follows (api/store/sqlite_recorder.py).

The free-GPU index and the reservations read model are applied inside the save's own
transaction when this process saw them right before it (``ReadModels.apply_in_save``): after
a create they are at the head of the log with no transaction of their own, and their rows
are those of the read models rebuilt from the whole log. A read model that fails there
undoes only its own part: the save is kept, and the read model catches up from the log
later. PostgreSQL saves through one function call and keeps the read models' own
transactions.
"""

from __future__ import annotations

from typing import Any

import pytest

from better_compute.api.runtime import IN_SAVE
from better_compute.domain.access import LOCAL_OPERATOR as OP
from better_compute.projections.framework import ReadModels
from better_compute.projections.free_gpus import FreeGpus
from tests.fleet import offered_pool
from tests.integration.test_follow_own_saves import _create, _rebuilt
from tests.integration.test_read_model_wants import _rows


def _own_transactions(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The read models' own transactions from now on (apart from a save's)."""
    seen: list[str] = []
    together, alone = ReadModels._apply_together, ReadModels._apply_batch

    def counted_together(self: ReadModels, first: Any, *args: Any) -> Any:
        seen.append(first.name)
        return together(self, first, *args)

    def counted_alone(self: ReadModels, projection: Any, *args: Any) -> Any:
        seen.append(projection.name)
        return alone(self, projection, *args)

    monkeypatch.setattr(ReadModels, "_apply_together", counted_together)
    monkeypatch.setattr(ReadModels, "_apply_batch", counted_alone)
    return seen


def _at_head(runtime: Any) -> dict[str, bool]:
    head = runtime.projections.source.head()
    return {name: runtime.projections.position(runtime.projections.get(name)) == head
            for name in IN_SAVE}


def test_a_create_s_save_carries_the_read_models_it_follows(
        runtime: Any, env: dict[str, str], backend: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    pool = offered_pool(runtime.service, nodes=3, gpus=24)
    first = _create(runtime, pool, "carried-0")
    for name in IN_SAVE:
        runtime.projections.follow(name)
    own = _own_transactions(monkeypatch)
    made = [_create(runtime, pool, f"carried-{i}") for i in range(1, 4)]
    runtime.services.reservations.release(OP, made[0]["id"])
    runtime.services.reservations.release(OP, first["id"])
    if backend == "sqlite":
        assert runtime.projections.in_save == IN_SAVE
        assert own == []  # no transaction of their own: every save carried them
        assert _at_head(runtime) == {name: True for name in IN_SAVE}
    else:
        assert runtime.projections.in_save == ()  # saves are one function call
        assert own  # each create followed the one before in a transaction of their own
        for name in IN_SAVE:
            runtime.projections.follow(name)
    for name in IN_SAVE:
        assert _rows(runtime, name) == _rebuilt(env, name)


def test_a_read_model_that_fails_in_a_save_leaves_the_save_and_catches_up(
        runtime: Any, env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    pool = offered_pool(runtime.service, nodes=3, gpus=24)
    _create(runtime, pool, "broken-0")
    for name in IN_SAVE:
        runtime.projections.follow(name)
    real = FreeGpus.apply

    def broken(self: FreeGpus, *args: Any) -> None:
        raise RuntimeError("a read model's bug")

    monkeypatch.setattr(FreeGpus, "apply", broken)
    kept = _create(runtime, pool, "broken-1")  # saved, whatever the read model did
    assert runtime.services.reservations.get_doc(OP, kept["id"])["id"] == kept["id"]
    assert not any(_at_head(runtime).values())  # the savepoint undid both read models
    monkeypatch.setattr(FreeGpus, "apply", real)
    for name in IN_SAVE:
        runtime.projections.catch_up(name)
    assert _at_head(runtime) == {name: True for name in IN_SAVE}
    for name in IN_SAVE:
        assert _rows(runtime, name) == _rebuilt(env, name)
