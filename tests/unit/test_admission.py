"""Calls per token (api/http/http_limits.py): one caller never takes every store worker.

One token (or one anonymous address) runs at most a quarter of the shared workers
at once; its next calls wait in order up to a bound, then get ``rate_limited``
at once. Another caller is admitted meanwhile without waiting.
"""

from __future__ import annotations

import anyio
import pytest
from anyio import wait_all_tasks_blocked

from better_compute.api.http.http_limits import Admission
from better_compute.domain.errors import RateLimited


def test_one_caller_runs_half_the_workers_and_queues_a_bounded_number() -> None:
    async def main() -> None:
        admission = Admission.for_limiter(anyio.CapacityLimiter(8))
        assert admission.per_caller == 2
        admission = Admission(per_caller=2, queue=3)
        release = anyio.Event()
        running: list[int] = []
        order: list[int] = []

        async def call(i: int) -> None:
            async with admission.slot("token:a"):
                running.append(i)
                order.append(i)
                await release.wait()
                running.remove(i)

        async with anyio.create_task_group() as tg:
            for i in range(5):  # 2 run, 3 wait
                tg.start_soon(call, i)
            with anyio.fail_after(5):
                while len(running) < 2:
                    await anyio.sleep(0.001)
            await wait_all_tasks_blocked()  # the waiting ones had every chance to (wrongly) start
            assert sorted(running) == [0, 1]
            with pytest.raises(RateLimited) as err:  # the 6th: refused at once
                async with admission.slot("token:a"):
                    pass
            assert err.value.code == "rate_limited" and "retry" in err.value.message
            # the bound is each worker process's (serve --workers N: N x 2 and N x 16)
            assert err.value.data == {"running": 2, "waiting": 3, "per": "worker"}
            with anyio.fail_after(1):  # another token is not held up
                async with admission.slot("token:b"):
                    pass
            release.set()
        assert order == [0, 1, 2, 3, 4]  # waiting calls ran in order
        assert admission._gates == {}  # nothing kept for callers that are done

    anyio.run(main)


def test_a_call_that_stops_waiting_leaves_the_line_and_takes_no_turn() -> None:
    """The gate's own line (not a semaphore: http_limits._Gate): a waiting call cancelled
    (its client left) leaves the line, and the turn goes to the next one in it."""
    async def main() -> None:
        admission = Admission(per_caller=1, queue=5)
        release_a = anyio.Event()
        order: list[str] = []

        async def call(name: str, scope: anyio.CancelScope, until: anyio.Event | None = None
                       ) -> None:
            with scope:
                async with admission.slot("token:a"):
                    order.append(name)
                    if until is not None:
                        await until.wait()

        async with anyio.create_task_group() as tg:
            tg.start_soon(call, "a", anyio.CancelScope(), release_a)
            await wait_all_tasks_blocked()
            left = anyio.CancelScope()
            tg.start_soon(call, "left", left)
            await wait_all_tasks_blocked()
            tg.start_soon(call, "c", anyio.CancelScope())
            await wait_all_tasks_blocked()
            left.cancel()  # it leaves the line while waiting
            await wait_all_tasks_blocked()
            gate = admission._gates["token:a"]
            assert (order, gate.users, gate.running, len(gate.line)) == (["a"], 2, 1, 1)
            release_a.set()
        assert order == ["a", "c"]
        assert admission._gates == {}

    anyio.run(main)
