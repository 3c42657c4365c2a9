"""``serve --workers N``: several processes on one socket keep every guarantee.

50 clients over HTTPS, each with its own token and kept-alive connection, reserve on one
pool of a server running three workers (so placements race across processes, each with
its own placement lock and read models): no GPU is booked twice and the quota holds. The quota
contends: 40 clients of the tenant ask for 2 GPUs each (80) against its quota of 12, and the
owner's 10 single GPUs leave room for all of it, so exactly 6 are placed and 34 refused with
``quota_exceeded``.
A worker that dies takes the server down with status 1, so a service manager restarts it.
"""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path
from typing import Any

from better_compute.domain.access import LOCAL_OPERATOR as OP
from tests.booking_checks import assert_booked_once_within_quota
from tests.fleet import add_nodes, make_pool
from tests.outage import api_client, rpc_call
from tests.support import eventually, free_port, initialize, open_runtime, serve, store_env

QUOTA = 12
CLIENTS = 50
OWNERS = 10  # clients of the pool's owner (unlimited), one GPU each: they never fill the pool


def _children(pid: int) -> list[int]:
    return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def _gone(pid: int) -> bool:
    """``pid`` has exited (a zombie not yet reaped by whoever adopted it counts)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (FileNotFoundError, ProcessLookupError):
        return True


def test_fifty_clients_on_three_workers_never_double_book_nor_exceed_the_quota(
        env: dict[str, str]) -> None:
    initialize(env)
    runtime = open_runtime(env)
    try:
        service = runtime.service
        pool = make_pool(service)
        nodes = add_nodes(service, pool, 4)  # 32 GPUs
        service.tenants_create(OP, "acme", None)
        service.pools_offer(OP, pool, "acme", {"gpu": QUOTA})
        tokens = [service.tokens_create(OP, None if n % 5 == 0 else "acme",
                                        "admin" if n % 5 == 0 else "member",
                                        f"client-{n}")["token"]
                  for n in range(CLIENTS)]
        ca = Path(env["BETTER_COMPUTE_DATA_DIR"]) / "serving-ca.pem"
        with serve(env, "--workers", "3") as server:
            assert len(_children(server.process.pid)) == 3
            barrier = threading.Barrier(CLIENTS)
            results: list[tuple[str, Any]] = []
            lock = threading.Lock()

            def client(n: int) -> None:
                with api_client(server.url, ca, timeout=120) as http:
                    rpc_call(http, tokens[n], "system.whoami", {})  # connected, warm
                    barrier.wait()
                    out = rpc_call(http, tokens[n], "reservations.create",
                                   {"poolId": pool, "gpus": 1 if n % 5 == 0 else 2,
                                    "duration": "1h", "key": f"client-{n}"})
                with lock:
                    results.append((out.error or "ok", out.result))

            threads = [threading.Thread(target=client, args=(n,)) for n in range(CLIENTS)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=240)
        assert len(results) == CLIENTS
        placed = [doc for kind, doc in results if kind == "ok"]
        assert_booked_once_within_quota(runtime.store, pool, nodes, placed, "acme", QUOTA, 32)
        assert sum(d["gpuCount"] for d in placed if d["tenantId"] == "acme") == QUOTA
        assert sum(1 for d in placed if d["tenantId"] == "root") == OWNERS
        assert sorted(kind for kind, _ in results if kind != "ok") == \
            ["quota_exceeded"] * (CLIENTS - OWNERS - QUOTA // 2), results
    finally:
        runtime.close()


def test_a_worker_that_dies_stops_the_server_with_status_1(tmp_path: Path) -> None:
    env = store_env("sqlite", tmp_path)
    initialize(env)
    with serve(env, "--workers", "2") as server:
        workers = _children(server.process.pid)
        assert len(workers) == 2
        os.kill(workers[1], signal.SIGKILL)
        assert server.process.wait(timeout=60) == 1
        eventually(lambda: _gone(workers[0]), "the other worker ended too")


def _listening_ports(pid: int) -> set[int]:
    """The TCP ports process ``pid`` listens on (Linux /proc: its sockets' inodes)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:["):-1])
    ports = set()
    for line in Path(f"/proc/{pid}/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[3] == "0A" and fields[9] in inodes:  # LISTEN
            ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def test_the_gateway_runs_in_the_last_worker_apart_from_the_controllers(
        tmp_path: Path) -> None:
    """A fleet connecting at once is two kinds of work that each take a core: the gateway's
    handshakes and sessions, the controllers' passes (docs/decisions.md)."""
    env = store_env("sqlite", tmp_path)
    initialize(env)
    gateway = free_port()
    with serve(env, "--workers", "2", "--gateway-listen", f"127.0.0.1:{gateway}") as server:
        first, last = _children(server.process.pid)
        eventually(lambda: gateway in _listening_ports(last), "the last worker serves it")
        assert gateway not in _listening_ports(first)
        lock = Path(env["BETTER_COMPUTE_DATA_DIR"]) / "controllers.lock"
        eventually(lambda: _flock_holder(lock) == first,
                   "worker 0 runs the controllers")


def _flock_holder(path: Path) -> int | None:
    """The process holding a ``flock`` on ``path`` (Linux /proc/locks), if any."""
    if not path.exists():
        return None
    inode = path.stat().st_ino
    for line in Path("/proc/locks").read_text().splitlines():
        fields = line.split()
        if fields[1] == "FLOCK" and int(fields[5].rsplit(":", 1)[1]) == inode:
            return int(fields[4])
    return None
