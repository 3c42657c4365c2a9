"""TLS handshakes under way are bounded per client address and per process (api/net.py
``Handshakes``, api/http/listener.py): a connection past its address's bound is closed before
its handshake; past the process's bound the oldest under way is closed for it, so a client
that finishes its handshake is served.

Counted only from its handshake's end, as the connection bounds count, one address could
open as many TCP connections as it has ports and send nothing, each held for the
handshake's timeout (10 s): about 28,000 descriptors per address, and three addresses would
fill systemd's ``LimitNOFILE=65536``; and a bound in all that refused newcomers could be
filled by silent connections from many addresses, each under its own bound. A real
``serve`` over TLS with small bounds (2 per address, 4 in all) and a long handshake timeout,
so that the held ones stay for the test.
"""

from __future__ import annotations

import socket
import ssl
from pathlib import Path

import httpx
import pytest

from tests.support import (
    initialize,
    read_until_closed,
    serve,
    store_env,
    tls_connect,
    whoami_from,
)

PER_ADDRESS, TOTAL = 2, 4
CLOSED_WITHIN = 10.0  # seconds by which a refused connection must be closed (the timeout: 60)


def _silent(port: int, source: str) -> socket.socket:
    """A TCP connection from ``source`` that never sends its ClientHello."""
    return socket.create_connection(("127.0.0.1", port), timeout=CLOSED_WITHIN,
                                    source_address=(source, 0))


def _closed_at_once(sock: socket.socket) -> None:
    try:
        assert read_until_closed(sock) == b"", "the server sent something before any handshake"
    except TimeoutError:
        pytest.fail(f"still open {CLOSED_WITHIN:g}s later: the handshake bound did not apply")
    finally:
        sock.close()


def _held(sock: socket.socket) -> bool:
    """Still open: nothing to read, and no end."""
    sock.settimeout(0.2)
    try:
        return bool(sock.recv(1))
    except TimeoutError:
        return True
    finally:
        sock.settimeout(CLOSED_WITHIN)


def _served(port: int, ca: Path, token: str, source: str) -> bool:
    try:
        return whoami_from(port, ca, token, source).status_code == 200
    except httpx.TransportError:  # closed before its handshake: the bound still holds
        return False


def _refused_count(text: str, per: str) -> float:
    line = f'better_compute_http_connections_refused_total{{per="{per}"}} '
    return sum(float(row.split()[-1]) for row in text.splitlines() if row.startswith(line))


def test_handshakes_under_way_are_bounded_per_address_and_per_process(tmp_path: Path) -> None:
    env = {**store_env("sqlite", tmp_path),
           "BETTER_COMPUTE_HTTP_MAX_HANDSHAKES_PER_ADDRESS": str(PER_ADDRESS),
           "BETTER_COMPUTE_HTTP_MAX_HANDSHAKES": str(TOTAL),
           "BETTER_COMPUTE_HTTP_HEAD_TIMEOUT": "60s"}
    token = initialize(env)
    ca = Path(env["BETTER_COMPUTE_DATA_DIR"]) / "serving-ca.pem"
    log = tmp_path / "serve.log"
    with serve(env, "--workers", "1", log_file=log) as server:
        held = [_silent(server.port, "127.0.0.1") for _ in range(PER_ADDRESS)]
        # The next silent one of that address is closed before its handshake; the held
        # ones are not.
        _closed_at_once(_silent(server.port, "127.0.0.1"))
        assert all(_held(sock) for sock in held)

        # Another address is served meanwhile, and so many connections of one address that
        # have finished their handshakes are not handshakes under way.
        done = [tls_connect(server.port, ca, timeout=CLOSED_WITHIN, source="127.0.0.2")
                for _ in range(PER_ADDRESS + 3)]
        answer = whoami_from(server.port, ca, token, "127.0.0.2")
        assert answer.status_code == 200 and "result" in answer.json(), answer.text

        # The process's bound: two more silent ones from another address fill it. One more,
        # from an address with none under way, takes the place of the oldest (127.0.0.1's
        # first), which is closed; a client that finishes its handshake is served the same way.
        held += [_silent(server.port, "127.0.0.3") for _ in range(TOTAL - PER_ADDRESS)]
        newcomer = _silent(server.port, "127.0.0.4")
        _closed_at_once(held.pop(0))
        assert _held(newcomer) and all(_held(sock) for sock in held)
        held.append(newcomer)
        assert _served(server.port, ca, token, "127.0.0.4")
        transport = httpx.HTTPTransport(verify=ssl.create_default_context(cafile=str(ca)),
                                        local_address="127.0.0.5")  # 127.0.0.1 is at its bound
        with httpx.Client(transport=transport, timeout=30) as client:
            metrics = client.get(f"https://127.0.0.1:{server.port}/metrics",
                                 headers={"authorization": f"Bearer {token}"}).text
        assert _refused_count(metrics, "handshake_address") == 1, metrics
        assert _refused_count(metrics, "handshake_server") >= 2, metrics
        for sock in [*held, *done]:
            sock.close()
    text = log.read_text(errors="replace")
    # One line a minute however many were refused (http_limits.ClientNoise).
    assert text.count("TLS handshake refused before it began") == 1, text[-4000:]
    assert "127.0.0.1 has 2 under way (at most 2, http.max_handshakes_per_address)" in text, \
        text[-4000:]
    assert text.count("the oldest TLS handshake under way was dropped for a new one: 4 under "
                      "way (at most 4, http.max_handshakes)") == 1, text[-4000:]
    assert "Traceback" not in text and " ERROR " not in text, text[-4000:]
