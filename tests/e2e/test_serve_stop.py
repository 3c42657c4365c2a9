"""SIGTERM ends ``serve`` within its grace whatever its callers do, a serving process says
what it waits on (``kill -USR1``, and by itself when a shutdown is slow), and a caller
that leaves mid-body is counted, not logged as the server's error.

A real ``serve --workers 2`` (what ships on a 2-core machine) and a real TLS client that
sends a call's headers and only part of its body, then nothing: that call stays in flight
until its body comes, which it never does. Without the grace, uvicorn waits for such a
call for ever, so one silent client would hold a stopping server until the service
manager's SIGKILL (docs/configuration.md, "Stopping").
"""

from __future__ import annotations

import os
import signal
import socket
import ssl
import time
from pathlib import Path

import httpx

from tests.e2e.test_serve_workers import _children, _gone
from tests.support import eventually, initialize, serve, store_env

GRACE = 2  # BETTER_COMPUTE_SHUTDOWN_GRACE for these servers, seconds
STOP_BOUND = 20.0  # seconds from SIGTERM to every process's end: the grace and a margin


def _context(ca: Path) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(ca))


def _silent_call(port: int, ca: Path) -> ssl.SSLSocket:
    """A JSON-RPC call whose body stops after 10 of its announced 100 bytes."""
    sock = _context(ca).wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=30),
                               server_hostname="127.0.0.1")
    sock.sendall(b"POST /api/compute/rpc HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                 b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n"
                 b'{"jsonrpc"')
    return sock


def _reports(log: Path) -> list[str]:
    """The state reports in serve's log, one string each (a report spans lines)."""
    text = log.read_text(errors="replace") if log.exists() else ""
    return [part for part in text.split("WARNING better_compute.serve: ")[1:]
            if part.startswith(("state on request", "still stopping"))]


def _report_in_flight(workers: list[int], log: Path, at: str = "") -> str:
    """Ask every worker for its state until one reports the silent call in flight, and, with
    ``at``, its task there (a call counts as in flight from its head, a moment before its
    task first runs and shows where it waits)."""
    found: list[str] = []

    def reported() -> bool:
        seen = len(_reports(log))
        for pid in workers:
            os.kill(pid, signal.SIGUSR1)
        eventually(lambda: len(_reports(log)) >= seen + len(workers),
                   "every worker reported its state", timeout=15)
        found[:] = [r for r in _reports(log)[seen:] if "1 call(s) in flight" in r and at in r]
        return bool(found)

    eventually(reported, "a worker reported the silent call in flight", timeout=30)
    return found[0]


def test_kill_usr1_reports_threads_and_tasks_and_the_worker_serves_on(tmp_path: Path) -> None:
    env = store_env("sqlite", tmp_path)
    initialize(env)
    log = tmp_path / "serve.log"
    ca = Path(env["BETTER_COMPUTE_DATA_DIR"]) / "serving-ca.pem"
    with serve(env, log_file=log, workers="2") as server:
        workers = _children(server.process.pid)
        assert len(workers) == 2
        with _silent_call(server.port, ca):
            report = _report_in_flight(workers, log, at="in read_body")
            # The await chain of the call that waits: the body it is reading.
            assert "in read_body" in report and "in _rpc" in report, report
            assert "serving, " in report, report
            text = log.read_text(errors="replace")
            assert "Thread 0x" in text and "Current thread" in text, text[-4000:]  # faulthandler
            assert all(not _gone(pid) for pid in workers)  # a report never stops a worker
        with _silent_call(server.port, ca) as again:  # and each still serves
            again.sendall(b" " * 90)
            assert again.recv(4096).startswith(b"HTTP/1.1 "), "no answer after the report"


def test_sigterm_ends_a_call_whose_body_never_comes_within_the_grace(tmp_path: Path) -> None:
    env = {**store_env("sqlite", tmp_path), "BETTER_COMPUTE_SHUTDOWN_GRACE": f"{GRACE}s"}
    initialize(env)
    log = tmp_path / "serve.log"
    ca = Path(env["BETTER_COMPUTE_DATA_DIR"]) / "serving-ca.pem"
    with serve(env, log_file=log, workers="2") as server:
        workers = _children(server.process.pid)
        with _silent_call(server.port, ca) as silent:
            _report_in_flight(workers, log)
            sent = time.monotonic()
            server.process.send_signal(signal.SIGTERM)
            status = server.process.wait(timeout=STOP_BOUND)
            took = time.monotonic() - sent
            eventually(lambda: all(_gone(w) for w in workers), "every worker ended",
                       timeout=max(0.1, sent + STOP_BOUND - time.monotonic()))
            assert status == 0, log.read_text(errors="replace")[-4000:]
            assert took >= GRACE - 0.5, f"ended in {took:.1f}s: the call had no grace"
            silent.settimeout(5)
            try:
                answer = silent.recv(4096)
            except ConnectionResetError:  # ended (aborted), as it should be
                answer = b""
            assert answer == b"", f"the ended call got an answer: {answer[:200]!r}"
    # The slow shutdown said what it waited on, before the grace ran out, and then ended the
    # call: no traceback, no error (a 500 and a traceback were what uvicorn's cancel gave).
    text = log.read_text(errors="replace")
    slow = [r for r in _reports(log) if r.startswith("still stopping")]
    assert len(slow) == 1, _reports(log)
    assert "stopping, " in slow[0] and "in read_body" in slow[0], slow[0]
    assert f"ending 1 connection(s) still open {GRACE}s after the signal" in text, text[-4000:]
    assert "Traceback" not in text and " ERROR " not in text, text[-4000:]


def _client_left_count(url: str, token: str, ca: Path) -> float:
    response = httpx.get(f"{url}/metrics", headers={"authorization": f"Bearer {token}"},
                         verify=_context(ca))
    for line in response.text.splitlines():
        if line.startswith("better_compute_rpc_requests_total{") and 'code="client_left"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_a_caller_that_leaves_mid_body_is_counted_not_logged_as_an_error(
        tmp_path: Path) -> None:
    env = store_env("sqlite", tmp_path)
    token = initialize(env)
    log = tmp_path / "serve.log"
    ca = Path(env["BETTER_COMPUTE_DATA_DIR"]) / "serving-ca.pem"
    with serve(env, log_file=log) as server:
        _silent_call(server.port, ca).close()
        eventually(lambda: _client_left_count(server.url, token, ca) == 1,
                   "the call was counted as client_left", timeout=30)
        # and the server serves on
        assert httpx.get(f"{server.url}/api/compute/health", verify=_context(ca)).status_code == 200
    text = log.read_text(errors="replace")
    assert "Traceback" not in text and " ERROR " not in text, text[-4000:]


def test_sigterm_with_a_drain_serves_on_with_ready_at_503_and_closing_connections(
        tmp_path: Path) -> None:
    """Behind a load balancer (docs/high-availability.md): SIGTERM turns /ready to 503 at
    once, while calls are still answered, each closing its connection so that the client's
    next one goes through the balancer to another replica; after the drain the server stops
    as without one."""
    drain = 6.0  # the calls below are made within it (were they not, they would fail)
    env = {**store_env("sqlite", tmp_path), "BETTER_COMPUTE_SHUTDOWN_DRAIN": f"{drain:g}s"}
    token = initialize(env)
    log = tmp_path / "serve.log"
    ca = Path(env["BETTER_COMPUTE_DATA_DIR"]) / "serving-ca.pem"
    call = {"jsonrpc": "2.0", "id": 1, "method": "system.whoami"}
    auth = {"authorization": f"Bearer {token}"}
    with serve(env, log_file=log) as server, \
            httpx.Client(base_url=server.url, verify=_context(ca), timeout=30) as client:
        ready = client.get("/api/compute/ready")
        assert ready.status_code == 200 and ready.headers.get("connection") != "close"
        sent = time.monotonic()
        server.process.send_signal(signal.SIGTERM)

        def says_stopping() -> bool:
            answer = client.get("/api/compute/ready")
            return answer.status_code == 503 and answer.json()["checks"].get("server", "") \
                .startswith("stopping")

        eventually(says_stopping, "/ready answers 503: stopping")
        answer = client.post("/api/compute/rpc", json=call, headers=auth)
        assert answer.status_code == 200 and answer.json()["result"]["tenantId"] == "root"
        assert answer.headers["connection"] == "close"
        assert server.process.wait(timeout=STOP_BOUND) in (0, -signal.SIGTERM, 143)
        assert time.monotonic() - sent >= drain - 0.5
    text = log.read_text(errors="replace")
    assert f"draining for {drain:g}s" in text and "Traceback" not in text, text[-3000:]
