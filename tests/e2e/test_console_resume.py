"""The console's event feed across a server restart: it resumes with `since`, no gap, no duplicate.

A real `serve` (no gateway, no node: the feed needs only the event log) is stopped while the
page follows /watch; events written to the store meanwhile appear once the server is back on
the same port, every one exactly once, in order, as in the log. The token never shows in the
server's output.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest

from better_compute.api.http.serve import SHUTDOWN_GRACE
from tests.browser import ConsolePage, chromium
from tests.support import eventually, free_port, initialize, open_runtime, serve
from tests.watching import log_sequences, watch_env, write_sites


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as b:
        yield b


def test_the_feed_resumes_without_gap_or_duplicate_after_the_server_restarts(
        env: dict[str, str], browser: Any) -> None:
    token = initialize(env)
    runtime = open_runtime(env)
    port = free_port()
    outputs: list[str] = []
    try:
        with serve(watch_env(env), port=port) as server:
            page = ConsolePage(browser, server.url)
            page.sign_in(token)
            page.view("events")
            first = write_sites(runtime, 3)
            eventually(lambda: page.feed_sequences()[-3:] == first, "the page shows the writes",
                       timeout=10)
            stopping = time.monotonic()
            server.kill(signal.SIGTERM)
            took = time.monotonic() - stopping
            outputs += [server.process.stdout.read(), server.process.stderr.read()]  # type: ignore[union-attr]
            # A browser's idle TLS connection must not hold the shutdown: over TLS asyncio would
            # wait 30 s for the browser's close_notify (api/http/serve.py cuts it after 1 s).
            # The bound is the server's own promise, the grace and a margin: a stop that took
            # the whole grace was seen once in a full suite (cause not found); a slow stop
            # logs what it waited on after 5 s, shown here.
            assert took < SHUTDOWN_GRACE + 5, f"stopped in {took:.1f}s; serve's log: " \
                                              f"{outputs[-1][-8000:]}"
            if took > 5:
                print(f"slow stop ({took:.1f}s); serve's log: {outputs[-1][-8000:]}")
        page.page.locator("#live[data-state=reconnecting]").wait_for()
        missed = write_sites(runtime, 5)  # while no server runs
        with serve(watch_env(env), port=port) as server:
            eventually(lambda: page.feed_sequences()[-5:] == missed,
                       "the page shows the events written while the server was down")
            # The stream is in order: a duplicate of an earlier event would come before these.
            more = write_sites(runtime, 2)
            eventually(lambda: page.feed_sequences()[-2:] == more, "the feed is live again",
                       timeout=10)
            assert page.feed_sequences() == log_sequences(runtime)  # every event once, in order
            assert page.page.locator("#live[data-state=live]").is_visible()
            assert page.errors == [] and page.dialogs == []
            page.close()
            server.kill(signal.SIGTERM)
            outputs += [server.process.stdout.read(), server.process.stderr.read()]  # type: ignore[union-attr]
    finally:
        runtime.close()
    assert not [o for o in outputs if token in o or "biam_" in o]  # no secret in the logs
