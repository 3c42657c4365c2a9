"""Benchmark of the placer: reservations placed per second, and placement latency by fleet size.

    .venv/bin/python -m better_compute.benchmarks.placer [--backend sqlite|postgres|both]
        [--pg-url postgresql://…] [--clients 1,4,16] [--nodes 1000] [--seconds 5]
        [--latency-fleets 100,1000,10000] [--latency-samples 50]

For each backend, in a fresh store:

1. throughput: a simulated pool of ``--nodes`` adopted nodes x 8 GPUs; N client
   threads call ``reservations.create`` (1 GPU for 1h each, a new key each) through
   the service for ``--seconds``; reported in reservations placed per second.
   Between client counts every reservation is released, so each run starts on
   an empty pool.
2. latency: pools of 100, 1,000 and 10,000 nodes; one client places
   ``--latency-samples`` reservations one after the other; p50 and p95 of one
   create (catch-up, projection read, placement, one atomic save). The goal is
   a latency that does not grow with the fleet, because the placer reads the
   free-GPU projection's few best candidates instead of loading nodes.

Setting up a fleet (nodes joined and adopted, the projections caught up) is
timed separately and not part of the figures. Every phase is bounded in time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path

from better_compute.api.runtime import Runtime
from better_compute.benchmarks.fleet import add_nodes, make_pool
from better_compute.benchmarks.harness import drop_schema, initialized, store_env
from better_compute.domain.access import LOCAL_OPERATOR


def _fleet(runtime: Runtime, nodes: int, key: str) -> tuple[str, float]:
    started = time.perf_counter()
    pool = make_pool(runtime.service, key=key)
    add_nodes(runtime.service, pool, nodes)
    runtime.projections.catch_up()
    return pool, time.perf_counter() - started


def throughput(runtime: Runtime, pool: str, clients: int, seconds: float) -> float:
    service = runtime.services.reservations
    stop = time.monotonic() + seconds
    placed: list[str] = []
    errors: list[str] = []
    lock = threading.Lock()

    def client() -> None:
        while time.monotonic() < stop:
            try:
                doc = service.create(LOCAL_OPERATOR, tenant_id=None, pool_id=pool, gpus=1,
                                     duration="1h")
            except Exception as exc:  # report, do not hide
                with lock:
                    errors.append(repr(exc))
                return
            with lock:
                placed.append(doc["id"])

    threads = [threading.Thread(target=client) for _ in range(clients)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - started
    if errors:
        print(f"    {len(errors)} client errors, first: {errors[0]}")
    for rsv in placed:  # start the next run on an empty pool
        service.release(LOCAL_OPERATOR, rsv)
    return len(placed) / elapsed


def latency(runtime: Runtime, pool: str, samples: int) -> tuple[float, float]:
    service = runtime.services.reservations
    times = []
    for _ in range(samples):
        started = time.perf_counter()
        service.create(LOCAL_OPERATOR, tenant_id=None, pool_id=pool, gpus=1, duration="1h")
        times.append((time.perf_counter() - started) * 1000)
    times.sort()
    return statistics.median(times), times[min(len(times) - 1, int(len(times) * 0.95))]


def run_backend(backend: str, args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        env = store_env(backend, args.pg_url, Path(tmp))
        runtime = initialized(env).runtime
        try:
            pool, setup = _fleet(runtime, args.nodes, "bench-throughput")
            print(f"{backend}: pool of {args.nodes} nodes x 8 GPUs set up in {setup:.1f}s")
            for clients in [int(c) for c in args.clients.split(",")]:
                rate = throughput(runtime, pool, clients, args.seconds)
                print(f"  {backend} throughput, {clients:>2} clients: {rate:8.1f} placed/s")
            for size in [int(n) for n in args.latency_fleets.split(",")]:
                lat_pool, setup = _fleet(runtime, size, f"bench-latency-{size}")
                p50, p95 = latency(runtime, lat_pool, args.latency_samples)
                print(f"  {backend} latency, {size:>6} nodes: p50 {p50:6.1f} ms, "
                      f"p95 {p95:6.1f} ms (fleet set up in {setup:.1f}s)")
        finally:
            runtime.close()
            drop_schema(env)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m better_compute.benchmarks.placer",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", choices=["sqlite", "postgres", "both"], default="both")
    parser.add_argument("--pg-url", default=os.environ.get("BC_TEST_PG_URL"))
    parser.add_argument("--clients", default="1,4,16")
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--latency-fleets", default="100,1000,10000")
    parser.add_argument("--latency-samples", type=int, default=50)
    args = parser.parse_args(argv)
    backends = ["sqlite", "postgres"] if args.backend == "both" else [args.backend]
    for backend in backends:
        run_backend(backend, args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

