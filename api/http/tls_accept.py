"""TLS listeners that bound the handshakes under way, per client address and per process.

uvicorn's listeners (``loop.create_server`` with ``ssl``) accept every TCP connection and
start its handshake; the connection bounds (``http_limits.ConnectionLimits``) count it only
from the handshake's end, when the HTTP protocol first hears of it. So a client that opened
TCP connections and never sent a ClientHello held a file descriptor each for the handshake's
timeout (``http.head_timeout``, 10 s), as many as it had ports: about 28,000 from one
address, enough for three addresses to fill systemd's ``LimitNOFILE=65536``, and then the
process accepted nobody until they timed out.

``TlsListener`` accepts the connections itself and counts each one from its accept to its
handshake's end (``api/net.py`` ``Handshakes``): one client address has at most
``MAX_HANDSHAKES_PER_ADDRESS`` (64) handshakes under way in a server process, the process
``MAX_HANDSHAKES`` (1,024) (``http.max_handshakes_per_address``, ``http.max_handshakes``; 0
for no bound). A connection past either is closed at once, before its handshake: there is
no TLS yet to answer in, and a client that finishes its handshakes (every real one, in
milliseconds) never meets the bound. Past the handshake the connection bounds apply as
before, with their HTTP answer. The handshake itself goes to the loop's own TLS
(``connect_accepted_socket``, uvloop's or asyncio's), with the same timeout as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Callable, Iterator
from typing import Any

from better_compute.api.net import Handshakes, peer_host

log = logging.getLogger("better_compute.http")

MAX_HANDSHAKES_PER_ADDRESS = 64  # TLS handshakes under way from one client address
MAX_HANDSHAKES = 1024  # TLS handshakes under way in one server process
ACCEPT_PAUSE = 0.1  # seconds before accepting again after the process ran out of descriptors
# Each logged at most once a minute (http_limits.ClientNoise).
REFUSED = "TLS handshake refused before it began: %s"
ACCEPT_FAILED = "accepting a connection failed: %s; trying again in %gs"


class TlsListener:
    """What ``loop.create_server`` returns, as far as uvicorn uses it (``sockets``,
    ``close``, ``wait_closed``), for listening sockets whose connections go through
    ``handshakes`` to the loop's TLS and then to ``protocol_factory``."""

    def __init__(self, loop: asyncio.AbstractEventLoop, protocol_factory: Callable[[], Any],
                 sockets: list[socket.socket], ssl: Any, timeout: float,
                 handshakes: Handshakes) -> None:
        self.loop, self.protocol_factory, self.ssl = loop, protocol_factory, ssl
        self.timeout, self.handshakes = timeout, handshakes
        self.sockets = sockets
        self._pending: set[asyncio.Task[None]] = set()
        for sock in sockets:
            sock.setblocking(False)
        self._accepting = [loop.create_task(self._accept(sock)) for sock in sockets]

    async def _accept(self, sock: socket.socket) -> None:
        while True:
            try:
                conn, peer = await self.loop.sock_accept(sock)
            except OSError as exc:  # out of descriptors, say: the waiting ones stay queued
                log.warning(ACCEPT_FAILED, exc, ACCEPT_PAUSE)
                await asyncio.sleep(ACCEPT_PAUSE)
                continue
            address = peer_host(peer)
            refused = self.handshakes.begin(address)
            if refused is not None:
                conn.close()
                log.warning(REFUSED, refused)
                continue
            task = self.loop.create_task(self._handshake(conn, address))
            self._pending.add(task)
            task.add_done_callback(self._pending.discard)

    async def _handshake(self, conn: socket.socket, address: str | None) -> None:
        try:
            # The loop owns the socket from here: closed when the handshake fails or ends.
            await self.loop.connect_accepted_socket(self.protocol_factory, conn, ssl=self.ssl,
                                                    ssl_handshake_timeout=self.timeout)
        except (OSError, asyncio.CancelledError):  # timed out, refused, or the server stops
            if conn.fileno() != -1:  # not yet the loop's
                conn.close()
        finally:
            self.handshakes.end(address)

    def close(self) -> None:
        """Accept nothing more and close the listening sockets (uvicorn closes those it passed
        in again, which does nothing); the handshakes under way are ended."""
        for task in [*self._accepting, *self._pending]:
            task.cancel()
        for sock in self.sockets:
            sock.close()

    async def wait_closed(self) -> None:
        await asyncio.gather(*self._accepting, *self._pending, return_exceptions=True)

    def is_serving(self) -> bool:
        return not all(task.done() for task in self._accepting)


def bound_sockets(host: str | None, port: int, backlog: int) -> list[socket.socket]:
    """Listening sockets on every address ``host`` names, as ``loop.create_server`` binds
    them (address reuse; an IPv6 socket for IPv6 only)."""
    out: list[socket.socket] = []
    seen = set()
    try:
        for family, kind, proto, _, address in socket.getaddrinfo(
                host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE):
            if (family, address) in seen:
                continue
            seen.add((family, address))
            sock = socket.socket(family, kind, proto)
            out.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)
            sock.listen(backlog)
    except OSError:
        for sock in out:
            sock.close()
        raise
    return out


@contextlib.contextmanager
def tls_listeners(loop: asyncio.AbstractEventLoop, timeout: float, handshakes: Handshakes
                  ) -> Iterator[None]:
    """The TLS listeners uvicorn creates meanwhile (``create_server`` with ``ssl``) are
    ``TlsListener``s: their handshakes bounded in time (``timeout``, asyncio's default is
    60 s and uvicorn passes none) and in number. Plain HTTP (``--insecure-loopback``) keeps
    the loop's own listener."""
    create_server = loop.create_server

    async def create(protocol_factory: Callable[[], Any], host: Any = None, port: Any = None,
                     **kwargs: Any) -> Any:
        ssl = kwargs.get("ssl")
        if ssl is None:
            return await create_server(protocol_factory, host, port, **kwargs)
        sock = kwargs.get("sock")
        # uvicorn binds host and port itself when serve passes no socket (not a worker)
        sockets = [sock] if sock is not None else \
            bound_sockets(host, port, kwargs.get("backlog", 100))
        return TlsListener(loop, protocol_factory, sockets, ssl, timeout, handshakes)

    loop.create_server = create  # type: ignore[method-assign]
    try:
        yield
    finally:
        del loop.create_server  # the loop's own method again
