"""Hostile connections (api/http/http_limits.py): slow clients ("slowloris") never hold a
connection for long, and a client sending garbage costs one log line a minute.

A real ``serve`` over TLS, with the two timeouts set short (``http.head_timeout`` 1 s,
``http.body_timeout`` 2 s) so the test is quick; the defaults are 10 s and 30 s. Without
them, a connection that finished its TLS handshake and then sent nothing, or part of a
request head, or part of a body, would stay open for ever, so an anonymous client could
hold as many connections, and their memory, as it liked.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import ssl
import time
from pathlib import Path

from tests.support import eventually, initialize, read_until_closed, serve, store_env, tls_connect

HEAD, BODY = 1, 2  # seconds: the timeouts these servers run with
SEND = 3  # seconds: http.send_timeout, where a test sets it
ASKS = 30_000  # pipelined requests of a client that does not read
IDLE = 50  # connections that say nothing, at once
ENDED_WITHIN = 15.0  # seconds after a timeout by which the connection must be gone


def _connect(port: int, ca: Path) -> ssl.SSLSocket:
    return tls_connect(port, ca, timeout=HEAD + BODY + ENDED_WITHIN)


def _response(sock: ssl.SSLSocket) -> bytes:
    """One HTTP response with a Content-Length: its head and body."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"the connection ended mid-response: {data[:300]!r}"
        data += chunk
    head = data.split(b"\r\n\r\n", 1)[0].lower()
    length = int(head.split(b"content-length: ", 1)[1].split(b"\r\n", 1)[0])
    while len(data) < len(head) + 4 + length:
        chunk = sock.recv(65536)
        assert chunk, f"the connection ended mid-response: {data[:300]!r}"
        data += chunk
    return data


def _sockets(pid: int) -> int:
    """The server's open sockets."""
    count = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(FileNotFoundError):  # closed meanwhile
            count += os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:")
    return count


def _env(tmp_path: Path) -> dict[str, str]:
    return {**store_env("sqlite", tmp_path), "BETTER_COMPUTE_HTTP_HEAD_TIMEOUT": f"{HEAD}s",
            "BETTER_COMPUTE_HTTP_BODY_TIMEOUT": f"{BODY}s"}


def test_connections_that_stall_are_ended_and_complete_calls_are_not(tmp_path: Path) -> None:
    env = _env(tmp_path)
    token = initialize(env)
    log = tmp_path / "serve.log"
    ca = Path(env["BETTER_COMPUTE_DATA_DIR"]) / "serving-ca.pem"
    with serve(env, log_file=log) as server:
        # Nothing after the handshake; part of a head; a head and part of its body.
        idle = _connect(server.port, ca)
        head = _connect(server.port, ca)
        head.sendall(b"POST /api/compute/rpc HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        body = _connect(server.port, ca)
        body.sendall(b"POST /api/compute/rpc HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                     b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{")
        started = time.monotonic()
        # A client that is merely slow between complete requests on a kept-alive
        # connection (within the keep-alive time) is served each time.
        steady = _connect(server.port, ca)
        call = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "system.whoami"}).encode()
        request = (b"POST /api/compute/rpc HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                   b"Content-Type: application/json\r\nAuthorization: Bearer " + token.encode()
                   + b"\r\nContent-Length: " + str(len(call)).encode() + b"\r\n\r\n" + call)
        for _ in range(3):
            steady.sendall(request)
            answer = _response(steady)
            assert answer.startswith(b"HTTP/1.1 200 ") and b'"result"' in answer, answer[:300]
            time.sleep(HEAD * 1.5)  # longer than the head timeout, between requests

        assert read_until_closed(idle) == b"", "an idle connection got an answer"
        assert read_until_closed(head) == b"", "a partial head got an answer"
        refused = read_until_closed(body)
        took = time.monotonic() - started
        assert refused.startswith(b"HTTP/1.1 408 "), refused[:300]
        error = json.loads(refused.split(b"\r\n\r\n", 1)[1])["error"]
        assert error["data"]["code"] == "invalid_request", error
        assert f"within {BODY} s" in error["message"], error
        assert took < BODY + ENDED_WITHIN, took
        for sock in (idle, head, body, steady):
            sock.close()
    text = log.read_text(errors="replace")
    assert "Traceback" not in text and " ERROR " not in text, text[-4000:]


def test_fifty_idle_connections_are_all_let_go(tmp_path: Path) -> None:
    """What a slowloris client does: many connections that say nothing. Each is ended, so
    the server's open files come back to where they were. The head timeout is 5 s here, so
    that all fifty are open at once even when the machine is slow to make them."""
    env = {**_env(tmp_path), "BETTER_COMPUTE_HTTP_HEAD_TIMEOUT": "5s"}
    initialize(env)
    ca = Path(env["BETTER_COMPUTE_DATA_DIR"]) / "serving-ca.pem"
    with serve(env) as server:
        pid = server.process.pid
        before = _sockets(pid)
        sockets = [_connect(server.port, ca) for _ in range(IDLE)]
        eventually(lambda: _sockets(pid) >= before + IDLE, "the server holds them all",
                   timeout=ENDED_WITHIN)
        for sock in sockets:
            assert read_until_closed(sock) == b""
            sock.close()
        eventually(lambda: _sockets(pid) <= before,
                   f"the server let go of the idle connections ({_sockets(pid)} sockets open, "
                   f"{before} before)", timeout=ENDED_WITHIN)


def test_connections_that_never_finish_the_tls_handshake_are_let_go(tmp_path: Path) -> None:
    """A TCP connection that never begins its TLS handshake, or sends part of it, is let go
    after ``http.head_timeout``, as the request head after it is. asyncio's own timeout is
    60 s, and the connection bounds count only from the handshake's end, so under asyncio's
    timeout one client could hold that many file descriptors."""
    env = _env(tmp_path)
    initialize(env)
    with serve(env) as server:
        pid = server.process.pid
        before = _sockets(pid)
        started = time.monotonic()
        silent = [socket.create_connection(("127.0.0.1", server.port), timeout=ENDED_WITHIN)
                  for _ in range(IDLE)]
        partial = socket.create_connection(("127.0.0.1", server.port), timeout=ENDED_WITHIN)
        partial.sendall(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03")  # a ClientHello's start
        eventually(lambda: _sockets(pid) >= before + IDLE + 1, "the server holds them all",
                   timeout=ENDED_WITHIN)
        for sock in [*silent, partial]:
            assert read_until_closed(sock, (ConnectionResetError,)) == b""
            sock.close()
        assert time.monotonic() - started < HEAD + ENDED_WITHIN
        eventually(lambda: _sockets(pid) <= before,
                   f"the server let go of the handshakes ({_sockets(pid)} sockets open, "
                   f"{before} before)", timeout=ENDED_WITHIN)


def _reader(port: int, ca: Path) -> ssl.SSLSocket:
    """A TLS connection whose receive buffer is small, so that what the client does not read
    stays with the server."""
    raw = socket.socket()
    raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    raw.settimeout(SEND + ENDED_WITHIN)
    raw.connect(("127.0.0.1", port))
    return ssl.create_default_context(cafile=str(ca)).wrap_socket(
        raw, server_hostname="127.0.0.1")


def test_a_client_that_stops_reading_its_answers_is_let_go(tmp_path: Path) -> None:
    """A "slow read": the client asks (here 30,000 pipelined health checks, ~5.5 MB of
    answers, more than the kernel's send buffer holds) and never reads. Kept, the connection
    and the answers the server cannot send would stay for ever (past every other timeout),
    so one address could hold its 256 connections, and 16 addresses every connection of a
    process, for good. An answer the client has taken none of for ``http.send_timeout`` ends it;
    a client that reads, however slowly and however many answers it asked for, gets them
    all."""
    env = {**_env(tmp_path), "BETTER_COMPUTE_HTTP_SEND_TIMEOUT": f"{SEND}s"}
    initialize(env)
    ca = Path(env["BETTER_COMPUTE_DATA_DIR"]) / "serving-ca.pem"
    asks = b"GET /api/compute/health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n" * ASKS
    with serve(env) as server:
        pid = server.process.pid
        before = _sockets(pid)
        stalled = _reader(server.port, ca)
        stalled.sendall(asks)
        eventually(lambda: _sockets(pid) <= before,
                   f"the server let go of the client that stopped reading ({_sockets(pid)} "
                   f"sockets open, {before} before)", timeout=SEND + ENDED_WITHIN)
        stalled.close()

        # A slow reader (64 KB every half second, for more than two windows) is kept, and
        # gets every answer once it reads on.
        reading = _reader(server.port, ca)
        reading.sendall(asks)
        answered, tail, mark = 0, b"", b"HTTP/1.1 200 "
        slow_until = time.monotonic() + 2 * SEND + 1
        while time.monotonic() < slow_until:
            time.sleep(0.5)
            taken = 0
            while taken < 65536:
                chunk = reading.recv(65536 - taken)
                assert chunk, f"a slow reader was cut after {answered} answers"
                taken += len(chunk)
                seen = tail + chunk
                answered += seen.count(mark)
                tail = seen[-(len(mark) - 1):]
        assert _sockets(pid) > before, "a slow reader was cut"
        while answered < ASKS:
            chunk = reading.recv(1 << 20)
            assert chunk, f"ended after {answered} answers"
            seen = tail + chunk
            answered += seen.count(mark)
            tail = seen[-(len(mark) - 1):]
        reading.close()


def test_a_flood_of_malformed_requests_is_one_log_line(tmp_path: Path) -> None:
    """uvicorn logs a warning for each: 200 connections of garbage were 200 lines."""
    env = _env(tmp_path)
    initialize(env)
    log = tmp_path / "serve.log"
    ca = Path(env["BETTER_COMPUTE_DATA_DIR"]) / "serving-ca.pem"
    with serve(env, log_file=log) as server:
        for _ in range(200):
            with _connect(server.port, ca) as sock:
                sock.sendall(b"NOT HTTP AT ALL\r\n\r\n")
                assert read_until_closed(sock).startswith(b"HTTP/1.1 400 ")
    lines = [line for line in log.read_text(errors="replace").splitlines() if line]
    assert len(lines) == 1 and "Invalid HTTP request received." in lines[0], lines[:5]
