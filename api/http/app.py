"""The HTTP surface: Starlette routes under /api/compute.

The lifespan owns the Runtime (store, projections, service); the library is
synchronous, so every store call runs in a worker thread, bounded by a
CapacityLimiter no larger than the store's connection pool.

On SQLite the calls that book or free GPUs (``rpc.Method.writes``) run in threads of
their own (``ServerState.writers``, a limiter of ``WRITER_THREADS``), one at a time: their
work is the interpreter's and SQLite's, in this process, under one writer at a time, so more
of them at once only make the threads take the GIL from each other (and from the one holding
the pool's lock or the writer's lock); measured, one writer thread beats two, which beats
eight. Other calls keep the shared threads, which writers cannot fill.
On PostgreSQL writers wait on the network, where more at once overlap: they share the
threads with every other call.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from better_compute.api.http import console, http_limits, join_routes, readiness, rpc, watch
from better_compute.api.http.metrics import ServerMetrics
from better_compute.api.http.request_log import (
    CURRENT,
    REQUEST_ID_HEADER,
    RequestRecord,
    authenticated,
    log_request,
    new_request_id,
)
from better_compute.api.runtime import Runtime
from better_compute.api.settings import env_seconds
from better_compute.api.supervise import Retry, supervised
from better_compute.domain.access import Principal
from better_compute.domain.errors import BetterComputeError, PermissionDenied, RateLimited
from better_compute.projections.framework import Follower

WRITER_THREADS = 1  # the writers' threads on SQLite
API_PREFIX = "/api/compute"
RPC_PATH = f"{API_PREFIX}/rpc"
# The status a call whose caller left mid-body is logged and counted with (nginx's
# "client closed request"); nobody receives it.
CLIENT_LEFT = 499

# A lifespan task: ``async def task(state, *, task_status)``, started with tg.start.
LifespanTask = Callable[..., Awaitable[Any]]
MAX_BODY = http_limits.MAX_BODY


@dataclass
class ServerState:
    runtime: Runtime
    limiter: anyio.CapacityLimiter
    gateway_url: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    # Calls per token (api/http/http_limits.py): a quarter of the limiter's workers at most,
    # half of them per tenant, whose tokens' tenants are learnt as they authenticate.
    admission: http_limits.Admission = field(init=False)
    tenants: http_limits.Tenants = field(default_factory=http_limits.Tenants)
    # The writers' threads (see the module's docstring): the shared limiter on PostgreSQL.
    writers: anyio.CapacityLimiter = field(init=False)
    # Seconds a call's body has after its head (http_limits.py; http.body_timeout).
    body_timeout: float = field(init=False)
    # Set when the server begins to stop: /ready answers 503 and every answer closes its
    # connection (serve.py's drain, docs/high-availability.md).
    stopping: bool = False

    def __post_init__(self) -> None:
        self.admission = http_limits.Admission.for_limiter(self.limiter)
        self.body_timeout = env_seconds(self.runtime.env, "BETTER_COMPUTE_HTTP_BODY_TIMEOUT",
                                        http_limits.BODY_TIMEOUT)
        self.writers = anyio.CapacityLimiter(WRITER_THREADS) \
            if self.runtime.config.backend == "sqlite" else self.limiter

    def limiter_for(self, body: bytes) -> anyio.CapacityLimiter:
        """The threads a JSON-RPC call of ``body`` runs in (one pool, the body unread, where
        the writers have no threads of their own)."""
        if self.writers is self.limiter:
            return self.limiter
        return self.writers if rpc.writes_hint(body) else self.limiter


def _bearer(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    scheme, _, value = header.partition(" ")
    return value.strip() if scheme.lower() == "bearer" and value.strip() else None


async def rpc_endpoint(request: Request) -> Response:
    """One JSON-RPC request, counted in the metrics and logged (api/http/request_log.py)."""
    started = time.perf_counter()
    record = RequestRecord(new_request_id(request.headers.get(REQUEST_ID_HEADER)),
                           client=request.client.host if request.client else None)
    current = CURRENT.set(record)
    try:
        response = await _rpc(request)
    finally:
        CURRENT.reset(current)
    seconds = time.perf_counter() - started
    request.app.state.metrics.observe(record, seconds)
    log_request(record, seconds)
    response.headers[REQUEST_ID_HEADER] = record.request_id
    return response


async def _rpc(request: Request) -> Response:
    state: ServerState = request.app.state.bc
    refusal = http_limits.refuse_headers(request)  # size and content type, before reading
    if refusal is not None:
        return refusal
    try:
        body = await http_limits.read_body(request, timeout=state.body_timeout)
    except http_limits.BodyTooSlow:
        return http_limits.too_slow(state.body_timeout)
    except ClientDisconnect:  # the caller left mid-body: nothing done, nobody to answer
        record = CURRENT.get()
        if record is not None:
            record.code = "client_left"
        return Response(status_code=CLIENT_LEFT)
    if body is None:
        return http_limits.too_large()
    token = _bearer(request)
    service = state.runtime.service
    key = http_limits.caller_key(request, token)

    def authenticate() -> Principal:
        principal = service.authenticate(token)
        authenticated(principal)
        if token:
            state.tenants.learn(key, principal.tenant_id)
        return principal

    try:
        async with state.admission.slot(key, state.tenants.of(key)):
            answer = await anyio.to_thread.run_sync(
                rpc.handle, body, state.runtime.services, authenticate,
                limiter=state.limiter_for(body),
            )
    except RateLimited as exc:
        return http_limits.rate_limited(exc, body)
    if not answer:  # a notification: JSON-RPC answers nothing
        return Response(status_code=204)
    return Response(answer, media_type="application/json")


class CloseWhenStopping:
    """ASGI middleware: once the server is stopping, every answer says ``Connection: close``,
    so a client's next call opens a new connection, which the load balancer sends to another
    replica (uvicorn ends a connection whose answer says so)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        app = scope.get("app")
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def closing(message: Any) -> None:
            state = getattr(getattr(app, "state", None), "bc", None)
            if message["type"] == "http.response.start" and getattr(state, "stopping", False):
                headers = [(k, v) for k, v in message.get("headers", ())
                           if k.lower() != b"connection"]
                message = {**message, "headers": [*headers, (b"connection", b"close")]}
            await send(message)

        await self.app(scope, receive, closing)


async def health(request: Request) -> Response:
    return JSONResponse({"status": "ok"})


async def metrics_endpoint(request: Request) -> Response:
    """GET /metrics with any root-tenant token (docs/metrics.md)."""
    state: ServerState = request.app.state.bc
    token = _bearer(request)

    def render() -> bytes:
        principal = state.runtime.service.authenticate(token)
        if not principal.is_root:
            raise PermissionDenied(
                f"/metrics is for the platform's operators: use a token of the root tenant; "
                f"this one is of tenant {principal.tenant_id}")
        return bytes(request.app.state.metrics.render())

    try:
        body = await anyio.to_thread.run_sync(render, limiter=state.limiter)
    except BetterComputeError as exc:
        return JSONResponse({"error": {"code": exc.code, "message": exc.message}},
                            status_code=403 if exc.code == "permission_denied" else 401)
    return Response(body, media_type="text/plain; version=0.0.4; charset=utf-8")


@contextlib.asynccontextmanager
async def following(runtime: Runtime) -> AsyncIterator[Follower]:
    """This process's ``Follower`` of the read models (projections/framework.py), in a thread
    of its own for the life of the server: the read models other than the inline free-GPU
    index follow the log in batches, and a call that needs one current waits for it."""
    retry = Retry("following the read models", logging.getLogger("better_compute.store"))
    follower = Follower(runtime.projections, on_failure=retry.failed,
                        on_success=retry.succeeded)
    runtime.projections.follower = follower
    runtime.store.add_commit_listener(follower.poke)
    core = runtime.services.reservations.core
    runtime.projections.after_follow.append(core.note_queues)
    async with anyio.create_task_group() as tg:
        tg.start_soon(functools.partial(anyio.to_thread.run_sync, follower.run,
                                        abandon_on_cancel=False,
                                        limiter=anyio.CapacityLimiter(1)))
        try:
            yield follower
        finally:
            runtime.projections.follower = None
            runtime.projections.after_follow.remove(core.note_queues)
            core.forget_queues()
            follower.stop()


def build_app(runtime: Runtime, *, gateway_url: str | None = None,
              routes: list[Route] | None = None,
              on_startup: Callable[[ServerState], Any] | None = None,
              tasks: Sequence[LifespanTask] = ()) -> Starlette:
    """The ASGI app for one Runtime. Extra routes (events, well-known) plug in here.

    ``tasks`` run for the life of the server in the lifespan's task group
    (the gateway, the controllers): each is started with ``tg.start(task,
    state)`` once the event hub runs, supervised (restarted with backoff when it
    fails, api/supervise.py), and cancelled at shutdown. The store is closed
    only when the lifespan ends.
    """

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        state = ServerState(runtime, anyio.CapacityLimiter(8),
                            gateway_url or runtime.service.gateway_url)
        app.state.bc = state
        app.state.metrics.bind(state)
        state.extra["metrics"] = app.state.metrics
        if on_startup is not None:
            on_startup(state)
        try:
            # This process's follower of the read models and its /watch hub, then the
            # lifespan tasks that use them.
            async with following(runtime), watch.running_hub(state), \
                    anyio.create_task_group() as tg:
                for task in tasks:
                    await tg.start(supervised, task, state)
                try:
                    yield
                finally:
                    tg.cancel_scope.cancel()
        finally:
            await anyio.to_thread.run_sync(runtime.close)

    base = [
        Route(RPC_PATH, rpc_endpoint, methods=["POST"]),
        Route(f"{API_PREFIX}/health", health, methods=["GET"]),
        Route("/metrics", metrics_endpoint, methods=["GET"]),
        Route(f"{API_PREFIX}/ready", readiness.ready, methods=["GET"]),
        *join_routes.ROUTES,
        *watch.ROUTES,
        *console.ROUTES,
    ]
    app = Starlette(routes=base + list(routes or []), lifespan=lifespan,
                    middleware=[Middleware(CloseWhenStopping)])
    app.state.metrics = ServerMetrics()
    return app
