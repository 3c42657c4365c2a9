"""The server's lifespan outlives a background task that fails: nothing closes the store.

Unsupervised, a lifespan task that raises (the gateway's heartbeat flush, say) kills the
lifespan's task group, whose ``finally`` closes the store while uvicorn keeps serving: a
server broken for good. Here a task that fails twice after it started runs in the
real lifespan of the real app, and the app keeps answering from its store throughout.
"""

from __future__ import annotations

from typing import Any

import anyio
import anyio.abc
import httpx

from better_compute.api.http.app import build_app


def test_a_failing_background_task_is_restarted_and_the_store_stays_open(runtime: Any) -> None:
    runs: list[int] = []
    third = anyio.Event()

    async def flaky(state: Any, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        runs.append(len(runs))
        task_status.started()
        if len(runs) < 3:
            raise RuntimeError("the store went away under the flush")
        third.set()
        await anyio.sleep_forever()

    app = build_app(runtime, tasks=[flaky])
    token = runtime.root_token

    async def main() -> list[tuple[int, Any]]:
        answers = []
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="https://c.test") as c:
                with anyio.fail_after(20):
                    await third.wait()
                rpc = await c.post("/api/compute/rpc", headers={"authorization": f"Bearer {token}"},
                                   json={"jsonrpc": "2.0", "id": 1, "method": "system.whoami"})
                answers.append((rpc.status_code, rpc.json()))
                ready = await c.get("/api/compute/ready")
                answers.append((ready.status_code, ready.json()))
        return answers

    (rpc_status, rpc), (ready_status, ready) = anyio.run(main)
    assert runs == [0, 1, 2]
    assert rpc_status == 200 and "result" in rpc, rpc
    assert (ready_status, ready) == (200, {"status": "ready", "checks": {"store": "ok"}})
