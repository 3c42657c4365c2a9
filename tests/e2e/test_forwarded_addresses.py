"""Whose address a call is: the connection's peer, unless that peer is a proxy the operator
named (``http.trusted_proxies``), whose ``X-Forwarded-For`` is then believed.

The client's address is what an anonymous caller's share of the server's threads is
counted by (api/http/http_limits.py ``caller_key``) and what the request log shows
(``client``). uvicorn's default believes ``X-Forwarded-For`` from 127.0.0.1 and ::1: with
it, any process on the server's machine could call as any address it liked, and an
anonymous one take a share of the threads per address it made up.

A real ``serve`` over TLS, its request log in JSON; calls from 127.0.0.1 and 127.0.0.2.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.support import CLI, initialize, serve, store_env, whoami_from

FORGED = "203.0.113.7"


def _call(port: int, ca: Path, token: str, source: str, forwarded: str | None) -> str:
    """A whoami from ``source``, claiming ``forwarded``; its request id."""
    headers = {"x-request-id": os.urandom(8).hex()}
    if forwarded is not None:
        headers["x-forwarded-for"] = forwarded
    answer = whoami_from(port, ca, token, source, headers)
    assert answer.status_code == 200, answer.text
    return headers["x-request-id"]


def _clients(log: Path) -> dict[str, Any]:
    """request id -> the client address its request log line names."""
    lines = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    return {line["request_id"]: line.get("client") for line in lines
            if line["logger"] == "better_compute.request"}


def _env(tmp_path: Path, **more: str) -> dict[str, str]:
    return {**store_env("sqlite", tmp_path), **more}


LOGS = ("--log-level", "info", "--log-format", "json")


def test_a_forwarded_address_is_not_believed_by_default(tmp_path: Path) -> None:
    env = _env(tmp_path)
    token = initialize(env)
    ca = Path(env["BETTER_COMPUTE_DATA_DIR"]) / "serving-ca.pem"
    log = tmp_path / "serve.log"
    with serve(env, *LOGS, log_file=log) as server:
        forged = _call(server.port, ca, token, "127.0.0.1", FORGED)
        plain = _call(server.port, ca, token, "127.0.0.2", None)
    clients = _clients(log)
    assert clients[forged] == "127.0.0.1", clients  # the peer, not what it claimed
    assert clients[plain] == "127.0.0.2", clients


def test_a_named_proxy_is_believed_and_no_one_else(tmp_path: Path) -> None:
    env = _env(tmp_path, BETTER_COMPUTE_HTTP_TRUSTED_PROXIES="127.0.0.2, 10.9.0.0/16")
    token = initialize(env)
    ca = Path(env["BETTER_COMPUTE_DATA_DIR"]) / "serving-ca.pem"
    log = tmp_path / "serve.log"
    with serve(env, *LOGS, log_file=log) as server:
        via_proxy = _call(server.port, ca, token, "127.0.0.2", f"{FORGED}, 127.0.0.2")
        not_a_proxy = _call(server.port, ca, token, "127.0.0.1", FORGED)
    clients = _clients(log)
    assert clients[via_proxy] == FORGED, clients
    assert clients[not_a_proxy] == "127.0.0.1", clients


@pytest.mark.parametrize("value", ["not-an-address", "10.0.0.0/33"])
def test_a_trusted_proxy_that_is_no_address_is_refused_at_start(tmp_path: Path,
                                                                 value: str) -> None:
    env = _env(tmp_path, BETTER_COMPUTE_HTTP_TRUSTED_PROXIES=value)
    initialize(env)
    done = subprocess.run([CLI, "serve", "--listen", "127.0.0.1:0"], env=env,
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "http.trusted_proxies" in done.stderr and value in done.stderr, done.stderr
