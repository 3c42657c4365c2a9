"""Read models followed by every create are caught up together (projections/framework.py).

Once this process has seen the ``together`` read models (the free-GPU index and the
reservations) at the same position, catching one of them up reads and decodes the new events
once and applies them to both in one transaction; the others are left to batch events up until
their readers come. A read model that cannot apply an event still holds back only itself.
"""

from __future__ import annotations

from typing import Any

import pytest

from better_compute.projections.reservations import Reservations
from tests.fleet import add_nodes, make_pool

TOGETHER = {"free_gpus", "reservations"}


def _positions(runtime: Any) -> dict[str, int]:
    rm = runtime.projections
    return {name: rm.position(p) for name, p in rm.projections.items()}


def _in_step(runtime: Any) -> int:
    runtime.projections.catch_up()
    head: int = runtime.projections.source.head()
    assert set(_positions(runtime).values()) == {head}
    return head


def test_one_catch_up_brings_the_other_followed_read_model_along(runtime: Any) -> None:
    assert {n for n, p in runtime.projections.projections.items() if p.together} == TOGETHER
    before = _in_step(runtime)
    transactions = []
    original = runtime.projections.sql.transaction

    def counting(*, commit: bool, durable: bool = True) -> Any:
        transactions.append(commit)
        return original(commit=commit, durable=durable)

    pool = make_pool(runtime.service)
    add_nodes(runtime.service, pool, 2)
    head = runtime.projections.source.head()
    runtime.projections.sql.transaction = counting
    try:
        runtime.projections.catch_up("free_gpus")
    finally:
        del runtime.projections.sql.transaction
    positions = _positions(runtime)
    assert {n: positions[n] for n in TOGETHER} == {n: head for n in TOGETHER}
    assert positions["listings"] == before  # left to batch up until its readers come
    assert transactions.count(True) == 1  # one write transaction for both


def test_a_read_model_that_cannot_apply_an_event_holds_back_only_itself(
        runtime: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    before = _in_step(runtime)

    def broken(self: Any, *args: Any) -> None:
        raise RuntimeError("a bug in the reservations read model")

    monkeypatch.setattr(Reservations, "apply", broken)
    # handed every event (``wants``), so that the pool's events reach its broken ``apply``
    monkeypatch.setattr(Reservations, "wants", lambda self, event_type: True)
    runtime.projections._wanted.clear()
    make_pool(runtime.service)
    head = runtime.projections.source.head()
    runtime.projections.catch_up("free_gpus")  # the shared batch fails: free_gpus goes alone
    assert _positions(runtime)["free_gpus"] == head
    with pytest.raises(RuntimeError, match="a bug in the reservations read model"):
        runtime.projections.catch_up("reservations")
    assert _positions(runtime)["reservations"] == before

    monkeypatch.undo()
    runtime.projections._wanted.clear()
    runtime.projections.catch_up("reservations")
    assert _positions(runtime)["reservations"] == head


def test_a_read_model_being_caught_up_elsewhere_is_left_to_that(runtime: Any) -> None:
    """Company comes along only when its lock is free: on PostgreSQL a read model another
    transaction is applying is skipped (no wait); SQLite's one writer holds every lock."""
    import threading

    sql = runtime.projections.sql
    before = _in_step(runtime)
    make_pool(runtime.service)
    head = runtime.projections.source.head()
    if not sql.postgres:
        with sql.transaction(commit=True) as cursor:
            assert sql.try_lock(cursor, "anything") is True
        runtime.projections.catch_up("free_gpus")
        assert {n: _positions(runtime)[n] for n in TOGETHER} == {n: head for n in TOGETHER}
        return
    holding, release = threading.Event(), threading.Event()

    def hold() -> None:  # another catch-up of the reservations, in its own transaction
        with sql.transaction(commit=True) as cursor:
            sql.lock(cursor, runtime.projections.get("reservations").tracking_name)
            holding.set()
            release.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert holding.wait(10)
        done = threading.Thread(target=runtime.projections.catch_up, args=("free_gpus",))
        done.start()
        done.join(20)
        assert not done.is_alive()  # it did not wait for the reservations' lock
    finally:
        release.set()
        holder.join(30)
    positions = _positions(runtime)
    assert positions["free_gpus"] == head and positions["reservations"] == before
    runtime.projections.catch_up("reservations")
    assert _positions(runtime)["reservations"] == head
