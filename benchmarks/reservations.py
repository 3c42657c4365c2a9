"""Reservations as users feel them: creates and releases through `serve` over HTTPS.

    .venv/bin/python -m better_compute.benchmarks.reservations [--backend sqlite|postgres|both]
        [--pg-url postgresql://…] [--clients 1,8,16,32] [--nodes 2200] [--seconds 5]
        [--live 2000] [--window 100] [--live-clients 16] [--live-repeats 3] [--workers N]
        [--client-procs 4] [--quota GPUS]
    .venv/bin/python -m better_compute.benchmarks.reservations --compare DIR [--rounds 4] …
        (DIR's code and ours side by side, round by round: before/after under the same load)
    .venv/bin/python -m better_compute.benchmarks.reservations --peer slurm [--rounds 3] …
        (Slurm's scontrol create reservation alternating with ours: benchmarks/slurm_peer.py)
    .venv/bin/python -m better_compute.benchmarks.reservations --placer [placer options]
        (the pure placer, in process: benchmarks/placer.py)

For each backend, in a fresh store (SQLite in a throwaway data dir; PostgreSQL in a
throwaway schema of ``--pg-url``, as the tests use one):

0. the store's ceiling: one thread saves a new single-event aggregate (a site) in a
   loop for ``--ceiling-seconds`` through the eventsourcing library, in another fresh
   store of the same backend (same mapper, same recorder): saves per second. Every
   rate below is also printed as a percentage of it.
1. a simulated pool of ``--nodes`` adopted nodes x 8 GPUs (benchmarks/fleet.py), then a
   real ``better-compute serve`` process over TLS on loopback (``--workers`` passed on
   when given).
2. for each client count: N clients (threads spread over ``--client-procs`` processes,
   each with its own kept-alive HTTPS connection) call ``reservations.create`` (1 GPU,
   1 h) for ``--seconds``; then ``reservations.release`` on every one of them. Each phase
   prints ops/s, p50/p99 of one call as the client sees it, and the server's CPU per
   operation. Each client has its own token (the server admits 2 calls of one token at
   once), as separate scripts or users would (user + system of the server process and its children, from /proc).
   The clients reserve as the pool's owner (no quota), or with ``--quota`` as a tenant
   offered the pool with that many GPUs: every create then also takes from the tenant's
   one quota use, which concurrent creates of the tenant share.
   Then (unless ``--no-floor``) the same clients call ``system.whoami`` for ``--seconds``:
   the floor, the cheapest authenticated call through the same TLS, HTTP, JSON-RPC and
   thread hand-off, reading and writing nothing; the creates are printed as a share of its
   rate and a multiple of its server CPU per call.
3. live reservations: ``--live-clients`` clients create ``--window`` reservations on an
   empty pool (the rate of the first ones), fill the pool up to ``--live`` live
   reservations, and create ``--window`` more (the rate after ``--live``); then release
   them all. Each end is ``--live-repeats`` windows (each but the last released before
   the next, so each starts with the same live count): their medians are compared, and the
   slowest window of each end is printed beside them.

The load average is printed before and after each backend, and beside each phase with the
share of the machine's CPU time its hypervisor stole meanwhile (``steal``: other guests of a
shared virtual machine): this benchmark is meant for a machine shared with others, so read
its figures with them.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from better_compute.benchmarks import harness
from better_compute.benchmarks.harness import (
    cpu_seconds,
    cpu_ticks,
    free_port,
    load_average,
    steal_percent,
)
from better_compute.benchmarks.reservations_clients import client_process

# ------------------------------------------------------------------------ the server side

def _pythonpath(checkout: Path, into: Path) -> str:
    from better_compute.benchmarks.rpc_path import _pythonpath as link

    return link(checkout, into)


class Server:
    def __init__(self, env: dict[str, str], extra: Sequence[str], code: str | None) -> None:
        self.port = free_port()
        path = {"PYTHONPATH": _pythonpath(Path(code), Path(env["BETTER_COMPUTE_DATA_DIR"]) /
                                          "code")} if code else {}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "better_compute.cli.main", "serve", "--listen",
             f"127.0.0.1:{self.port}", *extra],
            env={**env, "PATH": os.environ.get("PATH", ""), **path}, text=True,
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if "serving" not in line:
            self.process.kill()
            raise SystemExit(f"the server did not start: {line!r}")

    def cpu(self) -> float:
        return cpu_seconds(self.process.pid)

    def close(self) -> None:
        harness.stop(self.process, 60)


# --------------------------------------------------------------------------- one phase

class Bench:
    def __init__(self, server: Server, tokens: list[str], ca_pem: str, pool: str, procs: int,
                 ceiling: float, pg_pid: int | None = None) -> None:
        self.server, self.tokens, self.ca_pem, self.pool = server, tokens, ca_pem, pool
        self.procs, self.ceiling = procs, ceiling
        self.pg_pid = pg_pid  # the local PostgreSQL server: its CPU beside the server's
        self.ctx = multiprocessing.get_context("fork")  # no re-import: a file edited mid-run

    def phase(self, jobs: list[dict[str, Any]], seconds: float | None = None
              ) -> dict[str, Any]:
        """Run ``jobs`` (one per client) over the client processes; the figures."""
        groups = [jobs[i::self.procs] for i in range(min(self.procs, len(jobs)))]
        ready, go, results = self.ctx.Semaphore(0), self.ctx.Event(), self.ctx.Queue()
        start_at = self.ctx.Value("d", 0.0)
        for i, job in enumerate(jobs):  # a token each: admission is per token (2 at once)
            job["seconds"], job["token"] = seconds, self.tokens[i % len(self.tokens)]
        workers = [self.ctx.Process(target=client_process, args=(
            self.server.port, self.ca_pem, group, ready, go, start_at, results))
            for group in groups]
        for w in workers:
            w.start()
        for _ in workers:
            if not ready.acquire(timeout=120):
                raise SystemExit("a client process did not connect within 120 s")
        start = start_at.value = time.monotonic()  # one clock in every process (Linux)
        cpu0, ticks0 = self.server.cpu(), cpu_ticks()
        pg0 = cpu_seconds(self.pg_pid) if self.pg_pid else 0.0
        go.set()
        out: list[tuple[list[float], list[str], list[str], float]] = []
        for _ in workers:
            out.extend(results.get(timeout=900))
        cpu, steal = self.server.cpu() - cpu0, steal_percent(ticks0, cpu_ticks())
        pg_cpu = cpu_seconds(self.pg_pid) - pg0 if self.pg_pid else float("nan")
        for w in workers:
            w.join()
        end = max(finished for *_, finished in out)
        lat = sorted(x for each in out for x in each[0])
        ids = [i for each in out for i in each[1]]
        errors = [e for each in out for e in each[2]]
        elapsed = max(1e-9, end - start)
        ops = len(lat)
        return {"ops": ops, "rate": ops / elapsed, "elapsed": elapsed, "ids": ids,
                "errors": errors, "p50": _pct(lat, 0.5), "p99": _pct(lat, 0.99),
                "cpu_ms": 1000 * cpu / ops if ops else float("nan"),
                "pg_cpu_ms": 1000 * pg_cpu / ops if ops else float("nan"),
                "cores": cpu / elapsed, "load": load_average(), "steal": steal}

    def creates(self, clients: int, *, seconds: float | None = None, count: int = 0
                ) -> dict[str, Any]:
        if seconds is not None:
            jobs: list[dict[str, Any]] = [{"pool": self.pool} for _ in range(clients)]
            return self.phase(jobs, seconds)
        jobs = [{"pool": self.pool, "count": count // clients + (i < count % clients)}
                for i in range(clients)]
        return self.phase(jobs)

    def floor(self, clients: int, seconds: float) -> dict[str, Any]:
        """``system.whoami`` over the same clients, connections and tokens: the cheapest
        authenticated call through the same TLS, HTTP, JSON-RPC and thread hand-off, which no
        create can beat (it reads no store and writes nothing)."""
        return self.phase([{"pool": self.pool, "method": "system.whoami"}
                           for _ in range(clients)], seconds)

    def releases(self, clients: int, ids: list[str]) -> dict[str, Any]:
        jobs = [{"pool": self.pool, "release": ids[i::clients]} for i in range(clients)]
        return self.phase(jobs)

    def show(self, backend: str, what: str, clients: int, r: dict[str, Any]) -> None:
        share = 100 * r["rate"] / self.ceiling if self.ceiling else float("nan")
        line = (f"  {backend:<10} {what:<22} {clients:>2} clients: {r['rate']:7.1f}/s "
                f"({share:4.1f} % of the ceiling)  p50 {1000 * r['p50']:7.1f} ms  "
                f"p99 {1000 * r['p99']:7.1f} ms  server CPU {r['cpu_ms']:5.2f} ms/op "
                f"({r['cores']:.2f} cores)"
                + (f" + PostgreSQL {r['pg_cpu_ms']:5.2f}" if self.pg_pid else "")
                + f"  load {r['load']}  steal {r['steal']:.0f} %")
        if r["errors"]:
            line += f"\n    {len(r['errors'])} errors, first: {r['errors'][0]}"
        print(line, flush=True)


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    return values[min(len(values) - 1, int(len(values) * q))] if q != 0.5 \
        else statistics.median(values)


# ----------------------------------------------------------------------- store set-up

def _ceiling(backend: str, pg_url: str | None, seconds: float) -> float:
    """Single-aggregate saves per second, one thread, in a fresh store of ``backend``."""
    from better_compute.api.store.store import StoreConfig, open_store, setup_lock
    from better_compute.benchmarks.harness import drop_schema as _drop
    from better_compute.benchmarks.harness import store_env as _store_env
    from better_compute.domain.ids import new_uuid
    from better_compute.domain.site import Site

    with tempfile.TemporaryDirectory() as tmp:
        env = _store_env(backend, pg_url, Path(tmp))
        config = StoreConfig.from_env(env)
        with setup_lock(config):
            store = open_store(config)
        try:
            saves = 0
            stop = time.perf_counter() + seconds
            started = time.perf_counter()
            while time.perf_counter() < stop:
                store.save(Site.with_id(new_uuid(), tenant_id="root", kind="shared",
                                        region="eu-1", name=f"s{saves}", key=None,
                                        fingerprint=None), actor="local")
                saves += 1
            return saves / (time.perf_counter() - started)
        finally:
            store.close()
            _drop(env)


def _set_up(env: dict[str, str], nodes: int, clients: int, quota: int = 0
            ) -> tuple[list[str], str, str]:
    """An initialized store with a pool of ``nodes``; (an admin token per client, the serving
    CA, the pool's id). The tokens are root's; with ``quota``, of a tenant ``bench`` offered
    the pool with that many GPUs (every create then also takes from its quota use)."""
    from better_compute.api import pki
    from better_compute.api.runtime import Runtime
    from better_compute.benchmarks.fleet import add_nodes, make_pool
    from better_compute.domain.access import LOCAL_OPERATOR

    data = Path(env["BETTER_COMPUTE_DATA_DIR"])
    key = pki.new_master_key()
    fd = os.open(data / "master.key", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(key)
    runtime = Runtime.open(env)
    try:
        bundle = pki.generate_bundle()
        public = pki.public_parts(bundle)
        runtime.service.initialize(public, pki.seal_bundle(bundle, pki.parse_master_key(key)))
        pool = make_pool(runtime.service, key="bench-http")
        add_nodes(runtime.service, pool, nodes)
        tenant = None
        if quota:
            tenant = "bench"
            runtime.service.tenants_create(LOCAL_OPERATOR, tenant, None)
            runtime.service.pools_offer(LOCAL_OPERATOR, pool, tenant, {"gpu": quota})
        tokens = [runtime.service.tokens_create(LOCAL_OPERATOR, tenant, "admin", f"bench-{i}")
                  ["token"] for i in range(clients)]
        runtime.projections.catch_up()
        # The earliest-start index of every new node, computed once (a server's first
        # dispatcher pass would, in the middle of the first phase measured).
        runtime.projections.settle("free_gpus")
    finally:
        runtime.close()
    return tokens, public["servingCaCertificate"], pool


def run_backend(backend: str, args: argparse.Namespace) -> None:
    from better_compute.benchmarks.harness import drop_schema as _drop
    from better_compute.benchmarks.harness import store_env as _store_env

    print(f"{backend}: load average {load_average()} at the start", flush=True)
    ceiling = _ceiling(backend, args.pg_url, args.ceiling_seconds)
    print(f"  {backend:<10} store ceiling (single-aggregate saves, 1 thread): {ceiling:7.1f}/s  "
          f"load {load_average()}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        env = _store_env(backend, args.pg_url, Path(tmp))
        try:
            started = time.perf_counter()
            most = max([args.live_clients, *(int(c) for c in args.clients.split(",") if c)])
            tokens, ca_pem, pool = _set_up(env, args.nodes, most, args.quota)
            print(f"  {backend:<10} pool of {args.nodes} nodes x 8 GPUs set up in "
                  f"{time.perf_counter() - started:.1f}s", flush=True)
            extra = ["--workers", str(args.workers)] if args.workers else []
            server = Server(env, extra, args.code)
            print(f"  {backend:<10} serve pid {server.process.pid}", flush=True)
            try:
                bench = Bench(server, tokens, ca_pem, pool, args.client_procs, ceiling,
                              _pg_pid(backend, args))
                _phases(bench, backend, args)
            finally:
                server.close()
        finally:
            _drop(env)


def _pg_pid(backend: str, args: argparse.Namespace) -> int | None:
    """The local PostgreSQL server's process, for its CPU beside the server's."""
    from better_compute.benchmarks.harness import postgres_pid

    return postgres_pid(args.pg_url) if backend == "postgres" and args.pg_url else None


def _statement_calls(pg_url: str) -> dict[str, int] | None:
    """pg_stat_statements' calls by statement, or None without the extension loaded."""
    import psycopg

    with psycopg.connect(pg_url.partition("?")[0], autocommit=True) as conn:
        try:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            rows = conn.execute("SELECT query, calls FROM pg_stat_statements "
                                "WHERE dbid = (SELECT oid FROM pg_database "
                                "WHERE datname = current_database())").fetchall()
        except psycopg.Error:
            return None
    out: dict[str, int] = {}
    for query, calls in rows:
        key = " ".join(str(query).split())[:90]
        out[key] = out.get(key, 0) + int(calls)
    return out


def _count_statements(bench: Bench, backend: str, args: argparse.Namespace) -> None:
    """SQL statements per create and per release (PostgreSQL, pg_stat_statements): every
    statement of the server's processes, the controllers' passes included."""
    for what in ("create", "release"):
        before = _statement_calls(args.pg_url)
        if before is None:
            print("  (pg_stat_statements is not loaded: start PostgreSQL with "
                  "shared_preload_libraries=pg_stat_statements to count statements)")
            return
        if what == "create":
            r = bench.creates(1, count=args.statements)
            made = r["ids"]
        else:
            r = bench.releases(1, made)
        time.sleep(1.5)  # the controllers' passes woken by the last ones (settle, tick)
        after = _statement_calls(args.pg_url) or {}
        delta = {k: v - before.get(k, 0) for k, v in after.items() if v > before.get(k, 0)}
        total = sum(delta.values())
        print(f"  {backend:<10} SQL statements per {what}: {total / max(1, r['ops']):.1f} "
              f"({r['ops']} {what}s, 1 client)", flush=True)
        for query, calls in sorted(delta.items(), key=lambda kv: -kv[1])[:40]:
            if calls / max(1, r["ops"]) < 0.05:
                break
            print(f"      {calls / max(1, r['ops']):6.2f}  {query}")


def _warm_up(bench: Bench, backend: str) -> None:
    """One create and its release, unmeasured (a server whose read models are of another
    version rebuilds them at its first create), then the server's CPU while idle."""
    made = bench.creates(1, count=1)
    bench.releases(1, made["ids"])
    time.sleep(1.5)  # the controllers' passes the warm-up woke (settle, tick)
    # A server of another version may rebuild read models in its controllers' passes: the
    # phases start once it has used under a tenth of a core for a second (2 minutes at most).
    give_up = time.monotonic() + 120
    while time.monotonic() < give_up:
        cpu0, started = bench.server.cpu(), time.monotonic()
        time.sleep(1.0)
        if (bench.server.cpu() - cpu0) / (time.monotonic() - started) < 0.1:
            break
    cpu0, started = bench.server.cpu(), time.monotonic()
    time.sleep(3.0)
    idle = (bench.server.cpu() - cpu0) / (time.monotonic() - started)
    print(f"  {backend:<10} server idle: {100 * idle:.1f} % of a core  load {load_average()}",
          flush=True)


def _phases(bench: Bench, backend: str, args: argparse.Namespace) -> None:
    _warm_up(bench, backend)
    if args.statements and backend == "postgres":
        _count_statements(bench, backend, args)
    for clients in [int(c) for c in args.clients.split(",") if c]:
        made = bench.creates(clients, seconds=args.seconds)
        bench.show(backend, "create", clients, made)
        gone = bench.releases(clients, made["ids"])
        bench.show(backend, "release", clients, gone)
        if args.floor:
            floor = bench.floor(clients, args.seconds)
            bench.show(backend, "whoami (the floor)", clients, floor)
            print(f"  {backend:<10} {'':<22} {clients:>2} clients: creates at "
                  f"{100 * made['rate'] / floor['rate']:.1f} % of the floor's rate, "
                  f"{made['cpu_ms'] / floor['cpu_ms']:.1f} times its server CPU per call",
                  flush=True)
    if args.live <= 0:
        return
    c, repeats = args.live_clients, max(1, args.live_repeats)
    first, firsts = _windows(bench, backend, args, repeats, f"first {args.window}")
    fill = bench.creates(c, count=max(0, args.live - args.window))
    bench.show(backend, f"create, to {args.live} live", c, fill)
    last, afters = _windows(bench, backend, args, repeats, f"after {args.live}")
    rates = [statistics.median(r["rate"] for r in each) for each in (firsts, afters)]
    cpus = [statistics.median(r["cpu_ms"] for r in each) for each in (firsts, afters)]
    change = 100 * (rates[1] / rates[0] - 1) if rates[0] else float("nan")
    print(f"  {backend:<10} rate after {args.live} live vs the first {args.window} (medians of "
          f"{repeats} windows): {rates[0]:.1f} -> {rates[1]:.1f}/s, {change:+.1f} %; server CPU "
          f"{cpus[0]:.2f} -> {cpus[1]:.2f} ms/op; slowest window {min(r['rate'] for r in firsts):.1f}"
          f" and {min(r['rate'] for r in afters):.1f}/s", flush=True)
    gone = bench.releases(c, first["ids"] + fill["ids"] + last["ids"])
    bench.show(backend, f"release, {args.live + args.window} live", c, gone)


def _windows(bench: Bench, backend: str, args: argparse.Namespace, repeats: int, what: str
             ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """``repeats`` windows of ``--window`` creates, each but the last released before the
    next, so that each starts with the same reservations live: (the last, all of them). One
    window is about a second: the median of several is not one controllers' pass or one
    checkpoint that happened to fall into it."""
    c, out = args.live_clients, []
    for n in range(repeats):
        made = bench.creates(c, count=args.window)
        bench.show(backend, f"create, {what} ({n + 1})" if repeats > 1 else f"create, {what}",
                   c, made)
        out.append(made)
        if n < repeats - 1:
            bench.releases(c, made["ids"])
    return out[-1], out


def _peer_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--peer", choices=["slurm"], help="alternate round by round with "
                        "Slurm's scontrol create reservation in the same window "
                        "(benchmarks/slurm_peer.py)")
    parser.add_argument("--slurm-nodes", type=int, default=1000)
    parser.add_argument("--slurm-client", choices=["session", "exec"], default="session",
                        help="one kept scontrol per client reading stdin (default), or one "
                        "scontrol per command")
    parser.add_argument("--slurm-reserve", default="corecnt=1", help="what one Slurm "
                        "reservation takes (default: one core of one node)")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--placer" in argv:
        from better_compute.benchmarks import placer

        argv.remove("--placer")
        return placer.main(argv)
    parser = argparse.ArgumentParser(prog="python -m better_compute.benchmarks.reservations",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", choices=["sqlite", "postgres", "both"], default="both")
    parser.add_argument("--pg-url", default=os.environ.get("BC_TEST_PG_URL"))
    parser.add_argument("--clients", default="1,8,16,32")
    parser.add_argument("--nodes", type=int, default=2200)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--live", type=int, default=2000)
    parser.add_argument("--window", type=int, default=100)
    parser.add_argument("--live-clients", type=int, default=16)
    parser.add_argument("--live-repeats", type=int, default=3,
                        help="windows of --window creates at each end (their median)")
    parser.add_argument("--workers", type=int, default=0,
                        help="passed to serve as --workers (default: serve's own, the core count; "
                        "--compare: 1 on both sides unless given)")
    parser.add_argument("--client-procs", type=int, default=4)
    parser.add_argument("--no-floor", dest="floor", action="store_false", help="skip the "
                        "floor: system.whoami over the same clients after each client count")
    parser.add_argument("--quota", type=int, default=0, help="reserve as a tenant offered the "
                        "pool with a quota of this many GPUs, not as its owner (default: the "
                        "owner, no quota)")
    parser.add_argument("--statements", type=int, default=0, help="on PostgreSQL, first "
                        "count the SQL statements of this many creates and their releases "
                        "(pg_stat_statements)")
    parser.add_argument("--code", help="serve another checkout's code (say, the commit before "
                        "a change: git archive COMMIT | tar -x -C DIR); set-up uses ours")
    parser.add_argument("--compare", metavar="DIR", help="serve DIR's code and ours side by "
                        "side, each on its own store, alternating round by round (ABBA): "
                        "medians and the ratio of the server CPU per op (no ceiling, no live "
                        "phase, no statement count)")
    parser.add_argument("--rounds", type=int, default=4, help="rounds per phase with --compare "
                        "or --peer")
    _peer_arguments(parser)
    parser.add_argument("--ceiling-seconds", type=float, default=3.0)
    args = parser.parse_args(argv)
    backends = ["sqlite", "postgres"] if args.backend == "both" else [args.backend]
    for backend in backends:
        if args.peer:
            from better_compute.benchmarks.slurm_peer import compare_with_slurm

            compare_with_slurm(backend, args)
        elif args.compare:
            from better_compute.benchmarks.reservations_compare import compare

            compare(backend, args)
        else:
            run_backend(backend, args)
        print(f"{backend}: load average {load_average()} at the end", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
