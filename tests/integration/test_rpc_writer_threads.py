"""The calls that book or free GPUs run in the writers' threads: one thread of their own on
SQLite, the shared threads on PostgreSQL (api/http/app.py).

On SQLite, more writers at once only take the GIL from each other: with two writer threads,
16 clients create 18 % and release 27 % more per second on two workers than with eight
shared threads, and with one 12 % and 6 % more again; on PostgreSQL two writer threads
release 11 % less (docs/internals/performance-history.md).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anyio
import httpx
import pytest

from better_compute.api.http import rpc
from better_compute.api.http.app import WRITER_THREADS, ServerState, build_app
from better_compute.api.runtime import Runtime
from tests.fleet import add_nodes, make_pool
from tests.support import open_runtime, quick_init

RPC = "/api/compute/rpc"
WRITES = {"reservations.create", "reservations.release", "reservations.cancel",
          "reservations.extend"}


def body(method: str, **params: Any) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": 1, "method": method,
                       "params": params}).encode()


def test_the_methods_that_book_or_free_gpus_are_the_writers() -> None:
    assert {m.name for m in rpc.METHODS.values() if m.writes} == WRITES


@pytest.mark.parametrize("method", sorted(WRITES))
def test_a_writer_is_told_from_its_body(method: str) -> None:
    assert rpc.writes_hint(body(method, reservationId="rsv_x"))


@pytest.mark.parametrize("method", ["reservations.get", "reservations.list", "system.whoami",
                                    "reservations.preview", "pools.create"])
def test_other_calls_are_not_writers(method: str) -> None:
    assert not rpc.writes_hint(body(method, poolId="pool_x"))


@pytest.fixture
def served(env: dict[str, str]) -> Iterator[tuple[Runtime, str]]:
    rt = open_runtime(env)
    token = quick_init(rt)
    try:
        yield rt, token
    finally:
        rt.close()


def test_each_call_runs_in_its_threads(served: tuple[Runtime, str]) -> None:
    """A create and a release borrow the writers' threads, a read the shared threads: seen from
    inside the calls, by what each limiter has lent."""
    runtime, token = served
    pool = make_pool(runtime.service)
    add_nodes(runtime.service, pool, 1)
    runtime.projections.catch_up()
    seen: dict[str, tuple[int, int]] = {}
    service = runtime.services.reservations
    state = ServerState(runtime, anyio.CapacityLimiter(8))

    def watching(name: str, real: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            seen[name] = (int(state.writers.borrowed_tokens),
                          int(state.limiter.borrowed_tokens))
            return real(*args, **kwargs)
        return call

    service.create = watching("create", service.create)  # type: ignore[method-assign]
    service.release = watching("release", service.release)  # type: ignore[method-assign]
    service.get_doc = watching("get", service.get_doc)  # type: ignore[method-assign]
    app = build_app(runtime)
    app.state.bc = state
    headers = {"authorization": f"Bearer {token}", "content-type": "application/json"}

    async def go() -> None:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="https://testserver") as c:
            made = (await c.post(RPC, headers=headers, content=body(
                "reservations.create", poolId=pool, gpus=1, duration="1h"))).json()
            rsv = made["result"]["id"]
            got = (await c.post(RPC, headers=headers, content=body(
                "reservations.get", reservationId=rsv))).json()
            assert got["result"]["id"] == rsv
            done = (await c.post(RPC, headers=headers, content=body(
                "reservations.release", reservationId=rsv))).json()
            assert done["result"]["state"] == "released"

    anyio.run(go)
    if runtime.config.backend == "sqlite":
        assert state.writers is not state.limiter
        assert state.writers.total_tokens == WRITER_THREADS == 1
        assert seen == {"create": (1, 0), "get": (0, 1), "release": (1, 0)}
    else:  # one pool of threads for every call
        assert state.writers is state.limiter
        assert seen == {"create": (1, 1), "get": (1, 1), "release": (1, 1)}
