"""Running under systemd and Prometheus: readiness notification and the scrape listener.

Shared by ``serve`` and ``bcd node``.

* :func:`notify` sends ``READY=1`` (or ``STOPPING=1``) to ``$NOTIFY_SOCKET``, as
  ``Type=notify`` units expect, with a plain unix datagram socket (no libsystemd); it is
  a no-op when the variable is unset (not under systemd).
* :func:`serve_scrape` answers ``GET /metrics`` on HOST:PORT with Prometheus's text
  format: tiny HTTP/1.1, one request per connection, no TLS and no token, so callers
  decide who may reach it (``serve`` allows loopback only; bcd listens on loopback
  unless told otherwise).
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Awaitable, Callable, Mapping

import anyio
from anyio.abc import SocketStream, TaskStatus
from anyio.streams.buffered import BufferedByteReceiveStream

METRICS_PATH = "/metrics"
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_MAX_HEAD = 8192


def notify(state: str, env: Mapping[str, str] | None = None) -> bool:
    """Tell systemd ``state`` (``READY=1``, ``STOPPING=1``); False when not under systemd.

    ``NOTIFY_SOCKET`` is a path, or ``@name`` for the abstract namespace. A failure to
    send is not an error of ours: the unit would fail to start and say so.
    """
    address = (os.environ if env is None else env).get("NOTIFY_SOCKET", "")
    if not address:
        return False
    target = "\0" + address[1:] if address.startswith("@") else address
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
        try:
            sock.sendto(state.encode(), target)
        except OSError:
            return False
    return True


def parse_listen(text: str, flag: str, default_host: str | None = None) -> tuple[str, int]:
    """``HOST:PORT`` (or ``PORT`` when there is a default host) -> (host, port)."""
    host, sep, port = text.rpartition(":")
    if not sep and default_host is not None:
        host, port = default_host, text
    if not port.isdigit() or not host or int(port) > 65535:
        example = "127.0.0.1:9464" if default_host is None else "9400 or 127.0.0.1:9400"
        raise ValueError(f"{flag} {text!r} is not HOST:PORT (for example {example})")
    return host.strip("[]"), int(port)


def _response(status: str, body: bytes, content_type: str = "text/plain; charset=utf-8"
              ) -> bytes:
    head = (f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n")
    return head.encode("ascii") + body


async def _answer(client: SocketStream, render: Callable[[], Awaitable[bytes]]) -> None:
    async with client:
        try:
            with anyio.fail_after(10):
                head = await BufferedByteReceiveStream(client).receive_until(b"\r\n\r\n",
                                                                             _MAX_HEAD)
        except (TimeoutError, anyio.EndOfStream, anyio.IncompleteRead, anyio.DelimiterNotFound,
                anyio.BrokenResourceError):
            return
        parts = head.split(b"\r\n", 1)[0].split()
        method, target = (parts[0], parts[1]) if len(parts) >= 2 else (b"", b"")
        if method != b"GET":
            answer = _response("405 Method Not Allowed", b"only GET /metrics\n")
        elif target.split(b"?", 1)[0] != METRICS_PATH.encode():
            answer = _response("404 Not Found", b"this listener serves only GET /metrics\n")
        else:
            answer = _response("200 OK", await render(), CONTENT_TYPE)
        with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
            await client.send(answer)


def bind_scrape(host: str, port: int, flag: str) -> socket.socket:
    """The listening socket, bound now (in the composition root, before anything runs), so
    a port in use is one clear error; ValueError says which flag and why."""
    try:
        return socket.create_server((host, port))
    except OSError as exc:
        why = os.strerror(exc.errno) if exc.errno else str(exc)
        raise ValueError(f"{flag} {host}:{port}: cannot listen there ({why}); "
                         "pick a free port") from None


async def serve_scrape(sock: socket.socket, render: Callable[[], Awaitable[bytes]], *,
                       task_status: TaskStatus[int] = anyio.TASK_STATUS_IGNORED) -> None:
    """Serve ``GET /metrics`` on ``sock`` until cancelled; ``task_status.started(port)``."""
    listener = await anyio.abc.SocketListener.from_socket(sock)
    bound = listener.extra(anyio.abc.SocketAttribute.local_port)
    async with listener:
        task_status.started(int(bound))

        async def answer(client: SocketStream) -> None:
            await _answer(client, render)

        await listener.serve(answer)
