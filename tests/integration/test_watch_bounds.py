"""/watch under hostile use, on both stores.

- The hub's window of recent events is bounded in bytes, not only in events:
  bounded in events alone, 150 events of 1 MB would be held whole (150 MB).
- Each write of a stream is bounded in bytes, so a reader that never reads
  pins at most one write (plus what the socket buffers).
- A stream that fell out of the window while following live is ended with a
  ``fell_behind`` line that says where to resume (``--since``).
- A stream whose token is revoked ends with an ``unauthenticated`` line.

The streams run through the real ASGI app with its lifespan (the hub); the
``send`` of the ASGI server is ours, so a test can stop "reading".
"""

from __future__ import annotations

from collections.abc import Iterator

import anyio
import pytest

from better_compute.api.http.follower import WatchHub
from better_compute.api.http.watch_limits import MAX_WRITE_BYTES
from better_compute.api.runtime import Runtime
from better_compute.api.store.eventlog import EventFilter, LogEntry
from better_compute.domain.access import LOCAL_OPERATOR
from tests.support import quick_init
from tests.watching import Stream, serving_app, write_sites


def _entry(sequence: int, size: int) -> LogEntry:
    return LogEntry(sequence, "site.created", "root", b"x" * size)


def test_the_window_is_bounded_in_bytes(runtime: Runtime) -> None:
    async def main() -> None:
        hub = WatchHub(runtime.store, window=10_000, window_bytes=8 << 20)
        for i in range(1, 151):
            hub._publish([_entry(i, 1 << 20)])  # 150 events of 1 MiB
        lines = [e.line for e in hub._entries if isinstance(e, LogEntry)]
        assert len(lines) == len(hub._entries)  # the window holds what was published: LogEntry
        held = sum(len(line) for line in lines)
        assert held <= (8 << 20) + (1 << 20), held
        assert hub.head == 150 and hub.floor > 0
        assert hub.after(hub.floor - 1, EventFilter()) is None  # older than the window

    anyio.run(main)


def test_one_write_is_bounded_in_bytes(runtime: Runtime) -> None:
    async def main() -> None:
        hub = WatchHub(runtime.store, window=10_000, window_bytes=64 << 20)
        hub._publish([_entry(i, 10_000) for i in range(1, 201)])  # 2 MB of lines
        got = hub.after(0, EventFilter())
        assert got is not None
        lines, position = got
        assert sum(len(line) + 1 for line in lines) <= MAX_WRITE_BYTES
        assert position == len(lines)  # nothing skipped: the rest comes in the next writes
        rest = hub.after(position, EventFilter())
        assert rest is not None and rest[0]
        big = WatchHub(runtime.store, window=10, window_bytes=64 << 20)
        big._publish([_entry(1, 2 * MAX_WRITE_BYTES)])  # one line larger than a write: alone
        assert big.after(0, EventFilter()) == ([b"x" * 2 * MAX_WRITE_BYTES], 1)

    anyio.run(main)


@pytest.fixture
def rt(env: dict[str, str]) -> Iterator[Runtime]:
    from tests.support import open_runtime

    runtime = open_runtime({**env, "BETTER_COMPUTE_WATCH_HEARTBEAT": "0.2",
                            "BETTER_COMPUTE_WATCH_WINDOW_BYTES": "65536"})
    runtime.root_token = quick_init(runtime)  # type: ignore[attr-defined]
    try:
        yield runtime
    finally:
        runtime.close()


def test_a_stream_that_falls_out_of_the_window_ends_with_resume_advice(rt: Runtime) -> None:
    async def main() -> None:
        async with serving_app(rt) as app, anyio.create_task_group() as tg:
            stream = Stream(rt.root_token)  # type: ignore[attr-defined]
            tg.start_soon(stream.run, app)
            await stream.wait_for(lambda line: line.get("heartbeat"))
            first = await anyio.to_thread.run_sync(lambda: write_sites(rt, 1))
            await stream.wait_for(lambda line: line.get("sequence") == first[0])
            stream.reading = anyio.Event()  # the reader stops reading
            await anyio.to_thread.run_sync(lambda: write_sites(rt, 1))
            with anyio.fail_after(20):
                await stream.stalled.wait()  # the stream is blocked writing that event
            hub = app.state.bc.extra["watch_hub"]
            before = hub.floor
            await anyio.to_thread.run_sync(
                lambda: write_sites(rt, 1200, per_save=100, region="r" * 60))  # > 64 KiB
            with anyio.fail_after(20):
                while hub.floor <= before or hub.head < first[0] + 1201:
                    await anyio.sleep(0.05)
            stream.reading.set()  # it reads again: too late
            end = await stream.wait_for(lambda line: "error" in line)
            assert end["error"]["code"] == "fell_behind", end
            since = end["error"]["data"]["since"]
            assert f"--since {since}" in end["error"]["message"]
            seen = [line["sequence"] for line in stream.lines if "sequence" in line]
            assert seen[-1] == since  # resuming there misses nothing and repeats nothing
            with anyio.fail_after(10):
                await stream.ended.wait()
            tg.cancel_scope.cancel()

    anyio.run(main)


def test_a_revoked_token_ends_its_open_stream(rt: Runtime) -> None:
    service = rt.service
    service.tenants_create(LOCAL_OPERATOR, "acme", None)
    made = service.tokens_create(LOCAL_OPERATOR, "acme", "read-only", None)
    other = service.tokens_create(LOCAL_OPERATOR, "acme", "read-only", None)

    async def main() -> None:
        async with serving_app(rt) as app, anyio.create_task_group() as tg:
            doomed, kept = Stream(made["token"]), Stream(other["token"])
            tg.start_soon(doomed.run, app)
            tg.start_soon(kept.run, app)
            for stream in (doomed, kept):
                await stream.wait_for(lambda line: line.get("heartbeat"))
            await anyio.to_thread.run_sync(
                lambda: service.tokens_revoke(LOCAL_OPERATOR, made["id"]))
            end = await doomed.wait_for(lambda line: "error" in line)
            assert end["error"]["code"] == "unauthenticated"
            assert "revoked" in end["error"]["message"]
            with anyio.fail_after(10):
                await doomed.ended.wait()
            # The other token's stream goes on: it sees the revocation (its tenant's event).
            revoked = await kept.wait_for(lambda line: line.get("type") == "token.revoked")
            assert revoked["subject"] == made["id"]
            assert not kept.ended.is_set()
            tg.cancel_scope.cancel()

    anyio.run(main)
