"""Benchmark of a /metrics scrape: its time and size by fleet size (docs/metrics.md).

    .venv/bin/python -m better_compute.benchmarks.scrape [--nodes 100,1000,10000]
        [--pools 10] [--scrapes 20] [--backend sqlite|postgres] [--pg-url postgresql://…]

For each fleet size, a fresh store with that many adopted and connected 8-GPU nodes
spread over ``--pools`` pools (made as benchmarks/fleet.py makes them), one in a hundred
cordoned, every projection caught up;
then ``--scrapes`` renders of the server's registry, the work one scrape does (catching
the projections up finds nothing new, then the read-model queries and the exposition
text). Reported: p50 and max of one scrape, and the text's size.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace

from better_compute.api.http.metrics import ServerMetrics
from better_compute.api.runtime import Runtime
from better_compute.benchmarks.fleet import build_node, make_pool


def _measure(env: dict[str, str], nodes: int, pools: int, scrapes: int) -> str:
    runtime = Runtime.open(env)
    try:
        pool_ids = [make_pool(runtime.service, key=f"pool-{n}") for n in range(pools)]
        fleet = [build_node(pool_ids[n % pools]) for n in range(nodes)]
        now = datetime.now(UTC)
        for n, node in enumerate(fleet):
            node.connect(now, "bench")
            if n % 100 == 0:  # one node in a hundred needs attention
                node.cordon("bench", now, None)
        for start in range(0, len(fleet), 200):
            runtime.service.store.save(*fleet[start:start + 200], actor="local")
        runtime.projections.catch_up()
        metrics = ServerMetrics()
        metrics.bind(SimpleNamespace(runtime=runtime, extra={}))
        times, size = [], 0
        for _ in range(scrapes):
            started = time.perf_counter()
            size = len(metrics.render())
            times.append((time.perf_counter() - started) * 1000)
        return (f"{nodes:>6} nodes: scrape p50 {statistics.median(times):7.1f} ms  "
                f"max {max(times):7.1f} ms  {size / 1024:8.1f} KiB")
    finally:
        runtime.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--nodes", default="100,1000,10000")
    parser.add_argument("--pools", type=int, default=10)
    parser.add_argument("--scrapes", type=int, default=20)
    parser.add_argument("--backend", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument("--pg-url", default=os.environ.get("BC_TEST_PG_URL"))
    args = parser.parse_args()
    for nodes in (int(n) for n in args.nodes.split(",")):
        with tempfile.TemporaryDirectory(prefix="bc-scrape.") as tmp:
            env = {"BETTER_COMPUTE_DATA_DIR": str(Path(tmp))}
            if args.backend == "postgres":
                if not args.pg_url:
                    raise SystemExit("--backend postgres needs --pg-url (or BC_TEST_PG_URL)")
                env["BETTER_COMPUTE_DATABASE_URL"] = (
                    f"{args.pg_url}?schema=bench_{uuid.uuid4().hex[:12]}")
            print(_measure(env, nodes, args.pools, args.scrapes), flush=True)
    print(f"load average: {os.getloadavg()}")


if __name__ == "__main__":
    main()
