"""A worker of ``serve --workers`` answers on its parent's socket with Nagle off.

uvicorn, given a descriptor (``Config(fd=...)``), wraps it as a Unix socket, so asyncio
never sets TCP_NODELAY on the TCP connections it accepts: each answer written in two parts
would wait for the client's delayed ACK, ~40 ms (one client's creates: a median 56-60 ms
with two workers against 18 ms with one).
"""

from __future__ import annotations

import asyncio
import socket

from better_compute.api.http.workers import bind, listening_socket


def _accepted_nodelay(listener: socket.socket) -> int:
    async def run() -> int:
        accepted: asyncio.Future[int] = asyncio.get_running_loop().create_future()

        class Probe(asyncio.Protocol):
            def connection_made(self, transport: asyncio.BaseTransport) -> None:
                sock = transport.get_extra_info("socket")
                accepted.set_result(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
                transport.close()

        server = await asyncio.get_running_loop().create_server(Probe, sock=listener)
        async with server:
            port = listener.getsockname()[1]
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            value = await asyncio.wait_for(accepted, 10)
            writer.close()
            return value

    return asyncio.run(run())


def test_a_worker_s_connections_have_nagle_off() -> None:
    parent = bind("127.0.0.1", 0)
    try:
        assert _accepted_nodelay(listening_socket(parent.fileno())) != 0
    finally:
        parent.close()


def test_uvicorn_s_own_wrapping_of_a_descriptor_left_it_on() -> None:
    """What the test above guards against (uvicorn/server.py: fromfd(fd, AF_UNIX, ...))."""
    parent = bind("127.0.0.1", 0)
    try:
        assert _accepted_nodelay(socket.fromfd(parent.fileno(), socket.AF_UNIX,
                                               socket.SOCK_STREAM)) == 0
    finally:
        parent.close()
