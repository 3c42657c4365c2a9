"""Helpers of the hostile-input tests: a populated store, the real ASGI app.

``World`` is a store with something of every kind (tenants, tokens of every
role, a site, a pool offered to ``acme``, adopted nodes, a reservation, a join
token), so that every method has an object to aim at. ``App`` runs the real
Starlette app with its lifespan running in a portal, exactly what ``serve`` runs
minus the socket. ``raw_post`` drives the ASGI app by hand, to count how much
of a request body it reads.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.from_thread
import httpx
from starlette.types import Message, Scope

from better_compute.api.http.app import ServerState, build_app
from better_compute.api.runtime import Runtime
from better_compute.domain.access import LOCAL_OPERATOR
from tests.fleet import add_nodes, make_pool
from tests.support import open_runtime, quick_init

RPC = "/api/compute/rpc"
ROLES = ("root", "admin", "member", "reader")  # root admin; acme admin, member, read-only


@dataclass
class World:
    rt: Runtime
    tokens: dict[str, str] = field(default_factory=dict)
    ids: dict[str, str] = field(default_factory=dict)

    def head(self) -> int:
        return int(self.rt.store.recorder.max_notification_id() or 0)


def build_world(env: dict[str, str]) -> World:
    rt = open_runtime(env)
    world = World(rt)
    world.tokens["root"] = quick_init(rt)
    service = rt.service
    service.tenants_create(LOCAL_OPERATOR, "acme", None)
    for name, role in (("admin", "admin"), ("member", "member"), ("reader", "read-only")):
        world.tokens[name] = service.tokens_create(LOCAL_OPERATOR, "acme", role, None)["token"]
    pool = make_pool(service, key="pool-hostile")
    world.ids["pool"] = pool
    world.ids["site"] = service.pools_get(LOCAL_OPERATOR, pool)["siteId"]
    service.pools_offer(LOCAL_OPERATOR, pool, "acme", {"gpu": 16})
    world.ids["node"] = add_nodes(service, pool, 2)[0]
    member = service.authenticate(world.tokens["member"])
    rsv = rt.services.reservations.create(member, tenant_id=None, pool_id=pool, gpus=1,
                                       duration="2h")
    world.ids["rsv"] = rsv["id"]
    jt = rt.services.join.create(LOCAL_OPERATOR, pool, "2h", 5, None, None, None, None)
    world.ids["jt"] = jt["id"]
    world.ids["tok"] = service.authenticate(world.tokens["reader"]).token_id or ""
    return world


class App:
    """The real app of ``runtime`` with its lifespan running, called like a socket would.

    The lifespan (the /watch hub, the state) runs in a portal's event loop, and
    each call goes through httpx's ASGI transport on that loop.
    """

    def __init__(self, runtime: Runtime) -> None:
        self.app = build_app(runtime)
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> App:
        self.portal = self._stack.enter_context(anyio.from_thread.start_blocking_portal())
        self._stack.enter_context(self.portal.wrap_async_context_manager(
            self.app.router.lifespan_context(self.app)))
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def request(self, method: str, path: str, **kw: Any) -> httpx.Response:
        async def go() -> httpx.Response:
            transport = httpx.ASGITransport(app=self.app)
            async with httpx.AsyncClient(transport=transport, base_url="https://testserver",
                                         timeout=60) as client:
                return await client.request(method, path, **kw)

        return self.portal.call(go)

    def post(self, body: bytes, token: str | None = None,
             content_type: str | None = "application/json", **headers: str) -> httpx.Response:
        if token:
            headers["authorization"] = f"Bearer {token}"
        if content_type:
            headers["content-type"] = content_type
        return self.request("POST", RPC, content=body, headers=headers)

    def call(self, method: str, token: str | None = None, params: Any = None,
             request_id: int | str = 1) -> dict[str, Any]:
        """The JSON-RPC answer (HTTP 200 asserted)."""
        body = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params or {}}
        response = self.post(json.dumps(body).encode(), token)
        assert response.status_code == 200, (response.status_code, response.text[:500])
        assert response.headers["content-type"].startswith("application/json")
        answer: dict[str, Any] = response.json()
        return answer


def code_of(answer: dict[str, Any]) -> str | None:
    """The stable error code of an answer (None when it succeeded)."""
    if "error" not in answer:
        return None
    return str(answer["error"]["data"]["code"])


@dataclass
class RawAnswer:
    status: int
    headers: dict[str, str]
    body: bytes
    chunks_read: int


def raw_post(runtime: Runtime, headers: dict[str, str], chunks: Iterator[bytes]) -> RawAnswer:
    """POST to the rpc route through the ASGI interface, counting the body chunks it reads."""
    app = build_app(runtime)
    app.state.bc = ServerState(runtime, anyio.CapacityLimiter(4))
    read = 0
    sent: list[Message] = []

    async def receive() -> Message:
        nonlocal read
        chunk = next(chunks, None)
        if chunk is None:
            return {"type": "http.request", "body": b"", "more_body": False}
        read += 1
        return {"type": "http.request", "body": chunk, "more_body": True}

    async def send(message: Message) -> None:
        sent.append(message)

    scope: Scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
                    "method": "POST", "scheme": "https", "path": RPC, "raw_path": RPC.encode(),
                    "query_string": b"", "root_path": "", "client": ("127.0.0.1", 5000),
                    "server": ("testserver", 443),
                    "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
                    "state": {}}
    anyio.run(app, scope, receive, send)
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return RawAnswer(start["status"], {k.decode(): v.decode() for k, v in start["headers"]},
                     body, read)
