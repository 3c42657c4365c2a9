"""`better-compute events watch` resumes by itself after a ``fell_behind`` line.

The server ends a stream whose reader fell out of its window with
``{"error": {"code": "fell_behind", "data": {"since": N}}}``
(tests/integration/test_watch_bounds.py shows the server's side). The CLI, a
real process, must say so on standard error and reconnect after the last
sequence it printed, printing nothing twice and missing nothing. The server
here is a small HTTP server on loopback that plays back the lines of the
protocol (docs/events.md), so the test can choose when the stream falls behind.
"""

from __future__ import annotations

import http.server
import json
import os
import signal
import threading
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest

from tests.watching import CliWatcher


def _event(sequence: int) -> dict[str, Any]:
    return {"sequence": sequence, "type": "site.created", "time": "2026-01-01T00:00:00Z",
            "tenantId": "root", "subject": f"site_{sequence:026d}", "data": {}}


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, *_: Any) -> None:
        pass

    def do_GET(self) -> None:
        since = parse_qs(urlparse(self.path).query).get("since", [None])[0]
        self.server.requests.append(since)
        self.send_response(200)
        self.send_header("content-type", "application/x-ndjson")
        self.end_headers()
        if len(self.server.requests) == 1:  # 1 and 2, then the reader "fell behind"
            lines = [{"heartbeat": True, "head": 0}, _event(1), _event(2),
                     {"error": {"code": "fell_behind", "message": "this stream fell behind "
                                "the event log: resume with --since 2", "data": {"since": 2}}}]
        else:  # the resumed stream: what came after the position asked for
            start = int(since or 0)
            lines = [{"heartbeat": True, "head": start}, _event(start + 1), _event(start + 2)]
        for line in lines:
            self.wfile.write(json.dumps(line).encode() + b"\n")
            self.wfile.flush()
        if len(self.server.requests) > 1:
            self.server.done.wait(30)  # keep the resumed stream open, as a live one is


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.requests: list[str | None] = []
        self.done = threading.Event()


@pytest.fixture
def server() -> Iterator[_Server]:
    srv = _Server()
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        yield srv
    finally:
        srv.done.set()
        srv.shutdown()
        srv.server_close()


def test_events_watch_resumes_after_falling_behind(server: _Server, tmp_path: Any) -> None:
    port = server.server_address[1]
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path),
           "BETTER_COMPUTE_URL": f"http://127.0.0.1:{port}",
           "BETTER_COMPUTE_TOKEN": "biam_" + "A" * 43,
           "BETTER_COMPUTE_DATA_DIR": str(tmp_path / "unused")}
    watcher = CliWatcher(env, "--since", "0")
    got = [e["sequence"] for e in watcher.events(4)]
    assert got == [1, 2, 3, 4]  # nothing twice, nothing missed
    assert server.requests[:2] == ["0", "2"]
    code, stderr = watcher.stop(signal.SIGINT)
    assert code in (0, 130)
    assert "fell behind" in stderr and "after sequence 2" in stderr
    assert "Traceback" not in stderr
