"""Bounds of the HTTP surface: request bodies, content types and calls per token.

- A request body is at most ``MAX_BODY`` (1 MiB). A ``Content-Length`` over it
  is refused (HTTP 413) before a byte is read; a body without one (chunked) or
  with a false one is read chunk by chunk and cut off (413) as soon as it
  passes the cap. So a request never holds more than 1 MiB and one chunk.
  Every refusal made before the body is read closes the connection, and
  ``protocol_class`` aborts it one second later if the body is still coming
  (a TLS close otherwise goes on reading, and decrypting, whatever the client
  sends for up to 30 s while it waits for the client's close_notify).
- Time (slow clients, "slowloris"): the TLS handshake has ``HEAD_TIMEOUT`` (10 s; the
  listeners of api/http/tls_accept.py), then a connection has ``HEAD_TIMEOUT`` from the handshake's
  end, and each request from its first byte, to send the complete request head, or it is
  ended (aborted: nothing to answer yet); between requests uvicorn's keep-alive timeout
  (5 s) ends an idle one. A body must be complete within ``BODY_TIMEOUT`` (30 s) of its
  head, or the call is refused with HTTP 408 and the connection closed. An answer the
  client takes none of for ``SEND_TIMEOUT`` (30 s: the server's buffer for it stays full, a
  "slow read") ends the connection (aborted: a close would wait for the client to read
  everything). So a client that sends or reads slowly, or stops, never holds a connection,
  a call in flight or its memory for long (and never holds a stopping server: serve.py).
  All are settings (``http.head_timeout``, ``http.body_timeout``, ``http.send_timeout``).
- Connections (``ConnectionLimits``): a server process keeps at most
  ``MAX_CONNECTIONS_PER_ADDRESS`` (256) connections of one client address and
  ``MAX_CONNECTIONS`` (4,096) in all open at once (``http.max_connections_per_address``,
  ``http.max_connections``; 0 for no bound). A connection past either is answered at once,
  before it sends anything, with HTTP 429 ``rate_limited`` (``data.per``: ``address``) or
  HTTP 503 ``unavailable`` (``data.per``: ``server``) and closed, and aborted a second
  later: it holds the server's memory (~47 KB each once TLS is up) for one second, not for
  the head timeout. So one client that opens connections as fast as it can neither runs
  the process out of file descriptors nor holds its memory, and the rest are served.
  Before that, while their TLS handshake is under way, connections are bounded on their own
  (api/http/tls_accept.py: 64 per address, 1,024 in all).
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
  quarter, not a half: with 10 parallel maximal selectors from one token,
  root's whoami p99 went from 326 to 146 ms (docs/performance.md).
  Under ``serve --workers N`` each worker process admits on its own (decided,
  docs/performance.md): the bound protects that process's threads and GIL, which are
  its own, so one token holds at most a quarter of each worker's threads, a quarter
  of the server's in all (N x 2 running and N x 16 waiting at most). A kept-alive
  connection stays with its worker, so one connection meets the per-worker bound.
  Calls per tenant: a tenant admin can mint tokens, each with its own quarter, so the
  calls of one tenant's tokens together also run at most half the threads (4 of 8) and
  queue ``QUEUE_PER_TENANT`` (64) more, per worker process; past that they get
  ``rate_limited`` with ``data.of`` = ``tenant``. A token's tenant is learnt when its
  first call authenticates (``Tenants``); that first call takes only its token's turn.
  The root tenant (the platform's operators) is bounded per token only.

- Log lines a client causes (``ClientNoise``; the gateway's refused handshakes too):
  uvicorn logs a warning for each malformed request ("Invalid HTTP request received."), so
  a client sending garbage on many small connections wrote as many lines (and under
  journald's rate limit, pushed the server's own lines out). Now one such line a minute per
  message, the next saying how many were left out.

The table of every bound is in docs/security.md ("Bounds").
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import fcntl
import hashlib
import logging
import struct
import termios
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import msgspec
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from better_compute.api.http import tls_accept
from better_compute.api.net import AddressCounts, peer_host
from better_compute.domain.access import ROOT_TENANT
from better_compute.domain.errors import RateLimited, Unavailable

MAX_BODY = 1 << 20
ABORT_UNREAD_BODY_AFTER = 1.0  # seconds a refused request's body may go on arriving
HEAD_TIMEOUT = 10.0  # seconds to a request's complete head (module docstring)
SEND_TIMEOUT = 30.0  # seconds an answer may wait for the client to take any of it
BODY_TIMEOUT = 30.0  # seconds from a request's head to its complete body
QUEUE_PER_CALLER = 16
QUEUE_PER_TENANT = 64  # calls of one tenant's tokens waiting, per worker process
MAX_CONNECTIONS_PER_ADDRESS = 256  # open connections of one client address, per process
MAX_CONNECTIONS = 4096  # open connections in all, per process
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


class ConnectionLimits(AddressCounts):
    """The connections one server process keeps open: in all and per client address.

    ``admit`` at a connection's start (after TLS) says whether it may stay; ``release`` at
    its end. ``on_open`` hears the number open after each change (a gauge), ``on_refused``
    each refusal's reason (``address`` or ``server``). 0 is no bound."""

    def __init__(self, total: int = MAX_CONNECTIONS,
                 per_address: int = MAX_CONNECTIONS_PER_ADDRESS,
                 on_open: Callable[[int], None] | None = None,
                 on_refused: Callable[[str], None] | None = None) -> None:
        super().__init__(total, per_address)
        self.on_open = on_open
        self.on_refused = on_refused

    @property
    def open(self) -> int:
        return self.count

    def admit(self, address: str | None) -> bytes | None:
        """None when the connection may stay (and it is counted); else the response that
        refuses it (an HTTP/1.1 answer to send before closing it)."""
        past = self.past(address)
        if past == "address":
            held = self.held(address)
            return self._refuse("address", 429, RateLimited.code, RateLimited.rpc_code,
                                f"this address already has {held} connections open to this "
                                f"server process (at most {self.per_address}, "
                                "http.max_connections_per_address): reuse kept-alive "
                                "connections, close idle ones, then retry", held)
        if past == "server":
            return self._refuse("server", 503, Unavailable.code, Unavailable.rpc_code,
                                f"this server process has {self.count} connections open (at "
                                f"most {self.total}, http.max_connections): retry in a "
                                "moment, or on another replica", self.count)
        self.add(address)
        if self.on_open is not None:
            self.on_open(self.count)
        return None

    def take(self, address: str | None, transport: Any, loop: Any) -> bool:
        """``admit`` a new connection: True if it may stay, else it was sent its refusal and
        closed, and is aborted a second later (a TLS close otherwise waits for the client)."""
        refusal = self.admit(address)
        if refusal is None:
            return True
        transport.write(refusal)
        transport.close()
        loop.call_later(ABORT_UNREAD_BODY_AFTER, _abort, transport)
        return False

    def release(self, address: str | None) -> None:
        self.remove(address)
        if self.on_open is not None:
            self.on_open(self.count)

    def _refuse(self, per: str, status: int, code: str, rpc_code: int, message: str,
                held: int) -> bytes:
        if self.on_refused is not None:
            self.on_refused(per)
        limit = self.per_address if per == "address" else self.total
        body = msgspec.json.encode({
            "jsonrpc": "2.0", "id": None,
            "error": {"code": rpc_code, "message": message,
                      "data": {"code": code, "per": per, "connections": held,
                               "limit": limit}}})
        reason = "Too Many Requests" if status == 429 else "Service Unavailable"
        return (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
                f"content-length: {len(body)}\r\nretry-after: 1\r\nconnection: close\r\n"
                "\r\n").encode() + body


def _peer_host(transport: Any) -> str | None:
    """The client's address (without its port); None on a Unix socket."""
    return peer_host(transport.get_extra_info("peername"))


class _Counted(asyncio.Protocol):
    """The ``ConnectionLimits`` part of ``protocol_class``'s protocol (a mixin before
    uvicorn's class)."""

    limits: ConnectionLimits | None = None
    loop: Any
    _counted = False  # holds a place in ``limits``, released when the connection ends
    _refused = False  # answered at its start and closing: what it sends is dropped
    _address: str | None = None

    def _admit(self, transport: Any) -> bool:
        """Whether the new connection may stay (else it was answered and is ending)."""
        if self.limits is None:
            return True
        self._address = _peer_host(transport)
        self._refused = not self.limits.take(self._address, transport, self.loop)
        self._counted = not self._refused
        return self._counted

    def _release(self) -> None:
        if self._counted and self.limits is not None:
            self._counted = False
            self.limits.release(self._address)

    def data_received(self, data: bytes) -> None:
        if not self._refused:
            super().data_received(data)


def protocol_class(head_timeout: float = HEAD_TIMEOUT,
                   limits: ConnectionLimits | None = None,
                   send_timeout: float = SEND_TIMEOUT) -> Any:
    """uvicorn's HTTP/1.1 protocol (httptools) with the bounds of the module docstring: the
    head timeout, the unread body's abort, the send timeout and ``limits``; "auto" without
    httptools."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:  # pragma: no cover - httptools is a dependency
        return "auto"

    class BoundedHttpProtocol(_Counted, HttpToolsProtocol):
        _head: HeadWatch | None = None  # made when the connection is admitted
        _send_watch: SendWatch | None = None  # made when writing first pauses

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            if self._admit(transport):
                self._head = HeadWatch(self.loop, transport, head_timeout)

        def on_message_begin(self) -> None:
            super().on_message_begin()
            if self._head is not None:
                self._head.begun()

        def on_headers_complete(self) -> None:
            if self._head is not None:
                self._head.done()
            super().on_headers_complete()

        def pause_writing(self) -> None:
            super().pause_writing()
            if self._send_watch is None:
                self._send_watch = SendWatch(self.loop, self.transport, send_timeout)
            self._send_watch.paused()

        def resume_writing(self) -> None:
            super().resume_writing()
            if self._send_watch is not None:
                self._send_watch.resumed()

        def connection_lost(self, exc: Exception | None) -> None:
            if self._head is not None:
                self._head.stop()
            if self._send_watch is not None:
                self._send_watch.resumed()
            self._release()
            super().connection_lost(exc)

        def on_response_complete(self) -> None:
            cycle = self.cycle
            super().on_response_complete()
            if self.transport.is_closing() and cycle is not None and cycle.more_body:
                self.loop.call_later(ABORT_UNREAD_BODY_AFTER, _abort, self.transport)

    BoundedHttpProtocol.limits = limits
    return BoundedHttpProtocol


class HeadWatch:
    """Ends a connection whose request head is not complete within ``timeout`` seconds of
    the connection's start or of the head's first byte. One timer per connection, not one
    per request: it checks when it fires whether a head is still awaited and since when,
    and comes back when it could next be due (so a request does no timer work)."""

    def __init__(self, loop: Any, transport: Any, timeout: float) -> None:
        self.loop, self.transport, self.timeout = loop, transport, timeout
        self._since: float | None = loop.time()  # None while no head is awaited
        self._timer: Any = loop.call_later(timeout, self._check)

    def begun(self) -> None:
        """A request's first byte came: its head is awaited from now."""
        self._since = self.loop.time()

    def done(self) -> None:
        """The head is complete: nothing awaited until the next request begins."""
        self._since = None

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _check(self) -> None:
        if self.transport.is_closing():
            self._timer = None
            return
        waited = 0.0 if self._since is None else self.loop.time() - self._since
        if waited >= self.timeout:
            self._timer = None
            _abort(self.transport)
            return
        self._timer = self.loop.call_later(self.timeout - waited, self._check)


class SendWatch:
    """Ends a connection whose client takes none of its answer for ``timeout`` seconds.

    Watched while writing is paused (the transport holds more than its high-water mark, so
    the kernel's send queue is full). What is still to go is what the transport holds and
    what the socket's queue holds (``unsent``: the kernel's count, ``SIOCOUTQ``, which drops
    as soon as the client acknowledges what it read, where the transport's own buffer moves
    only when the kernel has room for half its queue again: a megabyte or more). When that
    is no less than ``timeout`` seconds before, the client took nothing meanwhile: the
    connection is aborted (a close would wait for the client to read everything). A slow
    reader that takes something in every window is never cut."""

    def __init__(self, loop: Any, transport: Any, timeout: float) -> None:
        self.loop, self.transport, self.timeout = loop, transport, timeout
        self._timer: Any = None
        self._held = 0  # what the transport held when the window began

    def paused(self) -> None:
        if self._timer is None:
            self._held = unsent(self.transport)
            self._timer = self.loop.call_later(self.timeout, self._check)

    def resumed(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _check(self) -> None:
        held = unsent(self.transport)
        if held < self._held:  # the client took some: another window
            self._held = held
            self._timer = self.loop.call_later(self.timeout, self._check)
            return
        self._timer = None
        _abort(self.transport)


def unsent(transport: Any) -> int:
    """Bytes of a connection still to reach its client: what the transport holds and what
    its socket's send queue holds (0 for the queue where the kernel cannot say)."""
    held = int(transport.get_write_buffer_size())
    sock = transport.get_extra_info("socket")
    if sock is not None:
        try:
            queued = fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0")
            held += struct.unpack("i", queued)[0]
        except (OSError, ValueError):  # closed meanwhile, or not a socket with a queue
            pass
    return held


def _abort(transport: Any) -> None:
    with contextlib.suppress(Exception):  # already gone: nothing to end
        transport.abort()


class ClientNoise(logging.Filter):
    """At most one line per ``window`` seconds for each warning logged about what a client
    did (uvicorn's for a malformed request, the gateway's for a refused TLS handshake); the
    next line that passes says how many were left out before it."""

    MESSAGES = frozenset({("uvicorn.error", "Invalid HTTP request received."),
                          (tls_accept.log.name, tls_accept.REFUSED),
                          (tls_accept.log.name, tls_accept.ACCEPT_FAILED),
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
