"""What one anonymous client can do to the HTTP edge of a real ``serve`` (issue 30), and what
it may no longer do: sink a worker's memory with pipelined requests it never reads or with
an endless request head, or keep out every new client (and node) with connections that never
begin their TLS handshake.

Before: one connection pipelining ``GET /api/compute/health`` without reading took a worker
from 71 MB to 2,283 MB; 50 MB heads took one from 208 MB to 1.6 GB and a 200 MB head stalled
a kept-alive root whoami past 10 s; 5,000 silent connections from 100 addresses (50 each,
under the per-address bound) made 70 of 147 whoami calls on fresh connections fail, and
1,300 from 5 addresses 31 of 38 reconnects of a node with a valid certificate. Each attack
here is the same in kind, smaller in size (the bounds are set small where a bound is what
is tested); benchmarks/hostile.py ``--edge`` runs them at full size. Memory and successes are
asserted, never times.
"""

from __future__ import annotations

import socket
import ssl
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from better_compute.benchmarks.hostile import (
    Target,
    fresh_whoami,
    large_head,
    loopback_addresses,
    make_node,
    node_session,
    pipelined_unread,
    rss_mb,
    silent,
    still_open,
)
from tests.support import free_port, initialize, serve, store_env

GROWTH_MB = 64  # what an attack may add to a worker's resident memory, at most


class _Peak:
    def __init__(self) -> None:
        self.mb = 0.0


@contextmanager
def _peak_rss(pid: int) -> Iterator[_Peak]:
    """The process's peak resident memory while the block runs (sampled every 20 ms)."""
    peak, done = _Peak(), threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak.mb = max(peak.mb, rss_mb(pid))
            done.wait(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        yield peak
    finally:
        done.set()
        sampler.join()
        peak.mb = max(peak.mb, rss_mb(pid))


def _idle_rss(pid: int, port: int, context: ssl.SSLContext, token: str) -> float:
    """The server's resident memory once it has served (its code loaded, its caches warm)."""
    for _ in range(20):
        assert fresh_whoami(port, context, token)
    return rss_mb(pid)


def _target(env: dict[str, str], server: object, token: str) -> tuple[Target, ssl.SSLContext]:
    ca = str(Path(env["BETTER_COMPUTE_DATA_DIR"]) / "serving-ca.pem")
    target = Target(server.url, server.process.pid, ca, {"root": token}, "")  # type: ignore[attr-defined]
    return target, ssl.create_default_context(cafile=ca)


def test_pipelined_requests_that_are_never_read_hold_bounded_memory(tmp_path: Path) -> None:
    """One request is read at a time: the server stops reading while an answer is pending,
    and a client that takes none of its answers is ended (``http.send_timeout``)."""
    env = {**store_env("sqlite", tmp_path), "BETTER_COMPUTE_HTTP_SEND_TIMEOUT": "2s"}
    token = initialize(env)
    with serve(env) as server:
        target, context = _target(env, server, token)
        idle = _idle_rss(server.process.pid, server.port, context, token)
        with _peak_rss(server.process.pid) as peak:
            outcome = pipelined_unread(target, megabytes=30)
        assert peak.mb - idle < GROWTH_MB, f"idle {idle:.0f} MB, peak {peak.mb:.0f} MB ({outcome})"
        assert not outcome.startswith("all sent"), f"the server read every request: {outcome}"
        assert fresh_whoami(server.port, context, token)


def test_request_heads_are_bounded(tmp_path: Path) -> None:
    """A head of 50 or 200 MB is refused (431, or the connection ended) once it passes the
    bound (64 KiB), and a kept-alive root connection is served meanwhile."""
    env = store_env("sqlite", tmp_path)
    token = initialize(env)
    with serve(env) as server:
        target, context = _target(env, server, token)
        idle = _idle_rss(server.process.pid, server.port, context, token)
        outcomes: dict[int, str] = {}
        with httpx.Client(base_url=server.url, verify=context, timeout=60) as root, \
                _peak_rss(server.process.pid) as peak:
            def whoami() -> int:
                return root.post("/api/compute/rpc", headers={"authorization": f"Bearer {token}"},
                                 json={"jsonrpc": "2.0", "id": 1,
                                       "method": "system.whoami"}).status_code

            assert whoami() == 200  # the kept-alive connection, open before the attack
            heads = [threading.Thread(target=lambda i=i, mb=mb: outcomes.__setitem__(
                i, large_head(target, mb))) for i, mb in enumerate((50, 50, 200))]
            for thread in heads:
                thread.start()
            assert whoami() == 200
            for thread in heads:
                thread.join()
            assert whoami() == 200
    for i, mb in enumerate((50, 50, 200)):
        status, _, sent = outcomes[i].partition(" after ")
        assert status in ("431", "closed", "ConnectionResetError"), outcomes
        # After its answer the server reads (and drops) what still comes for 0.25 s at most
        # (listener.CLOSE_TIMEOUT): on loopback that can be tens of megabytes.
        assert mb < 200 or int(sent.split()[0]) < mb, f"the server took the whole head: {outcomes}"
    assert peak.mb - idle < GROWTH_MB, f"idle {idle:.0f} MB, peak {peak.mb:.0f} MB"


def test_silent_connections_from_many_addresses_do_not_keep_out_a_client(
        tmp_path: Path) -> None:
    """20 addresses each hold 5 connections that never begin their handshake (under the
    per-address bound of 8), 100 in all against a bound of 40 handshakes under way: the
    oldest are dropped for each newcomer, so every fresh root whoami is served."""
    env = {**store_env("sqlite", tmp_path),
           "BETTER_COMPUTE_HTTP_MAX_HANDSHAKES": "40",
           "BETTER_COMPUTE_HTTP_MAX_HANDSHAKES_PER_ADDRESS": "8",
           "BETTER_COMPUTE_HTTP_HEAD_TIMEOUT": "120s"}  # the silent ones are not timed out
    token = initialize(env)
    flood_from = loopback_addresses(20, third=1)
    with serve(env) as server:
        _, context = _target(env, server, token)
        flood: list[socket.socket] = []
        served = 0
        for _ in range(5):  # the flood renewed before each call: the bound is full each time
            flood += silent(server.port, flood_from, 5)
            served += fresh_whoami(server.port, context, token)
        assert served == 5
        # The server holds no more of them than its bound (it dropped the oldest).
        assert still_open(flood) <= 40, still_open(flood)
        for sock in flood:
            sock.close()


def test_a_node_reconnects_through_silent_connections_from_many_addresses(
        env: dict[str, str], tmp_path: Path) -> None:
    """The same rule on the agents' gateway: 5 addresses each hold 8 silent connections
    (under the per-address bound of 10), 40 against a bound of 30; a node with a valid
    certificate is welcomed every time it reconnects."""
    env = {**env, "BETTER_COMPUTE_GATEWAY_MAX_HANDSHAKES": "30",
           "BETTER_COMPUTE_GATEWAY_MAX_HANDSHAKES_PER_ADDRESS": "10"}
    initialize(env)
    node = make_node(env, tmp_path)
    ca = str(Path(env["BETTER_COMPUTE_DATA_DIR"]) / "serving-ca.pem")
    gateway = free_port()
    with serve(env, "--gateway-listen", f"127.0.0.1:{gateway}") as server:
        assert server.process.poll() is None
        flood: list[socket.socket] = []
        welcomed = 0
        for _ in range(5):
            flood += silent(gateway, loopback_addresses(5, third=2), 8)
            welcomed += node_session(gateway, ca, node)
        assert welcomed == 5
        assert still_open(flood) <= 30, still_open(flood)
        for sock in flood:
            sock.close()
