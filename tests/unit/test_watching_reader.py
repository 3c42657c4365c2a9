"""tests/watching.Reader: closing it never leaves a thread reading another socket's bytes.

A Reader's thread sits in OpenSSL's read of its TLS stream. Closing the client from the test
thread closed the socket's descriptor under it; OpenSSL keeps the descriptor's number, so
its next read took the first 5 bytes (a TLS record header) of whatever connection got that
number next: a scrape of /metrics right after read ``1.1 200 OK`` as its status line
(tests/e2e/test_metrics_and_logs_e2e.py failed on it twice in CI). Real TLS, real sockets.
"""

from __future__ import annotations

import socket
import ssl
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from better_compute.api import pki
from tests.watching import Reader

HEARTBEAT = b'{"heartbeat": true}\n'


def _tls_stream_server(folder: Path, stop: threading.Event) -> tuple[int, Path]:
    """A TLS server that answers any request with an endless chunked stream of lines."""
    bundle = pki.generate_bundle()
    cert, key = pki.issue_serving_certificate(bundle, ["127.0.0.1"])
    (folder / "s.crt").write_bytes(cert)
    (folder / "s.key").write_bytes(key)
    (folder / "ca.crt").write_text(pki.pem(bundle.serving_ca_cert))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(folder / "s.crt", folder / "s.key")
    listener = socket.create_server(("127.0.0.1", 0))

    def stream(conn: socket.socket) -> None:
        try:
            with context.wrap_socket(conn, server_side=True) as tls:
                head = b""
                while b"\r\n\r\n" not in head:
                    head += tls.recv(4096)
                tls.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\n"
                            b"Transfer-Encoding: chunked\r\n\r\n")
                chunk = b"%x\r\n%s\r\n" % (len(HEARTBEAT), HEARTBEAT)
                while not stop.wait(0.02):
                    tls.sendall(chunk)
        except OSError:
            return

    def accept() -> None:
        with listener:
            listener.settimeout(0.2)
            while not stop.is_set():
                try:
                    conn, _ = listener.accept()
                except TimeoutError:
                    continue
                threading.Thread(target=stream, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    return listener.getsockname()[1], folder / "ca.crt"


class _Plain(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b"plain answer\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def plain_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Plain)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


def test_connections_opened_after_a_close_read_their_own_bytes(tmp_path: Path,
                                                               plain_url: str) -> None:
    stop = threading.Event()
    port, ca = _tls_stream_server(tmp_path, stop)
    try:
        for _ in range(10):
            reader = Reader(SimpleNamespace(url=f"https://127.0.0.1:{port}"),  # type: ignore[arg-type]
                            "token", ca)
            assert reader.get() == {"heartbeat": True}
            reader.close()
            assert not reader._thread.is_alive(), "close returns once its thread has stopped"
            deadline = time.monotonic() + 0.2  # many heartbeats of the closed stream
            while time.monotonic() < deadline:
                answer = httpx.get(plain_url, timeout=10)
                assert (answer.status_code, answer.text) == (200, "plain answer\n")
    finally:
        stop.set()
