"""``listener.Connection``: uvicorn's HTTP/1.1 protocol given one slice at a time, the rest
held while requests wait, and a request head bounded (the e2e tests drive a real server:
tests/e2e/test_edge_attacks.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
import uvicorn
from uvicorn.server import ServerState

from better_compute.api.http.listener import CLOSE_TIMEOUT, SLICE, Connection

HEALTH = b"GET /api/compute/health HTTP/1.1\r\nhost: x\r\n\r\n"


class _Transport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.written = b""
        self.reading, self.closed, self.aborted = True, False, False

    def write(self, data: Any) -> None:
        self.written += bytes(data)

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("10.0.0.1", 5555), "sockname": ("10.0.0.2", 443)}.get(name, default)

    def is_closing(self) -> bool:
        return self.closed or self.aborted

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.aborted = True


async def _never_answers(scope: Any, receive: Any, send: Any) -> None:
    await asyncio.Event().wait()


@pytest.fixture
def connected() -> Iterator[tuple[Connection, _Transport]]:
    loop = asyncio.new_event_loop()
    config = uvicorn.Config(_never_answers, lifespan="off", log_level="critical")
    config.load()
    connection = Connection(config=config, server_state=ServerState(), app_state={},
                            _loop=loop, bounds=(None, 10.0, 30.0))
    transport = _Transport()
    connection.connection_made(transport)
    yield connection, transport
    connection.connection_lost(None)
    for task in asyncio.all_tasks(loop):
        task.cancel()
    loop.run_until_complete(asyncio.sleep(0))
    loop.close()


def test_pipelined_requests_are_parsed_a_slice_at_a_time_the_rest_held_unread(
        connected: tuple[Connection, _Transport]) -> None:
    """uvicorn's own protocol parsed every request of what came at once (and read on after
    each answer): one connection that never read took a worker past 2 GB."""
    connection, transport = connected
    asks = HEALTH * 20_000  # 940 KB, under MAX_HELD
    connection.data_received(asks)
    assert len(connection.pipeline) <= SLICE // len(HEALTH)  # one slice's requests wait
    assert len(connection._held) > len(asks) - 2 * SLICE  # the rest is held, not parsed
    assert not transport.reading and not transport.is_closing()
    # A head cut by the slice's end is not the client's delay while its rest waits here: the
    # head timeout does not run (it ended a slow reader of many pipelined answers).
    assert connection._awaiting is None
    connection.data_received(asks)  # more comes meanwhile: far ahead of its answers
    assert transport.aborted


@pytest.mark.parametrize("head", [
    b"GET / HTTP/1.1\r\nx-padding: " + b"a" * 200_000 + b"\r\n",  # one long line
    b"GET / HTTP/1.1\r\n" + b"a: b\r\n" * 200,  # many short ones
], ids=["size", "lines"])
def test_a_head_past_its_bound_is_answered_431_and_closed(
        connected: tuple[Connection, _Transport], head: bytes) -> None:
    connection, transport = connected
    for start in range(0, len(head), 65536):
        connection.data_received(head[start:start + 65536])
        if transport.is_closing():
            break
    assert transport.written.startswith(b"HTTP/1.1 431 Request Header Fields Too Large\r\n")
    assert b'"code":"invalid_request"' in transport.written
    # Nothing more is read (a TLS close would decrypt what still comes): the client has a
    # moment to take its answer, then the connection is ended.
    assert not transport.reading and not transport.aborted
    connection.loop.run_until_complete(asyncio.sleep(CLOSE_TIMEOUT * 2))
    assert transport.aborted

