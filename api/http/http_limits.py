"""Bounds of the HTTP application: request bodies, content types and calls per token (the
connections' own bounds are api/http/listener.py's).

- A request body is at most ``MAX_BODY`` (1 MiB). A ``Content-Length`` over it
  is refused (HTTP 413) before a byte is read; a body without one (chunked) or
  with a false one is read chunk by chunk and cut off (413) as soon as it
  passes the cap. So a request never holds more than 1 MiB and one chunk.
  Every refusal made before the body is read closes the connection (and the listener's
  TLS close drops the rest unread: listener.py ``CLOSE_TIMEOUT``).
- A body must be complete within ``BODY_TIMEOUT`` (30 s, ``http.body_timeout``) of its
  head, or the call is refused with HTTP 408 and the connection closed.
- The content type is ``application/json`` (parameters such as a charset
  allowed); anything else, or none, is HTTP 415.
- Calls per token (``Admission``): the store's worker threads are shared by
  every caller (the server's CapacityLimiter). One token, or one anonymous
  client address, runs at most a quarter of them at once; its further calls
  wait their turn in order, up to ``QUEUE_PER_CALLER`` of them, and beyond
  that are refused at once with ``rate_limited`` (HTTP 429, ``Retry-After:
  1``). So one caller, however many calls it sends in parallel, leaves most
  workers (and most of the interpreter's time: the workers share one GIL) to
  everybody else, and holds a bounded amount of memory while it waits. A
  quarter, not a half: with 10 parallel maximal selectors from one token, root's whoami
  p99 is 146 ms with a quarter against 326 ms with a half.
  Under ``serve --workers N`` each worker process admits on its own (decided): the bound protects that process's threads and GIL, which are
  its own, so one token holds at most a quarter of each worker's threads, a quarter
  of the server's in all (N x 2 running and N x 16 waiting at most). A kept-alive
  connection stays with its worker, so one connection meets the per-worker bound.
  Calls per tenant: a tenant admin can mint tokens, each with its own quarter, so the
  calls of one tenant's tokens together also run at most half the threads (4 of 8) and
  queue ``QUEUE_PER_TENANT`` (64) more, per worker process; past that they get
  ``rate_limited`` with ``data.of`` = ``tenant``. A token's tenant is learnt when its
  first call authenticates (``Tenants``); that first call takes only its token's turn.
  The root tenant (the platform's operators) is bounded per token only.
- Log lines a client causes (``ClientNoise``): uvicorn logs a warning for each malformed
  request ("Invalid HTTP request received."), so a client sending garbage on many small
  connections would write as many lines (and under journald's rate limit, push the server's
  own lines out). One such line is logged a minute per message, the next saying how many
  were left out; the same for the listeners' refused and dropped handshakes.

The table of every bound is in docs/security.md ("Bounds").
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import msgspec
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from better_compute.api import net
from better_compute.api.http import listener
from better_compute.domain.access import ROOT_TENANT
from better_compute.domain.errors import RateLimited

MAX_BODY = 1 << 20
BODY_TIMEOUT = 30.0  # seconds from a request's head to its complete body
QUEUE_PER_CALLER = 16
QUEUE_PER_TENANT = 64  # calls of one tenant's tokens waiting, per worker process
JSON_TYPES = ("application/json",)


def _rpc_error(status: int, message: str, *, rpc_code: int = -32600,
               code: str = "invalid_request", request_id: Any = None,
               headers: dict[str, str] | None = None,
               data: dict[str, Any] | None = None) -> Response:
    return JSONResponse(
        {"jsonrpc": "2.0", "id": request_id,
         "error": {"code": rpc_code, "message": message, "data": {**(data or {}),
                                                                  "code": code}}},
        status_code=status, headers=headers,
    )


# A refusal sent before the body was read closes the connection after it: otherwise the
# server would go on receiving (and decrypting) an unwanted body to reach the next request.
_CLOSE = {"connection": "close"}


def too_large() -> Response:
    return _rpc_error(413, "request body over 1 MiB: send one JSON-RPC request of at most "
                           "1 MiB (1,048,576 bytes)", headers=_CLOSE)


def refuse_headers(request: Request) -> Response | None:
    """A refusal decided from the headers alone (size, content type), before the body."""
    length = request.headers.get("content-length")
    if length is not None:
        if not length.strip().isdigit():
            return _rpc_error(400, f"Content-Length {length[:40]!r} is not a number of bytes",
                              headers=_CLOSE)
        if int(length) > MAX_BODY:
            return too_large()
    media = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if media not in JSON_TYPES:
        shown = repr(media[:60]) if media else "no content type"
        return _rpc_error(415, f"the body must be JSON-RPC with Content-Type: application/json; "
                               f"this request has {shown}", headers=_CLOSE)
    return None


def too_slow(timeout: float) -> Response:
    return _rpc_error(408, f"the request body did not arrive within {timeout:g} s of its "
                           "headers: send the whole body at once", headers=_CLOSE)


class BodyTooSlow(Exception):
    """The body was not complete within its time (``read_body``)."""


async def read_body(request: Request, limit: int = MAX_BODY,
                    timeout: float = BODY_TIMEOUT) -> bytes | None:
    """The body, read chunk by chunk; None (and no more reading) once it passes ``limit``.
    Raises BodyTooSlow when it is not complete within ``timeout`` seconds."""
    chunks: list[bytes] = []
    size = 0
    with anyio.move_on_after(timeout) as scope:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                return None
            chunks.append(chunk)
    if scope.cancelled_caught:
        raise BodyTooSlow
    return b"".join(chunks)


def caller_key(request: Request | None, token: str | None) -> str:
    """Whose turn a call takes: its bearer token's (hashed), or its client address's."""
    if token:
        return "token:" + hashlib.sha256(token.encode()).hexdigest()[:32]
    client = request.client.host if request is not None and request.client else "unknown"
    return "anonymous:" + client


class _Id(msgspec.Struct):
    id: int | str | None = None


_ID = msgspec.json.Decoder(_Id)


def rate_limited(exc: RateLimited, body: bytes) -> Response:
    try:
        request_id = _ID.decode(body).id
    except Exception:  # a body too broken to name its id: answered with id null
        request_id = None
    return _rpc_error(429, exc.message, rpc_code=exc.rpc_code, code=exc.code,
                      request_id=request_id, headers={"retry-after": "1"}, data=exc.data)


@dataclass
class _Gate:
    """One caller's (or tenant's) turns: ``running`` of at most ``limit``, then a line.

    Not an anyio.Semaphore: its acquire always yields to the event loop twice (a
    checkpoint), ~20 us a call even with room; here a call with room takes its turn at
    once, and a turn given back goes straight to the first in line."""

    limit: int
    users: int = 0  # running and waiting
    running: int = 0
    line: collections.deque[anyio.Event] = field(default_factory=collections.deque)

    async def take(self) -> None:
        if self.running < self.limit and not self.line:
            self.running += 1
            return
        turn = anyio.Event()
        self.line.append(turn)
        try:
            await turn.wait()
        except BaseException:
            if turn.is_set():  # given the turn as it was cancelled: pass it on
                self.give_back()
            else:
                self.line.remove(turn)
            raise

    def give_back(self) -> None:
        if self.line:
            self.line.popleft().set()  # the turn goes to the next in line, still running
        else:
            self.running -= 1


class Admission:
    """At most ``per_caller`` calls of one caller (a token, an anonymous address) at once,
    ``queue`` more waiting in order; and at most ``per_tenant`` calls of one tenant's tokens
    together, ``tenant_queue`` more waiting (the root tenant is not bounded this way)."""

    def __init__(self, per_caller: int, queue: int = QUEUE_PER_CALLER,
                 per_tenant: int | None = None, tenant_queue: int | None = None) -> None:
        self.per_caller = max(1, per_caller)
        self.queue = queue
        self.per_tenant = max(1, per_tenant if per_tenant is not None else 2 * self.per_caller)
        self.tenant_queue = tenant_queue if tenant_queue is not None else QUEUE_PER_TENANT
        self._gates: dict[str, _Gate] = {}

    @classmethod
    def for_limiter(cls, limiter: anyio.CapacityLimiter) -> Admission:
        """A quarter of the shared workers per caller, half per tenant (at least one)."""
        return cls(int(limiter.total_tokens) // 4, per_tenant=int(limiter.total_tokens) // 2)

    @contextlib.asynccontextmanager
    async def slot(self, key: str, tenant: str | None = None) -> AsyncIterator[None]:
        """A turn for a call of ``key`` (``caller_key``), of ``tenant`` when known."""
        async with self._turn(key, self.per_caller, self.queue):
            if tenant is None or tenant == ROOT_TENANT:
                yield
            else:
                async with self._turn(f"tenant:{tenant}", self.per_tenant, self.tenant_queue,
                                      tenant):
                    yield

    @contextlib.asynccontextmanager
    async def _turn(self, key: str, running: int, waiting: int, tenant: str | None = None
                    ) -> AsyncIterator[None]:
        """A turn at ``key``'s gate: a caller's, or ``tenant``'s (all its tokens together)."""
        gate = self._gates.get(key)
        if gate is None:
            gate = self._gates[key] = _Gate(running)
        if gate.users >= running + waiting:
            data: dict[str, Any] = {"running": running, "waiting": gate.users - running,
                                    "per": "worker"}
            who, together = "this token", ""
            if tenant is not None:
                data["of"] = "tenant"
                who, together = f"tenant {tenant}", ", all its tokens together"
            raise RateLimited(
                f"{who} already has {gate.users} calls running or waiting on this server "
                f"process (at most {running} run at once and {waiting} wait, per worker "
                f"process{together}): wait for them, then retry", data=data)
        gate.users += 1
        try:
            await gate.take()
            try:
                yield
            finally:
                gate.give_back()
        finally:
            gate.users -= 1
            if gate.users == 0:
                del self._gates[key]


class Tenants:
    """The tenant of each token seen here (by ``caller_key``), learnt when a call of it
    authenticates, so that its next calls take their tenant's turn (``Admission``). A
    token's tenant never changes; at most ``size`` are kept (then it starts afresh)."""

    def __init__(self, size: int = 10_000) -> None:
        self.size = size
        self._of: dict[str, str] = {}

    def of(self, key: str) -> str | None:
        return self._of.get(key)

    def learn(self, key: str, tenant: str) -> None:
        if key not in self._of and len(self._of) >= self.size:
            self._of.clear()
        self._of[key] = tenant


class ClientNoise(logging.Filter):
    """At most one line per ``window`` seconds for each warning logged about what a client
    did (uvicorn's for a malformed request, the listeners' for refused or dropped TLS
    handshakes, the gateway's for a failed one); the
    next line that passes says how many were left out before it."""

    MESSAGES = frozenset({("uvicorn.error", "Invalid HTTP request received."),
                          (net.log.name, net.REFUSED), (net.log.name, net.DROPPED),
                          (net.log.name, listener.ACCEPT_FAILED),
                          ("uvicorn.error", "Unsupported upgrade request."),
                          ("better_compute.gateway", "gateway: TLS handshake refused: %s")})

    def __init__(self, window: float = 60.0, clock: Callable[[], float] = time.monotonic
                 ) -> None:
        super().__init__()
        self.window = window
        self.clock = clock
        self._lock = threading.Lock()
        self._last: dict[str, tuple[float, int]] = {}  # message -> (logged at, left out since)

    def filter(self, record: logging.LogRecord) -> bool:
        if (record.name, record.msg) not in self.MESSAGES:
            return True
        message = str(record.msg)
        with self._lock:
            now = self.clock()
            logged_at, left_out = self._last.get(message, (None, 0))
            if logged_at is not None and now - logged_at < self.window:
                self._last[message] = (logged_at, left_out + 1)
                return False
            self._last[message] = (now, 0)
        record.msg = (f"{message} (a client's; {left_out} more like it in the "
                      f"{self.window:g} s before were not logged)" if left_out else
                      f"{message} (a client's; more within {self.window:g} s are not logged)")
        return True
