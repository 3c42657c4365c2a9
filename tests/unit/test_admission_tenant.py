"""Calls per tenant (api/http/http_limits.py ``Admission``): many tokens, one share.

Each token runs at most a quarter of a worker's store threads (test_admission.py), but a
tenant admin can mint tokens, and four tokens would hold every thread. So the calls of one
tenant's tokens together run at most half the threads and queue a bounded
number; the root tenant (the platform's operators) is not bounded this way.
"""

from __future__ import annotations

import anyio
import pytest
from anyio import wait_all_tasks_blocked

from better_compute.api.http.http_limits import Admission
from better_compute.domain.errors import RateLimited


def test_a_tenants_tokens_share_one_bound() -> None:
    async def main() -> None:
        admission = Admission.for_limiter(anyio.CapacityLimiter(8))
        assert (admission.per_caller, admission.per_tenant) == (2, 4)
        admission = Admission(per_caller=2, queue=16, per_tenant=3, tenant_queue=2)
        release = anyio.Event()
        running: list[str] = []

        async def call(token: str) -> None:
            async with admission.slot(f"token:{token}", "acme"):
                running.append(token)
                await release.wait()
                running.remove(token)

        async with anyio.create_task_group() as tg:
            for token in ("a", "b", "c", "d", "e"):  # five tokens of acme: 3 run, 2 wait
                tg.start_soon(call, token)
            with anyio.fail_after(5):
                while len(running) < 3:
                    await anyio.sleep(0.001)
            await wait_all_tasks_blocked()
            assert running == ["a", "b", "c"]
            with pytest.raises(RateLimited) as err:  # a sixth token of acme: refused at once
                async with admission.slot("token:f", "acme"):
                    pass
            assert "tenant acme already has 5 calls running or waiting" in err.value.message
            assert err.value.data == {"running": 3, "waiting": 2, "per": "worker",
                                      "of": "tenant"}
            with anyio.fail_after(1):  # another tenant, root, and an anonymous caller pass
                for key, tenant in (("token:g", "beta"), ("token:h", "root"),
                                    ("anonymous:10.0.0.1", None)):
                    async with admission.slot(key, tenant):
                        pass
            release.set()
        assert admission._gates == {}  # nothing kept for callers that are done

    anyio.run(main)


def test_a_token_past_its_own_bound_is_refused_before_its_tenant_counts_it() -> None:
    async def main() -> None:
        admission = Admission(per_caller=1, queue=0, per_tenant=4, tenant_queue=0)
        release = anyio.Event()
        entered = anyio.Event()

        async def call() -> None:
            async with admission.slot("token:a", "acme"):
                entered.set()
                await release.wait()

        async with anyio.create_task_group() as tg:
            tg.start_soon(call)
            await entered.wait()
            with pytest.raises(RateLimited) as err:
                async with admission.slot("token:a", "acme"):
                    pass
            assert "this token already has 1 calls" in err.value.message
            assert err.value.data == {"running": 1, "waiting": 0, "per": "worker"}
            assert admission._gates["tenant:acme"].users == 1  # the refused one never counted
            release.set()

    anyio.run(main)
