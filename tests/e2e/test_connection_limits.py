"""Connection floods (api/http/listener.py ``ConnectionLimits``): one client address holds
at most ``http.max_connections_per_address`` connections of a server process, the process
at most ``http.max_connections`` in all; a connection past either is answered at once (429
``rate_limited`` or 503 ``unavailable``, ``data.per`` saying which bound) and ended, and
the other clients are served throughout.

Unbounded, every connection is kept: one client opening connections as fast as it can
holds ~47 KB of the server's memory and a file descriptor each until the head timeout, so
it can run the process out of either (1,500 opened in 2.6 s: RSS 67 -> 138 MB).

A real ``serve`` over TLS with small bounds (3 per address, 5 in all) so the test is
quick; the defaults are 256 and 4,096. Loopback has many addresses (127.0.0.2, …), so
"another client" is another source address on this machine.
"""

from __future__ import annotations

import json
import ssl
import subprocess
from pathlib import Path

import httpx

from tests.support import (
    CLI,
    client_env,
    eventually,
    initialize,
    read_until_closed,
    serve,
    store_env,
    tls_connect,
    whoami_from,
)

PER_ADDRESS, TOTAL = 3, 5
ENDED_WITHIN = 10.0  # seconds by which a refused connection must be gone


def _connect(port: int, ca: Path, source: str = "127.0.0.1") -> ssl.SSLSocket:
    return tls_connect(port, ca, timeout=ENDED_WITHIN, source=source)


def _refusal(sock: ssl.SSLSocket) -> tuple[bytes, dict[str, object]]:
    """The status line and the JSON-RPC error of a refused connection, which then ends."""
    data = read_until_closed(sock, (ConnectionResetError, ssl.SSLError))  # aborted
    head, _, body = data.partition(b"\r\n\r\n")
    assert b"\r\nconnection: close" in head.lower() and b"retry-after: 1" in head.lower(), head
    return head.split(b"\r\n", 1)[0], json.loads(body)["error"]


def test_one_address_holds_a_bounded_number_of_connections_and_others_are_served(
        tmp_path: Path) -> None:
    env = {**store_env("sqlite", tmp_path),
           "BETTER_COMPUTE_HTTP_MAX_CONNECTIONS_PER_ADDRESS": str(PER_ADDRESS),
           "BETTER_COMPUTE_HTTP_MAX_CONNECTIONS": str(TOTAL),
           "BETTER_COMPUTE_HTTP_HEAD_TIMEOUT": "60s"}  # the held ones stay for the test
    token = initialize(env)
    log = tmp_path / "serve.log"
    ca = Path(env["BETTER_COMPUTE_DATA_DIR"]) / "serving-ca.pem"
    with serve(env, log_file=log) as server:
        held = [_connect(server.port, ca) for _ in range(PER_ADDRESS)]

        # The next one from the same address: answered before it asks, and ended.
        past = _connect(server.port, ca)
        status, error = _refusal(past)
        assert status == b"HTTP/1.1 429 Too Many Requests", status
        assert error["data"] == {"code": "rate_limited", "per": "address",
                                 "connections": PER_ADDRESS, "limit": PER_ADDRESS}, error
        assert "http.max_connections_per_address" in str(error["message"]), error

        # So is one that sends its request first, the way any HTTP client does: the CLI
        # prints the refusal's message and code, and exits non-zero.
        cli = subprocess.run([CLI, "sites", "list"], env=client_env(env, server, token),
                             capture_output=True, text=True, timeout=60)
        assert cli.returncode != 0, cli
        assert "connections open to this server process" in cli.stderr, cli.stderr
        assert "rate_limited" in cli.stderr, cli.stderr

        # Another address is served meanwhile.
        other = whoami_from(server.port, ca, token, "127.0.0.2")
        assert other.status_code == 200 and "result" in other.json(), other.text

        # One of the held connections ends: its place is free again.
        held.pop().close()
        eventually(lambda: whoami_from(server.port, ca, token, "127.0.0.1").status_code == 200,
                   "a connection from 127.0.0.1 is served once one of its own has ended")

        # The process's own bound: 2 held here (3 in all) and 2 from another address fill
        # it; the next connection, from an address with none, is refused for the server.
        held += [_connect(server.port, ca, "127.0.0.3") for _ in range(TOTAL - len(held))]
        status, error = _refusal(_connect(server.port, ca, "127.0.0.4"))
        assert status == b"HTTP/1.1 503 Service Unavailable", status
        assert error["data"] == {"code": "unavailable", "per": "server",
                                 "connections": TOTAL, "limit": TOTAL}, error

        for sock in held:
            sock.close()
        # Every place comes back: a scrape of /metrics counts both refusals by bound.
        eventually(lambda: whoami_from(server.port, ca, token, "127.0.0.4").status_code == 200,
                   "served again once the held connections ended")
        def scrape() -> str:
            return httpx.get(f"https://127.0.0.1:{server.port}/metrics", timeout=30,
                             verify=ssl.create_default_context(cafile=str(ca)),
                             headers={"authorization": f"Bearer {token}"}).text

        # Open: only the scrape's own, once the server has seen every closed one end.
        eventually(lambda: "better_compute_http_connections 1.0" in scrape(),
                   "the open-connections gauge back to the scrape's own")
        metrics = scrape()
        assert 'better_compute_http_connections_refused_total{per="address"} 2.0' in metrics, \
            metrics
        assert 'better_compute_http_connections_refused_total{per="server"} 1.0' in metrics, \
            metrics
    text = log.read_text(errors="replace")
    assert "Traceback" not in text and " ERROR " not in text, text[-4000:]


def test_a_bound_of_zero_is_no_bound(tmp_path: Path) -> None:
    """Behind a proxy every connection comes from the proxy's address: 0 turns the bound
    off (docs/configuration.md)."""
    env = {**store_env("sqlite", tmp_path),
           "BETTER_COMPUTE_HTTP_MAX_CONNECTIONS_PER_ADDRESS": "0"}
    token = initialize(env)
    ca = Path(env["BETTER_COMPUTE_DATA_DIR"]) / "serving-ca.pem"
    with serve(env) as server:
        held = [_connect(server.port, ca) for _ in range(300)]  # over the default 256
        assert whoami_from(server.port, ca, token, "127.0.0.1").status_code == 200
        for sock in held:
            sock.close()


def test_a_bound_that_is_not_a_number_is_refused_with_the_fix(tmp_path: Path) -> None:
    env = {**store_env("sqlite", tmp_path), "BETTER_COMPUTE_HTTP_MAX_CONNECTIONS": "lots"}
    initialize(env)
    run = subprocess.run([CLI, "serve", "--listen", "127.0.0.1:0", "--workers", "1"], env=env,
                         capture_output=True, text=True, timeout=60)
    assert run.returncode != 0
    assert "BETTER_COMPUTE_HTTP_MAX_CONNECTIONS='lots' is not a whole number" in run.stderr, \
        run.stderr
