"""Controllers run once per deployment: one leader, and another takes over when it dies."""

from __future__ import annotations

from typing import Any

from better_compute.api.controllers.leader import PostgresLeadership, leadership_for
from tests.support import eventually


def test_one_leader_at_a_time_and_a_takeover(runtime: Any) -> None:
    first, second = leadership_for(runtime), leadership_for(runtime)
    try:
        assert first.try_acquire() is True
        assert first.try_acquire() is True  # holding it already
        assert second.try_acquire() is False
        assert first.still_leader() and not second.still_leader()
        first.release()
        assert second.try_acquire() is True
        assert first.try_acquire() is False
    finally:
        first.release()
        second.release()


def test_a_dead_leaders_lock_is_free_again(runtime: Any) -> None:
    first, second = leadership_for(runtime), leadership_for(runtime)
    try:
        assert first.try_acquire()
        if isinstance(first, PostgresLeadership):
            first._conn.close()  # the leader's process died: its connection is gone
            assert first.still_leader() is False
        else:
            import os

            assert first._fd is not None  # type: ignore[attr-defined]
            os.close(first._fd)  # type: ignore[attr-defined]  # the kernel drops the flock
            first._fd = None  # type: ignore[attr-defined]
        # PostgreSQL's backend lets go of the lock when it has read the closed
        # connection's goodbye, a moment after the client closed it: await it.
        eventually(second.try_acquire, "the dead leader's lock is taken over", timeout=15.0)
        assert second.still_leader()
    finally:
        first.release()
        second.release()


def test_deployments_on_other_schemas_do_not_block_each_other(runtime: Any) -> None:
    mine = leadership_for(runtime)
    try:
        assert mine.try_acquire()
        if isinstance(mine, PostgresLeadership):
            other = PostgresLeadership(mine.pg, mine.name + " elsewhere")
            assert other.try_acquire()
            other.release()
    finally:
        mine.release()
