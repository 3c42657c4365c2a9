"""What a create holds the pool's lock for (``ReservationService._placed_and_booked``): the
choice, never the queue check nor the save.

The pool's lock makes the placements of one process choose one at a time (each then claims
its node, so the next avoids it while it saves). On PostgreSQL at 16 clients a worker's
threads spent 29 % of their time waiting for it, and 38 % of the time it was held went to
the queue check (``check_line``: a follow of the reservations read model and a read of the
queue's head, several round trips) that needs no lock: it was never atomic with the save.
"""

from __future__ import annotations

from typing import Any

import pytest

from better_compute.domain.errors import NoCapacity
from tests.integration.test_reservations_service import reserve, setup


def _lock_free(core: Any, pool: str) -> bool:
    lock = core.pool_lock(pool)
    if not lock.acquire(blocking=False):
        return False
    lock.release()
    return True


def test_the_queue_check_runs_without_the_pools_lock(runtime: Any,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    rs, _, pool, _ = setup(runtime, nodes=2)
    seen: list[tuple[bool, frozenset[str]]] = []
    check = rs.earliest.check_line

    def check_line(*args: Any, **kwargs: Any) -> None:
        seen.append((_lock_free(rs.core, pool), rs.core.in_flight(pool)))
        check(*args, **kwargs)

    monkeypatch.setattr(rs.earliest, "check_line", check_line)
    placed = reserve(rs, pool, 2)
    assert seen == [(True, frozenset({placed["nodeId"]}))]  # unlocked, its node claimed
    assert rs.core.in_flight(pool) == frozenset()  # and let go once saved


def test_a_refused_queue_check_lets_go_of_the_node(runtime: Any,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    rs, _, pool, _ = setup(runtime, nodes=1)

    def check_line(*args: Any, **kwargs: Any) -> None:
        raise NoCapacity("would delay the queue's head", data={"queueHead": "rsv_x"})

    monkeypatch.setattr(rs.earliest, "check_line", check_line)
    with pytest.raises(NoCapacity):
        reserve(rs, pool, 2)
    assert rs.core.in_flight(pool) == frozenset()
    assert reserve(rs, pool, 2, queue=True)["state"] == "queued"  # --queue: in line
