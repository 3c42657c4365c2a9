"""The API's connections: accepted, their TLS handshakes bounded, and each one bounded around
uvicorn's HTTP/1.1 protocol (httptools).

- Handshakes (``TlsListener``): each connection is counted from its accept to its TLS
  handshake's end (api/net.py ``Handshakes``, the gateway's rule too: one more from an
  address at ``http.max_handshakes_per_address`` (64) is closed; at ``http.max_handshakes``
  (1,024) in all the oldest under way is dropped for it). Nothing of TLS is made before the
  client's first byte, and the handshake has ``HEAD_TIMEOUT``. A closing connection waits
  ``CLOSE_TIMEOUT`` (0.25 s) at most for the client's close_notify, dropping unread whatever the
  client still sends (a refused body), then is ended.
- Connections (``ConnectionLimits``): at most ``MAX_CONNECTIONS_PER_ADDRESS`` (256) of one
  client address and ``MAX_CONNECTIONS`` (4,096) in all open once their handshake is done
  (``http.max_connections_per_address``, ``http.max_connections``; 0 for no bound). One
  more is answered at once with HTTP 429 ``rate_limited`` (``data.per``: ``address``) or
  503 ``unavailable`` (``data.per``: ``server``) and closed.
- Requests (``Connection``): one is parsed at a time, the next held unread while its answer
  is pending (pipelined requests wait in the kernel's buffers, which fill, and the client's
  sending stops); a request head is at most ``MAX_HEAD`` (64 KiB) and ``MAX_HEADER_LINES``
  (128), or it is answered HTTP 431, nothing more is read, and the connection is ended
  ``CLOSE_TIMEOUT`` later.
- Time (``Connection``): a connection has ``HEAD_TIMEOUT`` (10 s) from its handshake's end,
  and a request from its first byte, to send its complete request head, or it is ended;
  between requests uvicorn's keep-alive timeout (5 s) ends an idle one. An answer the
  client takes none of for ``SEND_TIMEOUT`` (30 s) ends the connection (``SendWatch``).
  The body's own time (``http.body_timeout``, 408) is the application's (http_limits.py).

So a client that sends or reads slowly, or not at all, never holds a connection or its
memory for long. uvicorn's h11 protocol does the first two of the requests' bounds with its
documented settings, but costs the JSON-RPC floor more than they are worth
(docs/decisions.md, "The HTTP edge"). The table of every bound is in docs/security.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import functools
import socket
import struct
import termios
from collections.abc import Callable
from typing import Any

import msgspec
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from better_compute.api.net import AddressCounts, Handshakes, log, peer_host
from better_compute.domain.errors import RateLimited, Unavailable

MAX_HEAD = 64 * 1024  # bytes of a request head
MAX_HEADER_LINES = 128  # header lines of a request head
SLICE = 8 * 1024  # bytes the parser is given at once
MAX_HELD = 1 << 20  # bytes a client may send ahead of the answers it waits for
HEAD_TIMEOUT = 10.0  # seconds to a TLS handshake's end, and to a request's complete head
SEND_TIMEOUT = 30.0  # seconds an answer may wait for the client to take any of it
CLOSE_TIMEOUT = 0.25  # seconds a closing TLS connection waits for the client's close_notify
MAX_CONNECTIONS_PER_ADDRESS = 256  # open connections of one client address, per process
MAX_CONNECTIONS = 4096  # open connections in all, per process
MAX_HANDSHAKES_PER_ADDRESS = 64  # TLS handshakes under way from one client address
MAX_HANDSHAKES = 1024  # TLS handshakes under way in one server process
ACCEPT_PAUSE = 0.1  # seconds before accepting again after the process ran out of descriptors
ACCEPT_BATCH = 64  # connections accepted in one turn of the loop at most
ACCEPT_FAILED = "accepting a connection failed: %s; trying again in %gs"  # one a minute


def answer(status: int, reason: str, error: dict[str, Any], headers: str = "") -> bytes:
    """An HTTP/1.1 answer with a JSON-RPC error, written by the connection itself (nothing
    was asked of the application), after which the connection is closed."""
    body = msgspec.json.encode({"jsonrpc": "2.0", "id": None, "error": error})
    return (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\n{headers}connection: close\r\n\r\n").encode() + body


HEAD_TOO_LARGE = answer(431, "Request Header Fields Too Large", {
    "code": -32600, "data": {"code": "invalid_request"},
    "message": f"the request head is over {MAX_HEAD // 1024} KiB or {MAX_HEADER_LINES} header "
               "lines: send a smaller one"})


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

    def release(self, address: str | None) -> None:
        self.remove(address)
        if self.on_open is not None:
            self.on_open(self.count)

    def _refuse(self, per: str, status: int, code: str, rpc_code: int, message: str,
                held: int) -> bytes:
        if self.on_refused is not None:
            self.on_refused(per)
        limit = self.per_address if per == "address" else self.total
        return answer(status, "Too Many Requests" if status == 429 else "Service Unavailable",
                      {"code": rpc_code, "message": message,
                       "data": {"code": code, "per": per, "connections": held, "limit": limit}},
                      "retry-after: 1\r\n")


def protocol(limits: ConnectionLimits | None, head_timeout: float = HEAD_TIMEOUT,
             send_timeout: float = SEND_TIMEOUT) -> Callable[..., asyncio.Protocol]:
    """What uvicorn's ``http`` setting takes: a factory of each connection's protocol."""
    return functools.partial(Connection, bounds=(limits, head_timeout, send_timeout))


class Connection(HttpToolsProtocol):
    """One connection: uvicorn's HTTP/1.1 protocol (httptools), with the bounds of the module
    docstring. uvicorn's own pauses reading while pipelined requests wait; what it parses at
    once is bounded here (``SLICE``: the rest of what came is held meanwhile, so requests of
    one chunk cannot all queue), and so is a request head."""

    def __init__(self, *args: Any, bounds: tuple[ConnectionLimits | None, float, float],
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.limits, self.head_timeout, self.send_timeout = bounds
        self.address: str | None = None
        self._served = False  # admitted: uvicorn's protocol runs (else refused, closing)
        self._refused = False  # a head over its bound was answered: nothing more is read
        self._awaiting: float | None = None  # since when a request head is awaited
        self._in_head = False
        self._head_bytes = 0
        self._held = b""  # received, not yet parsed (requests are waiting)
        self._timer: asyncio.TimerHandle | None = None
        self._send: SendWatch | None = None  # made when writing first pauses

    def connection_made(self, transport: Any) -> None:
        self.address = peer_host(transport.get_extra_info("peername"))
        refusal = self.limits.admit(self.address) if self.limits is not None else None
        if refusal is not None:
            transport.write(refusal)
            transport.close()
            return
        self._served = True
        super().connection_made(transport)
        self._awaiting = self.loop.time()
        self._timer = self.loop.call_later(self.head_timeout, self._check_head)

    def data_received(self, data: bytes) -> None:
        if not self._served or self._refused:
            return
        data, start = self._held + data, 0
        while start < len(data) and not self.pipeline:
            part = data[start:start + SLICE]
            start += SLICE
            super().data_received(part)
            if self.transport.is_closing():
                return
            if self._in_head:
                self._head_bytes += len(part)
                if self._head_bytes > MAX_HEAD or len(self.headers) > MAX_HEADER_LINES:
                    # Answered, then nothing more read (a TLS close would decrypt whatever
                    # still comes, at full speed, while it waits for the client's close):
                    # the client has CLOSE_TIMEOUT to take its answer, then it is ended.
                    self.transport.write(HEAD_TOO_LARGE)
                    self.flow.pause_reading()
                    self.loop.call_later(CLOSE_TIMEOUT, _abort, self.transport)
                    self._refused = True
                    return
        self._held = data[start:]
        if len(self._held) > MAX_HELD:  # sent far ahead of its answers: not a real client
            _abort(self.transport)
        elif self._held:  # until the requests waiting are answered; the time is ours
            self.flow.pause_reading()
            self._awaiting = None
        elif self._in_head and self._awaiting is None:  # the rest of a head is the client's
            self._awaiting = self.loop.time()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head, self._head_bytes, self._awaiting = True, 0, self.loop.time()

    def on_headers_complete(self) -> None:
        self._in_head, self._awaiting = False, None
        super().on_headers_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()  # reading resumed, the next request waiting started
        if self._held and not self.transport.is_closing():
            self.data_received(b"")  # what may be parsed now; reading paused again if not all

    def pause_writing(self) -> None:
        if not self._served:
            return
        super().pause_writing()
        if self._send is None:
            self._send = SendWatch(self.loop, self.transport, self.send_timeout)
        self._send.paused()

    def resume_writing(self) -> None:
        if not self._served:
            return
        super().resume_writing()
        if self._send is not None:
            self._send.resumed()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if self._send is not None:
            self._send.resumed()
        if self._served:
            if self.limits is not None:
                self.limits.release(self.address)
            super().connection_lost(exc)

    def _check_head(self) -> None:
        """One timer per connection, not one per request: when it fires it checks whether a
        head is still awaited and since when, and comes back when it could next be due."""
        waited = 0.0 if self._awaiting is None else self.loop.time() - self._awaiting
        if waited >= self.head_timeout:
            _abort(self.transport)  # nothing to answer yet
            return
        self._timer = self.loop.call_later(self.head_timeout - waited, self._check_head)


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


class TlsListener:
    """What ``loop.create_server`` returns, as far as uvicorn uses it (``sockets``,
    ``close``, ``wait_closed``), for a listening socket whose connections go through
    ``handshakes`` to the loop's TLS and then to ``protocol_factory``."""

    def __init__(self, loop: asyncio.AbstractEventLoop, protocol_factory: Callable[[], Any],
                 sock: socket.socket, ssl: Any, timeout: float, handshakes: Handshakes) -> None:
        self.loop, self.protocol_factory, self.ssl = loop, protocol_factory, ssl
        self.timeout, self.handshakes = timeout, handshakes
        self.sockets = [sock]
        self.accepted: set[_Accepted] = set()  # until their handshake ends
        sock.setblocking(False)
        self._accepting = loop.create_task(self._accept(sock))

    async def _accept(self, sock: socket.socket) -> None:
        while True:
            try:
                conn, peer = await self.loop.sock_accept(sock)
            except OSError as exc:  # out of descriptors, say: the waiting ones stay queued
                log.warning(ACCEPT_FAILED, exc, ACCEPT_PAUSE)
                await asyncio.sleep(ACCEPT_PAUSE)
                continue
            _Accepted(self, conn, peer_host(peer))
            with contextlib.suppress(OSError):  # then those already queued, in one turn
                for _ in range(ACCEPT_BATCH):
                    conn, peer = sock.accept()
                    _Accepted(self, conn, peer_host(peer))

    def close(self) -> None:
        """Accept nothing more and close the listening socket (uvicorn closes it again,
        which does nothing); the handshakes under way are ended."""
        self._accepting.cancel()
        for accepted in list(self.accepted):
            accepted.drop()
        self.sockets[0].close()

    async def wait_closed(self) -> None:
        tasks = [a.task for a in self.accepted if a.task is not None]
        await asyncio.gather(self._accepting, *tasks, return_exceptions=True)


class _Accepted:
    """One accepted connection, counted in ``Handshakes`` until its TLS handshake ends.
    Nothing of TLS is made before its first byte (a ClientHello): one that says nothing
    holds a socket and a timer, not a TLS session (~50 KB) nor a task."""

    def __init__(self, listener: TlsListener, conn: socket.socket, address: str | None
                 ) -> None:
        self.listener, self.conn = listener, conn
        self.task: asyncio.Task[None] | None = None
        ticket = listener.handshakes.begin(address, self.drop)
        if ticket is None:
            conn.close()
            return
        self.ticket = ticket
        loop = listener.loop
        conn.setblocking(False)
        self.timer = loop.call_later(listener.timeout, self.drop)
        loop.add_reader(conn.fileno(), self.spoke)
        listener.accepted.add(self)

    def spoke(self) -> None:
        loop = self.listener.loop
        loop.remove_reader(self.conn.fileno())
        self.timer.cancel()
        self.task = loop.create_task(self._handshake(max(0.001, self.timer.when() - loop.time())))
        self.task.add_done_callback(self.ended)

    async def _handshake(self, timeout: float) -> None:
        listener = self.listener
        try:  # the loop owns the socket from here: closed when the handshake fails or ends
            await listener.loop.connect_accepted_socket(
                listener.protocol_factory, self.conn, ssl=listener.ssl,
                ssl_handshake_timeout=timeout, ssl_shutdown_timeout=CLOSE_TIMEOUT)
        except (OSError, asyncio.CancelledError):  # timed out, refused, dropped, stopping
            if self.conn.fileno() != -1:  # not yet the loop's
                self.conn.close()

    def drop(self) -> None:
        """Ended before its handshake did: the oldest at the bound, silent too long, or the
        server stops."""
        if self.task is not None:
            self.task.cancel()  # its end frees its place
            return
        self.listener.loop.remove_reader(self.conn.fileno())
        self.timer.cancel()
        self.conn.close()
        self.ended()

    def ended(self, _task: object = None) -> None:
        self.listener.accepted.discard(self)
        self.listener.handshakes.end(self.ticket)
