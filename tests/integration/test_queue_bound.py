"""A tenant's queued reservations in one pool are bounded (``reservations.max_queued``).

A queued reservation holds no GPUs and no quota, and every queue dispatcher pass walks a
pool's whole line (an earliest-start search for each queued reservation whose quota allows
it): unbounded, one tenant's thousands would make every pass of the pool slow for every
tenant (docs/performance.md). The create past the bound is refused with ``quota_exceeded`` (``data.per``: ``queued``) and
changes nothing; a retry of one already queued still answers it; other tenants, other pools
and the tenant's own placements are unaffected; a place comes back when one leaves the queue.
"""

from __future__ import annotations

from typing import Any

import pytest

from better_compute.domain.errors import QuotaExceeded
from tests.integration.test_queue_service import BETA, offer
from tests.integration.test_reservations_service import ACME, reserve, setup
from tests.support import open_runtime, quick_init

BOUND = 3


@pytest.fixture
def bounded(env: dict[str, str]) -> Any:
    rt = open_runtime({**env, "BETTER_COMPUTE_RESERVATIONS_MAX_QUEUED": str(BOUND)})
    quick_init(rt)
    yield rt
    rt.close()


def test_a_tenant_queues_at_most_the_bound_in_a_pool(bounded: Any) -> None:
    rs, _, pool, _ = setup(bounded, nodes=1, quota=2)
    offer(bounded, pool, "beta", 2)
    held = reserve(rs, pool, 2, who=ACME, duration="4h")  # acme's whole quota: the rest queue
    queued = [reserve(rs, pool, 1, who=ACME, queue=True, key=f"q{n}") for n in range(BOUND)]
    assert [q["state"] for q in queued] == ["queued"] * BOUND
    log_head = bounded.store.recorder.max_notification_id()

    with pytest.raises(QuotaExceeded) as refused:
        reserve(rs, pool, 1, who=ACME, queue=True, key="one-too-many")
    assert refused.value.data == {"per": "queued", "queued": BOUND, "limit": BOUND}
    assert f"already has {BOUND} reservations queued in pool {pool}" in refused.value.message
    assert "reservations.max_queued" in refused.value.message
    assert "release --cancel" in refused.value.message  # the fix
    assert bounded.store.recorder.max_notification_id() == log_head  # nothing changed

    # A retry of one already queued is answered as before; another tenant still queues.
    assert reserve(rs, pool, 1, who=ACME, queue=True, key="q0")["id"] == queued[0]["id"]
    reserve(rs, pool, 2, who=BETA, duration="4h")
    assert reserve(rs, pool, 1, who=BETA, queue=True)["state"] == "queued"

    # One leaves the queue: its place comes back.
    assert rs.release(ACME, queued[0]["id"], cancel=True)["state"] == "cancelled"
    assert reserve(rs, pool, 1, who=ACME, queue=True, key="again")["state"] == "queued"
    assert rs.release(ACME, held["id"])["state"] == "released"


def test_zero_is_no_bound(env: dict[str, str]) -> None:
    rt = open_runtime({**env, "BETTER_COMPUTE_RESERVATIONS_MAX_QUEUED": "0"})
    try:
        quick_init(rt)
        rs, _, pool, _ = setup(rt, nodes=1, quota=1)
        reserve(rs, pool, 1, who=ACME)
        assert all(reserve(rs, pool, 1, who=ACME, queue=True)["state"] == "queued"
                   for _ in range(BOUND + 2))
    finally:
        rt.close()
