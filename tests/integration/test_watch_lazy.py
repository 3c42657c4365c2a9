"""The /watch hub renders an event's public line lazily and once, on both stores.

- The hub keeps what it read from the store as stored; nothing is rendered while no
  stream reads, and a wake-up on event types only (the controllers') renders nothing.
- A stream that reads renders each event once, for every stream: two streams get the
  same line objects, and the lines are exactly what the event log renders.
- A token.revoked event is still seen at once (it ends the token's streams).
- A hub nobody reads (no stream, nobody waiting on it) reads nothing; the first reader finds
  it reading what came meanwhile.

The streams run through the real ASGI app with its lifespan (the hub), as in
tests/integration/test_watch_bounds.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import anyio
import pytest

from better_compute.api.http.follower import WatchHub
from better_compute.api.runtime import Runtime
from better_compute.api.store.eventlog import EventFilter, EventLog, LogEntry
from better_compute.domain.events import compile_type_filter
from tests.support import open_runtime, quick_init
from tests.watching import Stream, serving_app, write_sites


@pytest.fixture
def rt(env: dict[str, str]) -> Iterator[Runtime]:
    runtime = open_runtime(env)
    runtime.root_token = quick_init(runtime)  # type: ignore[attr-defined]
    try:
        yield runtime
    finally:
        runtime.close()


def _rendered(hub: WatchHub) -> int:
    return sum(isinstance(item, LogEntry) for item in hub._entries)


async def _awake(hub: WatchHub) -> None:
    """Somebody reads the hub (as the controllers do, waiting on it): from now on it follows
    the log (a hub nobody reads reads nothing)."""
    await hub.wait_beyond(hub.head, 0.01)
    with anyio.fail_after(20):
        while hub._idle:
            await anyio.sleep(0.01)


async def _read_to(hub: WatchHub, sequence: int) -> None:
    with anyio.fail_after(20):
        while hub.head < sequence:
            await hub.wait_beyond(hub.head, 1.0)


def test_nothing_is_rendered_while_no_stream_reads(rt: Runtime) -> None:
    async def main() -> None:
        async with serving_app(rt) as app:
            hub: WatchHub = app.state.bc.extra["watch_hub"]
            await _awake(hub)
            start = hub.head
            sequences = await anyio.to_thread.run_sync(lambda: write_sites(rt, 30))
            await _read_to(hub, sequences[-1])
            assert hub.head == sequences[-1] and len(hub._entries) >= 30
            # The controllers wait on types only: answered without rendering anything.
            sites = EventFilter(types=compile_type_filter(["site.*"]))
            with anyio.fail_after(5):
                await hub.wait_beyond(start, 5.0, sites)
            nodes = EventFilter(types=compile_type_filter(["node.*"]))
            got = hub.after(start, nodes)
            assert got == ([], sequences[-1])
            assert _rendered(hub) == 0
            # Something that needs the lines renders them, once.
            everything = hub.after(start, EventFilter())
            assert everything is not None
            expected = [e.line for e in EventLog(rt.store).read(start)]
            assert everything[0] == expected
            assert _rendered(hub) == len(hub._entries)
            again = hub.after(start, EventFilter())
            assert again is not None
            assert all(a is b for a, b in zip(again[0], everything[0], strict=True))

    anyio.run(main)


def test_streams_share_each_line_rendered_once(rt: Runtime) -> None:
    async def main() -> None:
        async with serving_app(rt) as app, anyio.create_task_group() as tg:
            hub: WatchHub = app.state.bc.extra["watch_hub"]
            start = hub.head
            streams = [Stream(rt.root_token) for _ in range(2)]  # type: ignore[attr-defined]
            for stream in streams:
                tg.start_soon(stream.run, app)
                await stream.wait_for(lambda line: line.get("heartbeat"))
            sequences = await anyio.to_thread.run_sync(lambda: write_sites(rt, 20))
            for stream in streams:
                await stream.wait_for(lambda line: line.get("sequence") == sequences[-1])
            expected = [e.line for e in EventLog(rt.store).read(start)]
            for stream in streams:
                events = [line for line in stream.lines if "sequence" in line]
                assert events == [json.loads(line) for line in expected]
            got = hub.after(start, EventFilter())
            assert got is not None and got[0] == expected
            tg.cancel_scope.cancel()

    anyio.run(main)


def test_a_revoked_token_is_seen_without_a_reader(rt: Runtime) -> None:
    async def main() -> None:
        from better_compute.domain.access import LOCAL_OPERATOR

        async with serving_app(rt) as app:
            hub: WatchHub = app.state.bc.extra["watch_hub"]
            service = rt.service
            await _awake(hub)

            def revoke() -> str:
                token = service.tokens_create(LOCAL_OPERATOR, "root", "read-only", None)
                service.tokens_revoke(LOCAL_OPERATOR, token["id"])
                return str(token["id"])

            token_id = await anyio.to_thread.run_sync(revoke)
            with anyio.fail_after(20):
                while token_id not in hub.revoked:
                    await hub.wait_beyond(hub.head, 1.0)

    anyio.run(main)


def test_a_hub_nobody_reads_reads_nothing_until_somebody_does(
        rt: Runtime, monkeypatch: pytest.MonkeyPatch) -> None:
    reads: list[int] = []
    recorder = type(rt.store.recorder)
    real = recorder.select_notifications

    def counted(self: object, *args: object, **kwargs: object) -> object:
        reads.append(1)
        return real(self, *args, **kwargs)  # type: ignore[arg-type]

    async def main() -> None:
        async with serving_app(rt) as app:
            hub: WatchHub = app.state.bc.extra["watch_hub"]
            with anyio.fail_after(20):
                while not hub._idle:  # nobody has read it yet
                    await anyio.sleep(0.01)
            monkeypatch.setattr(recorder, "select_notifications", counted)
            sequences = await anyio.to_thread.run_sync(lambda: write_sites(rt, 5))
            await anyio.sleep(0.3)  # commits woke it: it must not read them
            assert reads == [] and hub.head < sequences[-1]
            await _read_to(hub, sequences[-1])  # a reader: what came meanwhile is read
            assert hub._seqs == sequences and reads
            more = await anyio.to_thread.run_sync(lambda: write_sites(rt, 2))
            await _read_to(hub, more[-1])
            assert hub._seqs == sequences + more  # and followed from there

    anyio.run(main)
