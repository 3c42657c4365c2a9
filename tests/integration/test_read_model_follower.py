"""The read models other than the inline free-GPU index follow the log in one follower per
process (projections/framework.py ``Follower``), in batches; a caller that needs one current
waits for it to reach a position instead of catching up by itself.

A create does no read-model work of its own: its booking reaches the free-GPU index inside
its save, and the reservations, listings, capacity and usage read models apply it with the
next batch. A queue change this process saved is waited for by the next create's check of
the queue's head. Read models in step are applied together (one read, one decoding, one
transaction); one that cannot apply an event holds back only itself.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from better_compute.api.store.verify import verify
from better_compute.domain.access import LOCAL_OPERATOR as OP
from better_compute.domain.errors import NoCapacity
from better_compute.projections.framework import Follower, ReadModels
from better_compute.projections.reservations import Reservations
from tests.fleet import make_pool, offered_pool

FOLLOWED = ("capacity", "listings", "reservations", "usage")


def _positions(runtime: Any) -> dict[str, int]:
    rm = runtime.projections
    return {name: rm.tracking.max_tracking_id(rm.get(name).tracking_name) or 0
            for name in FOLLOWED}


def _in_step(runtime: Any) -> int:
    runtime.projections.catch_up()
    head: int = runtime.projections.source.head()
    assert set(_positions(runtime).values()) == {head}
    return head


@pytest.fixture
def follower(runtime: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """A follower of ``runtime`` whose batches wait for ever (no pass but for a waiter), as
    ``serve`` runs one; yields the list of its passes."""
    _in_step(runtime)
    passes: list[int] = []
    real = ReadModels.follow_all

    def counted(self: ReadModels) -> None:
        passes.append(self.source.head())
        real(self)

    monkeypatch.setattr(ReadModels, "follow_all", counted)
    running = Follower(runtime.projections, period=3600, poll=3600)
    runtime.projections.follower = running
    runtime.store.add_commit_listener(running.poke)
    core = runtime.services.reservations.core
    runtime.projections.after_follow.append(core.note_queues)  # as serve wires it
    thread = threading.Thread(target=running.run)
    thread.start()
    try:
        yield passes
    finally:
        runtime.projections.follower = None
        runtime.projections.after_follow.remove(core.note_queues)
        core.forget_queues()
        running.stop()
        thread.join(30)


def test_creates_leave_the_followed_read_models_to_one_batch(runtime: Any,
                                                            follower: list[int]) -> None:
    pool = offered_pool(runtime.service, nodes=2, gpus=16)
    before = _positions(runtime)
    rs = runtime.services.reservations
    made = [rs.create(OP, tenant_id="acme", pool_id=pool, gpus=1, duration="1h")["id"]
            for _ in range(5)]
    assert _positions(runtime) == before  # no create applied anything to them
    assert follower == []
    head = runtime.projections.source.head()
    listed = rs.list(OP, "acme", None, None)  # waits for the follower: one pass for all
    assert [r["id"] for r in listed] == made
    assert follower[0] == head  # the first pass, asked by the list, applied all five
    assert set(_positions(runtime).values()) == {head}
    report = verify(runtime)
    assert report["ok"], report["problems"]


def test_a_queue_change_saved_here_is_seen_by_the_next_create(runtime: Any,
                                                             follower: list[int]) -> None:
    pool = offered_pool(runtime.service, nodes=1, gpus=8)
    rs = runtime.services.reservations
    rs.create(OP, tenant_id="acme", pool_id=pool, gpus=6, duration="1h")
    queued = rs.create(OP, tenant_id="acme", pool_id=pool, gpus=8, duration="1h", queue=True)
    assert queued["state"] == "queued"
    # Two GPUs are free, but a booking of them for 2h would delay the queue's head (all
    # eight, once the six are free in an hour).
    with pytest.raises(NoCapacity, match="would delay its head"):
        rs.create(OP, tenant_id="acme", pool_id=pool, gpus=2, duration="2h")


def test_a_waiter_is_let_go_when_the_pass_fails(runtime: Any, follower: list[int],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(self: Any, *args: Any) -> None:
        raise RuntimeError("a bug in the reservations read model")

    monkeypatch.setattr(Reservations, "apply", broken)
    pool = offered_pool(runtime.service, nodes=1, gpus=8)
    runtime.services.reservations.create(OP, tenant_id="acme", pool_id=pool, gpus=1,
                                         duration="1h")
    with pytest.raises(RuntimeError, match="a bug in the reservations read model"):
        runtime.projections.catch_up("reservations")  # the follower failed: caught up here
    assert follower  # it was asked first


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
    with pytest.raises(RuntimeError, match="a bug in the reservations read model"):
        runtime.projections.follow_all()  # the others follow, then the failure is raised
    positions = _positions(runtime)
    assert positions["reservations"] == before
    assert {n: positions[n] for n in FOLLOWED if n != "reservations"} == {
        n: head for n in FOLLOWED if n != "reservations"}

    monkeypatch.undo()
    runtime.projections._wanted.clear()
    runtime.projections.catch_up("reservations")
    assert _positions(runtime)["reservations"] == head


def test_read_models_in_step_are_applied_in_one_transaction(runtime: Any) -> None:
    _in_step(runtime)
    transactions: list[bool] = []
    original = runtime.projections.sql.transaction

    def counting(*, commit: bool, durable: bool = True) -> Any:
        transactions.append(commit)
        return original(commit=commit, durable=durable)

    pool = make_pool(runtime.service)
    offered = offered_pool(runtime.service, nodes=1, gpus=8)
    runtime.services.reservations.create(OP, tenant_id="acme", pool_id=offered, gpus=1,
                                         duration="1h")
    head = runtime.projections.source.head()
    runtime.projections.sql.transaction = counting
    try:
        runtime.projections.follow_all()
    finally:
        del runtime.projections.sql.transaction
    assert pool and set(_positions(runtime).values()) == {head}
    assert transactions.count(True) == 1  # one write transaction for all of them


def test_a_read_model_being_caught_up_elsewhere_is_left_to_that(runtime: Any) -> None:
    """A catch-up brings the other read models along only when their lock is free: on
    PostgreSQL a read model another transaction is applying is skipped (no wait); SQLite's
    one writer holds every lock."""
    sql = runtime.projections.sql
    before = _in_step(runtime)
    make_pool(runtime.service)
    head = runtime.projections.source.head()
    if not sql.postgres:
        with sql.transaction(commit=True) as cursor:
            assert sql.try_lock(cursor, "anything") is True
        runtime.projections.catch_up("listings")
        assert set(_positions(runtime).values()) == {head}
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
        done = threading.Thread(target=runtime.projections.catch_up, args=("listings",))
        done.start()
        done.join(20)
        assert not done.is_alive()  # it did not wait for the reservations' lock
    finally:
        release.set()
        holder.join(30)
    positions = _positions(runtime)
    assert positions["listings"] == head and positions["reservations"] == before
    runtime.projections.catch_up("reservations")
    assert _positions(runtime)["reservations"] == head


def test_a_create_on_a_pool_without_a_queue_reads_no_queue_head(
        runtime: Any, follower: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    from better_compute.api.services import reservation_earliest

    pool = offered_pool(runtime.service, nodes=1, gpus=8)
    rs = runtime.services.reservations
    runtime.projections.catch_up()  # a pass: no pool has a queue
    heads = count_module_calls(monkeypatch, reservation_earliest, "queue_head")
    rs.create(OP, tenant_id="acme", pool_id=pool, gpus=6, duration="1h")
    assert heads == []
    queued = rs.create(OP, tenant_id="acme", pool_id=pool, gpus=8, duration="1h", queue=True)
    assert queued["state"] == "queued"  # a queue change saved here: read from now on
    with pytest.raises(NoCapacity, match="would delay its head"):
        rs.create(OP, tenant_id="acme", pool_id=pool, gpus=2, duration="2h")
    assert heads == [pool]


def count_module_calls(monkeypatch: pytest.MonkeyPatch, module: Any, name: str) -> list[Any]:
    """The second argument of each call of ``module.name`` from now on (it still runs)."""
    calls: list[Any] = []
    real = getattr(module, name)

    def counted(*args: Any) -> Any:
        calls.append(args[1])
        return real(*args)

    monkeypatch.setattr(module, name, counted)
    return calls
