"""The status endpoint of the running agent: tiny HTTP/1.1 over a unix socket.

``GET /v1/status`` answers the JSON of `bcd status --json` (docs/bcd.md); anything
else gets a JSON 404. One request per connection (``Connection: close``), so
``curl --unix-socket /run/bcd/bcd.sock http://bcd/v1/status`` works as well as
`bcd status`. Access control is the file system's: the socket's directory
(BCD_ROOT/run/bcd) is created 0750 and the socket itself is 0600, so only root (the
agent's user) reads it; the socket is removed when bcd stops.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

import anyio
import msgspec
from anyio.abc import SocketStream, TaskStatus
from anyio.streams.buffered import BufferedByteReceiveStream

from .status_client import STATUS_PATH
from .unix_path import reachable

if TYPE_CHECKING:
    from .agent import NodeAgent

_MAX_HEAD = 8192


def _response(status: int, reason: str, body: Any) -> bytes:
    data = msgspec.json.encode(body) + b"\n"
    head = (f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n")
    return head.encode("ascii") + data


async def _handle(agent: NodeAgent, client: SocketStream) -> None:
    async with client:
        try:
            with anyio.fail_after(5):
                head = await BufferedByteReceiveStream(client).receive_until(b"\r\n\r\n",
                                                                             _MAX_HEAD)
        except (TimeoutError, anyio.EndOfStream, anyio.IncompleteRead, anyio.DelimiterNotFound,
                anyio.BrokenResourceError):
            return
        parts = head.split(b"\r\n", 1)[0].split()
        method, target = (parts[0], parts[1].decode("latin-1")) if len(parts) >= 2 else (b"", "")
        if method == b"GET" and target.split("?", 1)[0] == STATUS_PATH:
            answer = _response(200, "OK", agent.snapshot())
        else:
            answer = _response(404, "Not Found", {
                "error": f"bcd serves only GET {STATUS_PATH} on this socket"})
        with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
            await client.send(answer)


async def serve_status(agent: NodeAgent, *, task_status: TaskStatus[None]) -> None:
    path = agent.paths.socket
    if not path.parent.exists():
        path.parent.mkdir(parents=True, mode=0o750)
    if path.is_socket():
        path.unlink()  # left by a killed bcd (a live one holds var/lib/bcd/lock)
    with reachable(path) as address:  # a path of any length (agent/node/unix_path.py)
        listener = await anyio.create_unix_listener(address, mode=0o600)
    try:
        async with listener, anyio.create_task_group() as group:
            task_status.started()
            while True:
                client = await listener.accept()
                group.start_soon(_handle, agent, client)
    finally:
        with contextlib.suppress(OSError):
            path.unlink()
