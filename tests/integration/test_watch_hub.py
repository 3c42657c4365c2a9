"""The /watch hub's life: it ends with the task that runs it, and leaves no thread behind."""

from __future__ import annotations

import threading
from typing import Any

import anyio

from better_compute.api.http.follower import WatchHub
from tests.watching import write_sites


def _followers() -> list[threading.Thread]:
    """Threads busy following the log (an idle worker thread of anyio does not count)."""
    import sys

    frames = sys._current_frames()
    busy = []
    for thread in threading.enumerate():
        frame = frames.get(thread.ident or -1)
        while frame is not None:
            if frame.f_code.co_name == "_follow":
                busy.append(thread)
                break
            frame = frame.f_back
    return busy


def test_cancelling_the_hub_stops_it_and_its_follower(runtime: Any) -> None:
    hub = WatchHub.for_runtime(runtime)

    async def main() -> None:
        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                await tg.start(hub.run)
                before = hub.head
                write_sites(runtime, 3, per_save=1)  # followed while the hub runs
                await hub.wait_beyond(before + 2, timeout=20)
                assert hub.head >= before + 3
                tg.cancel_scope.cancel()  # as a server's lifespan is cancelled: no stop()

    anyio.run(main)
    assert hub.stopping
    assert _followers() == []
