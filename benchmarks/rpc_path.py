"""Benchmark of the JSON-RPC path through a real server: calls per second and latency.

    .venv/bin/python -m better_compute.benchmarks.rpc_path [--clients 1,8] [--seconds 5]
        [--rounds 3] [--method system.whoami] [--compare DIR]

A fresh SQLite store, ``better-compute serve --insecure-loopback`` on loopback, and N
client threads, each with its own keep-alive connection, calling ``--method`` with the
root token for ``--seconds``; reported: calls per second, and p50/p99 of one call as the
client sees it.

``--tls`` serves over TLS (the serving certificate ``init`` made) instead of plain HTTP;
``--new-connections`` makes every call on a connection of its own (a TLS handshake each with
``--tls``): what the listener costs per connection, not per call.

``--compare DIR`` runs the same against another checkout of the code (say, the commit
before a change: ``git archive COMMIT | tar -x -C DIR``), alternating the two servers
``--rounds`` times so that a loaded machine's noise falls on both: how the metrics and
request logging are shown to cost nothing measurable (docs/performance.md).
It also times the per-request bookkeeping alone, in this process.
"""

from __future__ import annotations

import argparse
import os
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import timeit
from pathlib import Path

import httpx

from better_compute.api.http.metrics import ServerMetrics
from better_compute.api.http.request_log import CURRENT, RequestRecord, log_request, new_request_id
from better_compute.benchmarks.harness import cpu_seconds, free_port

_PACKAGES = ("domain", "projections", "api", "agent", "cli", "benchmarks")


def _pythonpath(checkout: Path, into: Path) -> str:
    """A folder whose ``better_compute`` package is ``checkout``'s code (ahead of ours)."""
    package = into / "better_compute"
    package.mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text("")
    for name in _PACKAGES:
        link = package / name
        if not link.exists():
            link.symlink_to(checkout.resolve() / name)
    return str(into)


class _Server:
    def __init__(self, env: dict[str, str], pythonpath: str | None, tls: bool = False) -> None:
        self.env = {**env, **({"PYTHONPATH": pythonpath} if pythonpath else {})}
        self.port = free_port()
        self.tls = tls
        self.process: subprocess.Popen[str] | None = None

    def cpu(self) -> float:
        assert self.process is not None
        return cpu_seconds(self.process.pid)

    def __enter__(self) -> str:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "better_compute.cli.main", "serve",
             *(() if self.tls else ("--insecure-loopback",)),
             "--listen", f"127.0.0.1:{self.port}"], env=self.env, text=True,
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if "serving" not in line:
            raise SystemExit(f"the server did not start: {line!r}")
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}/api/compute/rpc"

    def __exit__(self, *exc: object) -> None:
        assert self.process is not None
        self.process.terminate()
        self.process.wait(timeout=60)


def _run(url: str, token: str, method: str, clients: int, seconds: float,
         verify: ssl.SSLContext | bool = True, new_connections: bool = False
         ) -> tuple[float, float, float, int]:
    latencies: list[float] = []
    lock = threading.Lock()
    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": {}}
    deadline = time.monotonic() + seconds
    headers = {"authorization": f"Bearer {token}"}

    def client() -> None:
        mine: list[float] = []
        with httpx.Client(headers=headers, verify=verify) as http:
            http.post(url, json=body).raise_for_status()  # the connection, warm
            while time.monotonic() < deadline:
                started = time.perf_counter()
                if new_connections:  # one of its own, closed after the answer
                    with httpx.Client(headers=headers, verify=verify) as once:
                        once.post(url, json=body).raise_for_status()
                else:
                    http.post(url, json=body).raise_for_status()
                mine.append(time.perf_counter() - started)
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ordered = sorted(latencies)
    return (len(ordered) / seconds, ordered[len(ordered) // 2] * 1000,
            ordered[int(len(ordered) * 0.99)] * 1000, len(ordered) + clients)


def _bookkeeping() -> float:
    """Microseconds per request of the metrics and request records on the path (logging at warning)."""
    metrics = ServerMetrics()

    def one() -> None:
        record = RequestRecord(new_request_id(None))
        current = CURRENT.set(record)
        record.method, record.code = "system.whoami", "ok"
        CURRENT.reset(current)
        metrics.observe(record, 0.001)
        log_request(record, 0.001)

    n = 20_000
    return min(timeit.repeat(one, number=n, repeat=5)) / n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--clients", default="1,8")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--method", default="system.whoami")
    parser.add_argument("--tls", action="store_true", help="serve over TLS, not plain HTTP")
    parser.add_argument("--new-connections", action="store_true",
                        help="every call on a connection of its own")
    parser.add_argument("--compare", type=Path, metavar="DIR",
                        help="another checkout to alternate with (the baseline)")
    args = parser.parse_args()
    print(f"bookkeeping per request, in-process: {_bookkeeping():.2f} us")
    with tempfile.TemporaryDirectory(prefix="bc-rpc-bench.") as tmp:
        env = {"BETTER_COMPUTE_DATA_DIR": str(Path(tmp) / "data"),
               "PATH": os.environ.get("PATH", "")}
        init = subprocess.run([sys.executable, "-m", "better_compute.cli.main", "init"],
                              env=env, capture_output=True, text=True, check=True)
        token = init.stdout.strip().splitlines()[-1]
        servers: dict[str, str | None] = {"this": None}
        if args.compare:
            servers = {"baseline": _pythonpath(args.compare, Path(tmp) / "baseline"),
                       "this": None}
        results: dict[tuple[str, int], list[tuple[float, float, float, float]]] = {}
        for round_ in range(args.rounds):
            order = list(servers.items())
            for name, path in order if round_ % 2 == 0 else order[::-1]:  # no order bias
                server = _Server(env, path, args.tls)
                verify: ssl.SSLContext | bool = ssl.create_default_context(
                    cafile=str(Path(tmp) / "data" / "serving-ca.pem")) if args.tls else True
                with server as url:
                    for clients in (int(c) for c in args.clients.split(",")):
                        cpu = server.cpu()
                        rate, p50, p99, calls = _run(url, token, args.method, clients,
                                                     args.seconds, verify,
                                                     args.new_connections)
                        per_call = (server.cpu() - cpu) / calls * 1000
                        results.setdefault((name, clients), []).append((rate, p50, p99,
                                                                        per_call))
                        print(f"round {round_ + 1} {name:8} {clients:2} clients: "
                              f"{rate:7.0f} calls/s  p50 {p50:.2f} ms  p99 {p99:.2f} ms  "
                              f"server CPU {per_call:.3f} ms/call", flush=True)
        print("medians:")
        for (name, clients), runs in sorted(results.items(), key=lambda kv: (kv[0][1], kv[0][0])):
            rate, p50, p99, per_call = (statistics.median(r[i] for r in runs) for i in range(4))
            print(f"  {name:8} {clients:2} clients: {rate:7.0f} calls/s  p50 {p50:.2f} ms  "
                  f"p99 {p99:.2f} ms  server CPU {per_call:.3f} ms/call")
        print(f"load average: {os.getloadavg()}")


if __name__ == "__main__":
    main()
