"""50 clients reserving on one pool at once never double-book a GPU or exceed a quota.

Five Runtimes on the same store stand for five server processes (each has its
own connections and its own in-process placement lock), ten threads each, all
released by one barrier. The quota contends: 40 of the clients are the tenant's, asking for
2 GPUs each (80) against its quota of 12, while the pool's 32 GPUs hold the owner's 10 single
GPUs and the whole quota, so only the quota refuses: exactly 6 of the tenant's creates are
placed, 34 refused with ``quota_exceeded``. The check reads the store afterwards.
"""

from __future__ import annotations

import threading
from typing import Any

from better_compute.domain.access import LOCAL_OPERATOR as OP
from better_compute.domain.access import Principal, Role
from better_compute.domain.errors import NoCapacity, QuotaExceeded
from tests.booking_checks import assert_booked_once_within_quota
from tests.fleet import add_nodes, make_pool
from tests.support import open_runtime

ACME = Principal("acme", Role.MEMBER, "tok_acme")
QUOTA = 12
PROCESSES, THREADS = 5, 10
OWNERS = 10  # clients of the pool's owner (unlimited), one GPU each: they never fill the pool


def test_fifty_clients_never_double_book_nor_exceed_the_quota(env: dict[str, str],
                                                              runtime: Any) -> None:
    pool = make_pool(runtime.service)
    nodes = add_nodes(runtime.service, pool, 4)  # 32 GPUs
    runtime.service.tenants_create(OP, "acme", None)
    runtime.service.pools_offer(OP, pool, "acme", {"gpu": QUOTA})
    runtimes = [runtime] + [open_runtime(env) for _ in range(PROCESSES - 1)]
    barrier = threading.Barrier(PROCESSES * THREADS)
    results: list[tuple[str, Any]] = []
    lock = threading.Lock()

    def client(n: int) -> None:
        rs = runtimes[n % PROCESSES].services.reservations
        owner = n % 5 == 0
        barrier.wait()
        try:
            doc = rs.create(OP if owner else ACME, tenant_id=None, pool_id=pool,
                            gpus=1 if owner else 2, duration="1h", key=f"client-{n}")
            outcome: tuple[str, Any] = ("ok", doc)
        except (NoCapacity, QuotaExceeded) as exc:
            outcome = (exc.code, exc.message)
        except Exception as exc:  # anything else fails the test below, with its message
            outcome = ("error", repr(exc))
        with lock:
            results.append(outcome)

    threads = [threading.Thread(target=client, args=(n,)) for n in range(PROCESSES * THREADS)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=240)
    finally:
        for extra in runtimes[1:]:
            extra.close()

    assert len(results) == PROCESSES * THREADS
    assert [r for r in results if r[0] == "error"] == []
    placed = [doc for kind, doc in results if kind == "ok"]
    assert placed, results

    # Against the store: every booking, every reservation, the quota.
    assert_booked_once_within_quota(runtime.store, pool, nodes, placed, "acme", QUOTA, 32)
    held = sum(d["gpuCount"] for d in placed if d["tenantId"] == "acme")
    assert held == QUOTA  # the quota, and not one GPU more
    assert sum(1 for d in placed if d["tenantId"] == "root") == OWNERS
    refusals = [kind for kind, _ in results if kind != "ok"]
    assert refusals == ["quota_exceeded"] * (PROCESSES * THREADS - OWNERS - QUOTA // 2)
