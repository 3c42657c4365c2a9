"""Benchmark of the earliest start and the queue: preview latency by fleet size, dispatch time.

    .venv/bin/python -m better_compute.benchmarks.queue [--backend sqlite|postgres|both]
        [--pg-url postgresql://…] [--fleets 100,1000,10000] [--samples 50]
        [--dispatch-nodes 100] [--dispatch-samples 30]

For each backend, in a fresh store:

1. preview latency: pools of 100, 1,000 and 10,000 adopted nodes x 8 GPUs (one store), every
   GPU booked about 10 times (``--bookings``) from now on: groups of 1, 2, 4 or 8 GPUs of a
   node, each for 30 min to 3 h (whole seconds), one after the other, so every GPU is busy
   now and the pool is full for hours. One client asks ``capacity.preview`` (through the
   service, as the API calls it) for 1 GPU and for 8 GPUs for 2 h: it does not fit now, and
   the answer is the exact earliest start. The sizes take turns, one preview each per round,
   ``--samples`` rounds, so the machine's load weighs on every size alike. p50 and p95 per
   size. The goal: flat (p50 at 10,000 nodes at most 1.5 x p50 at 100), because the search
   reads the index in ascending bound and only the bookings of the few nodes that can matter.
2. dispatch time: a real ``better-compute serve --gateway-listen`` (it runs the queue
   dispatcher) on a pool of ``--dispatch-nodes`` nodes; tenant acme (quota 1 GPU) holds one
   GPU and queues another (``queued``: over quota). We release the held one over HTTPS and
   time until ``reservation.dequeued`` of the queued one arrives on a ``/watch`` stream
   (the client's view), and the gap between the two events' recorded times (the server's).

Setting up a fleet (nodes, bookings, projections caught up) is timed separately and not in
the figures. Every phase is bounded in time.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import random
import ssl
import statistics
import tempfile
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from better_compute.api.runtime import Runtime
from better_compute.benchmarks.fleet import add_nodes, make_pool
from better_compute.benchmarks.harness import (
    drop_schema,
    free_port,
    initialized,
    load_average,
    serving,
    store_env,
)
from better_compute.domain.access import LOCAL_OPERATOR, Principal, Role
from better_compute.domain.bookings import NodeBookings
from better_compute.domain.reservation import new_allocation_id

ACME = Principal("acme", Role.MEMBER, "tok_bench")
GROUPS = (1, 2, 4, 8)


def book_node(pool: str, node_id: str, gpus: list[str], now: datetime, per_gpu: int,
              rnd: random.Random) -> NodeBookings:
    """A node's bookings: every GPU about ``per_gpu`` times, busy from ``now`` on.

    Each booking takes the GPUs that free first and starts when the last of them is free (so
    the others wait a little: gaps); a GPU's first booking starts ``now``.
    """
    bookings = NodeBookings(tenant_id="root", node_id=node_id, pool_id=pool)
    free_at = dict.fromkeys(gpus, now)
    count = dict.fromkeys(gpus, 0)
    while min(count.values()) < per_gpu:
        size = rnd.choice(GROUPS)
        group = sorted(gpus, key=lambda g: (free_at[g], count[g], g))[:size]
        if count[group[0]] == 0:  # first bookings start now: the pool is full from now on
            group = [g for g in group if count[g] == 0]
        start = max(free_at[g] for g in group)
        end = start + timedelta(seconds=rnd.randint(30 * 60, 180 * 60))
        bookings.book(allocation_id=new_allocation_id(), reservation_id="rsv_bench",
                      holder="root", gpus=group, cpus=26 * size, memory_gib=239 * size,
                      start=start, end=end)
        for g in group:
            free_at[g], count[g] = end, count[g] + 1
    return bookings


def booked_fleet(runtime: Runtime, nodes: int, per_gpu: int, key: str) -> tuple[str, float]:
    started = time.perf_counter()
    pool = make_pool(runtime.service, key=key)
    node_ids = add_nodes(runtime.service, pool, nodes)
    now = datetime.now(UTC)
    rnd = random.Random(nodes)
    batch: list[NodeBookings] = []
    for node_id in node_ids:
        host = node_id[5:13]
        batch.append(book_node(pool, node_id, [f"GPU-{host}-{i:02d}" for i in range(8)], now,
                               per_gpu, rnd))
        if len(batch) == 50:
            runtime.store.save(*batch, actor="local")
            batch = []
    if batch:
        runtime.store.save(*batch, actor="local")
    for name in ("free_gpus", "reservations"):  # what the preview reads (listings, capacity:
        runtime.projections.catch_up(name)     # not read here, and slow to fill this way)
    return pool, time.perf_counter() - started


def preview_latency(runtime: Runtime, pools: dict[int, str], samples: int
                    ) -> dict[tuple[int, int], tuple[float, float, str]]:
    """p50, p95 (ms) and the answer per (fleet size, GPUs), the sizes taking turns."""
    service = runtime.services.reservations
    times: dict[tuple[int, int], list[float]] = {}
    answers: dict[tuple[int, int], dict[str, Any]] = {}
    for _ in range(samples):
        for size, pool in pools.items():
            for gpus in (1, 8):
                started = time.perf_counter()
                answer = service.preview(LOCAL_OPERATOR, tenant_id=None, pool_id=pool,
                                         gpus=gpus, duration="2h")
                times.setdefault((size, gpus), []).append((time.perf_counter() - started) * 1000)
                answers[(size, gpus)] = answer
    out = {}
    for case, got in times.items():
        answer = answers[case]
        if answer["fits"] or not answer.get("earliest"):
            raise SystemExit(f"the pool should be full with an earliest start: {answer}")
        got.sort()
        out[case] = (statistics.median(got), got[min(len(got) - 1, int(len(got) * 0.95))],
                     str(answer["earliest"]["start"]))
    return out


# ------------------------------------------------------------------------ dispatch

class Watch:
    """One /watch stream in a thread; ``next_of`` waits for an event of a type."""

    def __init__(self, url: str, token: str, ca: str) -> None:
        import httpx

        self.lines: queue.Queue[dict[str, Any]] = queue.Queue()
        self.ready = threading.Event()
        self.client = httpx.Client(verify=ssl.create_default_context(cafile=ca),
                                   timeout=httpx.Timeout(60.0, connect=10.0))
        self.url, self.token = url, token
        threading.Thread(target=self._run, daemon=True).start()
        if not self.ready.wait(30):
            raise SystemExit("the /watch stream did not open within 30 s")

    def _run(self) -> None:
        try:
            with self.client.stream("GET", f"{self.url}/api/compute/events/watch",
                                    params={"types": "reservation.*"},
                                    headers={"authorization": f"Bearer {self.token}"}) as resp:
                self.ready.set()
                for line in resp.iter_lines():
                    if line.strip():
                        self.lines.put(json.loads(line))
        except Exception:  # the stream ends when the server stops
            self.ready.set()

    def next_of(self, kind: str, subject: str, timeout: float = 30.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            line = self.lines.get(timeout=max(0.01, deadline - time.monotonic()))
            if line.get("type") == kind and line.get("subject") == subject:
                return line


def _time(event: dict[str, Any]) -> datetime:
    return datetime.fromisoformat(str(event["time"]).replace("Z", "+00:00"))


def dispatch_time(env: dict[str, str], nodes: int, samples: int) -> dict[str, float]:
    import httpx

    ready = initialized(env)
    runtime, token = ready.runtime, ready.token
    try:
        service = runtime.service
        pool = make_pool(service, key="bench-dispatch")
        add_nodes(service, pool, nodes)
        service.tenants_create(LOCAL_OPERATOR, "acme", None)
        service.pools_offer(LOCAL_OPERATOR, pool, "acme", {"gpu": 1})
        rs = runtime.services.reservations
        port = free_port()
        with serving(env, port, "--gateway-listen", f"127.0.0.1:{free_port()}"):
            url = f"https://127.0.0.1:{port}"
            ca = str(Path(env["BETTER_COMPUTE_DATA_DIR"]) / "serving-ca.pem")
            watch = Watch(url, token, ca)
            client = httpx.Client(base_url=url, verify=ssl.create_default_context(cafile=ca),
                                  headers={"authorization": f"Bearer {token}"})
            seen, gaps = [], []
            for _ in range(samples):
                held = rs.create(ACME, tenant_id=None, pool_id=pool, gpus=1, duration="1h")
                queued = rs.create(ACME, tenant_id=None, pool_id=pool, gpus=1, duration="1h",
                                   queue=True)
                if queued["state"] != "queued":
                    raise SystemExit(f"expected a queued reservation: {queued}")
                started = time.perf_counter()
                client.post("/api/compute/rpc", json={
                    "jsonrpc": "2.0", "id": 1, "method": "reservations.release",
                    "params": {"reservationId": held["id"], "tenantId": "acme"}}).raise_for_status()
                released = watch.next_of("reservation.released", held["id"])
                placed = watch.next_of("reservation.dequeued", queued["id"])
                seen.append((time.perf_counter() - started) * 1000)
                gaps.append((_time(placed) - _time(released)).total_seconds() * 1000)
                rs.release(ACME, queued["id"])
            client.close()
    finally:
        runtime.close()
    seen.sort()
    gaps.sort()
    return {"clientP50": statistics.median(seen), "clientP95": seen[int(len(seen) * 0.95)],
            "serverP50": statistics.median(gaps), "serverP95": gaps[int(len(gaps) * 0.95)]}


def run_backend(backend: str, args: argparse.Namespace) -> None:
    if args.fleets:
        run_previews(backend, args)
    if args.dispatch_samples:
        with tempfile.TemporaryDirectory() as tmp:
            env = store_env(backend, args.pg_url, Path(tmp))
            try:
                got = dispatch_time(env, args.dispatch_nodes, args.dispatch_samples)
            finally:
                drop_schema(env)
            print(f"  load average: {load_average()}", flush=True)
            print(f"  {backend} dispatch, release to reservation.dequeued: client p50 "
                  f"{got['clientP50']:.1f} ms, p95 {got['clientP95']:.1f} ms; between the "
                  f"events p50 {got['serverP50']:.1f} ms, p95 {got['serverP95']:.1f} ms",
                  flush=True)


def run_previews(backend: str, args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        env = store_env(backend, args.pg_url, Path(tmp))
        runtime = initialized(env).runtime
        try:
            pools = {}
            for size in [int(n) for n in args.fleets.split(",")]:
                pools[size], setup = booked_fleet(runtime, size, args.bookings,
                                                  f"bench-preview-{size}")
                print(f"  {backend}: {size} nodes x 8 GPUs, ~{args.bookings} bookings per GPU, "
                      f"set up in {setup:.1f}s", flush=True)
            print(f"  load average before: {load_average()}", flush=True)
            figures = preview_latency(runtime, pools, args.samples)
            print(f"  load average after:  {load_average()}", flush=True)
            for (size, gpus), (p50, p95, earliest) in sorted(figures.items()):
                print(f"  {backend} preview, {size:>6} nodes, {gpus} GPU{'s' if gpus > 1 else ''}"
                      f": p50 {p50:6.1f} ms, p95 {p95:6.1f} ms (earliest {earliest})", flush=True)
            smallest, largest = min(pools), max(pools)
            for gpus in (1, 8):
                ratio = figures[(largest, gpus)][0] / figures[(smallest, gpus)][0]
                print(f"  {backend} p50 {largest} / p50 {smallest} nodes, {gpus} GPU(s): "
                      f"{ratio:.2f} (goal: at most 1.5)", flush=True)
        finally:
            runtime.close()
            drop_schema(env)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m better_compute.benchmarks.queue",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", choices=["sqlite", "postgres", "both"], default="both")
    parser.add_argument("--pg-url", default=os.environ.get("BC_TEST_PG_URL"))
    parser.add_argument("--fleets", default="100,1000,10000",
                        help="fleet sizes for the preview latency ('' skips it)")
    parser.add_argument("--bookings", type=int, default=10, help="bookings per GPU")
    parser.add_argument("--samples", type=int, default=50)
    parser.add_argument("--dispatch-nodes", type=int, default=100)
    parser.add_argument("--dispatch-samples", type=int, default=30)
    args = parser.parse_args(argv)
    backends = ["sqlite", "postgres"] if args.backend == "both" else [args.backend]
    for backend in backends:
        run_backend(backend, args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
