"""Benchmark of the event log: /watch delivery, commit-to-delivery latency, projection rebuild.

    .venv/bin/python -m better_compute.benchmarks.watch [--backend sqlite|postgres|both]
        [--pg-url postgresql://…] [--watchers 1,10,100] [--rate 200] [--seconds 5]
        [--writers 16] [--writer rpc|store] [--phases live,catchup,store] [--warmup 0]
        [--server-env NAME=VALUE]

For each backend it makes a fresh store, starts a real ``better-compute serve``
(plain HTTP on loopback: the figures are the server's, not TLS's), and:

1. live: commits ``--rate`` events/s through the server's JSON-RPC
   (``sites.create``, one event per commit, from ``--writers`` client threads:
   many clients, as in a real fleet, so that a slow answer to one does not
   hold back the schedule) for ``--seconds`` while N watchers follow, after
   ``--warmup`` unmeasured writes that warm a fresh server up; latency
   is a watcher's receive time minus the event's ``time`` (stamped just
   before the commit, so it includes the commit itself);
2. catch-up: N watchers each read a backlog from the store at once
   (events delivered per second, all watchers together);
3. the store itself: raw notification reads, reads rendered as public
   events, and a rebuild of the listings projection, in events per second.

The watchers run in a separate process (asyncio, raw HTTP/1.1 reads), so
their own work does not delay the writer. Every phase is bounded in time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from better_compute.benchmarks.harness import (
    cpu_seconds,
    initialized,
    load_average,
    machine,
    pg_version,
)
from better_compute.benchmarks.watch_traffic import (
    paced_writes,
    pct,
    rpc_writer,
    store_writer,
    watchers_main,
)

CLI = str(Path(sys.executable).parent / "better-compute")


# ---------------------------------------------------------------- the scenario

class Bench:
    def __init__(self, backend: str, pg_url: str | None, args: argparse.Namespace) -> None:
        self.backend = backend
        self.args = args
        self.tmp = Path(tempfile.mkdtemp(prefix=f"bc-bench-{backend}-"))
        self.env: dict[str, str] = {"BETTER_COMPUTE_DATA_DIR": str(self.tmp / "data"),
                                    "PATH": os.environ.get("PATH", "")}
        self.schema = None
        if backend == "postgres":
            assert pg_url
            self.schema = "bench_" + uuid.uuid4().hex[:12]
            from better_compute.api.store.store_url import with_schema

            self.env["BETTER_COMPUTE_DATABASE_URL"] = with_schema(pg_url, self.schema)
        self.pg_url = pg_url
        self.server_env = dict(item.split("=", 1) for item in args.server_env)

    def runtime(self) -> Any:
        from better_compute.api.runtime import Runtime

        return Runtime.open(self.env)

    def init(self) -> str:
        ready = initialized(self.env)
        ready.runtime.close()
        return ready.token

    def serve(self, port: int) -> subprocess.Popen[str]:
        profile = ([sys.executable, "-m", "cProfile", "-o", self.args.profile_server]
                   if self.args.profile_server else [])
        process = subprocess.Popen(
            [*profile, CLI, "serve", "--listen", f"127.0.0.1:{port}", "--insecure-loopback"],
            env={**self.env, **self.server_env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert process.stdout is not None
        line = process.stdout.readline()
        if "serving" not in line:
            raise SystemExit(f"serve did not start: {line}{process.stderr.read() if process.stderr else ''}")
        return process

    def watchers(self, url: str, token: str, n: int, *, since: int | None = None,
                 want: int = 0) -> subprocess.Popen[str]:
        argv = [sys.executable, "-m", "better_compute.benchmarks.watch", "--_watchers",
                "--url", url, "--token", token, "--n", str(n), "--want", str(want)]
        if since is not None:
            argv += ["--since", str(since)]
        return subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def live(self, url: str, token: str, n: int, server_pid: int) -> dict[str, Any]:

        watchers = self.watchers(url, token, n)
        assert watchers.stdout is not None and watchers.stdin is not None
        ready, _, watchers_cpu_before = watchers.stdout.readline().partition(" ")
        if ready != "ready":
            raise SystemExit("the watchers did not start")
        rate, seconds = self.args.rate, self.args.seconds
        total = int(rate * seconds)
        cpu_before, started = cpu_seconds(server_pid), time.perf_counter()
        writer_before = time.process_time()
        achieved = self._write_at_rate(url, token, total, rate)
        writer_cpu = time.process_time() - writer_before
        time.sleep(1.0)  # the last events reach every watcher
        wall = time.perf_counter() - started
        server_cpu = (cpu_seconds(server_pid) - cpu_before) / wall
        watchers.stdin.write("stop\n")
        watchers.stdin.flush()
        result = json.loads(watchers.stdout.readline())
        watchers.wait(timeout=60)
        delivered = sum(result["counts"])
        watchers_cpu = (result["cpu"] - float(watchers_cpu_before)) / wall
        return {"watchers": n, "committed_per_s": round(achieved), "events": total,
                "delivered": delivered, "missing": total * n - delivered,
                "delivered_per_s": round(delivered / seconds),
                "p50_ms": round(result["p50"] * 1000, 2), "p99_ms": round(result["p99"] * 1000, 2),
                "max_ms": round(result["max"] * 1000, 2), "server_cpu": round(server_cpu * 100),
                "watchers_cpu": round(watchers_cpu * 100), "writer_cpu": round(writer_cpu / wall * 100),
                "rpc_p50_ms": round(pct(self.rpc_times, 0.5) * 1000, 2),
                "rpc_p99_ms": round(pct(self.rpc_times, 0.99) * 1000, 2)}

    def _write_at_rate(self, url: str, token: str, total: int, rate: float) -> float:
        """``total`` writes of one event each, the i-th due at start + i/rate, from the writer
        threads: ``sites.create`` through the server (``--writer rpc``), or saves straight
        into the store from this process (``--writer store``: another replica's writes)."""
        runtime = self.runtime() if self.args.writer == "store" else None
        try:
            start, calls, failures = paced_writes(
                lambda: (store_writer(runtime) if runtime is not None
                         else rpc_writer(url, token)), total, rate, self.args.writers)
        finally:
            if runtime is not None:
                runtime.close()
        if failures:
            raise SystemExit(f"{len(failures)} writes failed, e.g. {failures[0]}")
        self.rpc_times = calls
        return total / (time.perf_counter() - start)

    def catch_up(self, url: str, token: str, n: int, backlog: int) -> dict[str, Any]:
        runtime = self.runtime()
        try:
            ids = runtime.store.recorder.select_notifications(start=0, limit=10**9)
            per = min(backlog, max(2000, self.args.catchup_total // n))
            # The oldest events of the backlog: older than the server's window, read
            # from the store as a watcher far behind does.
            since = ids[len(ids) - backlog - 1].id if len(ids) > backlog else 0
        finally:
            runtime.close()
        watchers = self.watchers(url, token, n, since=since, want=per)
        assert watchers.stdout is not None
        result = json.loads(watchers.stdout.readline())
        watchers.wait(timeout=120)
        delivered = sum(result["counts"])
        return {"watchers": n, "per_watcher": per, "delivered": delivered,
                "delivered_per_s": round(delivered / result["elapsed"])}

    def backlog(self, count: int) -> float:
        from better_compute.domain.site import Site

        runtime = self.runtime()
        try:
            started = time.perf_counter()
            batch: list[Any] = []
            for i in range(count):
                batch.append(Site(tenant_id="root", kind="shared", region="eu-2", name=f"b{i}",
                                  key=None, fingerprint="-"))
                if len(batch) == 100:
                    runtime.store.save(*batch, actor="local")
                    batch = []
            if batch:
                runtime.store.save(*batch, actor="local")
            return count / (time.perf_counter() - started)
        finally:
            runtime.close()

    def store_reads(self) -> dict[str, int]:
        from better_compute.api.store.eventlog import render

        runtime = self.runtime()
        try:
            recorder = runtime.store.recorder
            started, count, after = time.perf_counter(), 0, 0
            while page := recorder.select_notifications(start=after, limit=500,
                                                        inclusive_of_start=False):
                count += len(page)
                after = page[-1].id
            raw = count / (time.perf_counter() - started)
            started, count, after = time.perf_counter(), 0, 0
            while page := recorder.select_notifications(start=after, limit=500,
                                                        inclusive_of_start=False):
                for notification in page:
                    render(notification)
                count += len(page)
                after = page[-1].id
            rendered = count / (time.perf_counter() - started)
            started = time.perf_counter()
            applied = runtime.projections.rebuild("listings")
            rebuild = applied / (time.perf_counter() - started)
            return {"events": count, "raw_read_per_s": round(raw),
                    "rendered_read_per_s": round(rendered),
                    "listings_rebuild_per_s": round(rebuild)}
        finally:
            runtime.close()

    def drop(self) -> None:
        import shutil

        shutil.rmtree(self.tmp, ignore_errors=True)
        if self.schema and self.pg_url:
            import psycopg

            with psycopg.connect(self.pg_url.partition("?")[0], autocommit=True) as conn:
                conn.execute(f'DROP SCHEMA IF EXISTS "{self.schema}" CASCADE')

    def run(self) -> dict[str, Any]:
        try:
            return self._run()
        finally:
            self.drop()

    def _run(self) -> dict[str, Any]:
        import socket

        token = self.init()
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        server = self.serve(port)
        url = f"http://127.0.0.1:{port}"
        report: dict[str, Any] = {"backend": self.backend, "load_before": load_average(),
                                  "writer": self.args.writer}
        phases = self.args.phases
        try:
            if "live" in phases:
                if self.args.warmup:
                    # Unmeasured: the first writes of a fresh server open the rest of its
                    # connection pool and prepare its statements (a cold start, not fan-out).
                    self._write_at_rate(url, token, self.args.warmup, self.args.rate)
                report["live"] = [self.live(url, token, n, server.pid)
                                  for n in self.args.watchers]
            if "catchup" in phases or "store" in phases:
                report["backlog_written_per_s"] = round(self.backlog(self.args.backlog))
            if "catchup" in phases:
                report["catch_up"] = [self.catch_up(url, token, n, self.args.backlog)
                                      for n in self.args.watchers]
        finally:
            # SIGINT: uvicorn stops cleanly and re-raises it, so cProfile still writes its file.
            server.send_signal(signal.SIGINT)
            server.wait(timeout=60)
        if "store" in phases:
            report["store"] = self.store_reads()
        report["load_after"] = load_average()
        return report


def _print(report: dict[str, Any]) -> None:
    print(f"\n== {report['backend']} (load average before {report['load_before']}, "
          f"after {report['load_after']})")
    if "live" in report:
        via = ("through JSON-RPC" if report["writer"] == "rpc"
               else "into the store by another process")
        print(f"live: {report['live'][0]['events']} events committed {via} at the "
              "rate below while N watchers follow")
        print("  watchers  committed/s  delivered/s  missing  p50 ms  p99 ms  max ms  "
              "CPU % of a core: server watchers writer  write p50/p99 ms")
        for r in report["live"]:
            print(f"  {r['watchers']:>8}  {r['committed_per_s']:>11}  {r['delivered_per_s']:>11}  "
                  f"{r['missing']:>7}  {r['p50_ms']:>6}  {r['p99_ms']:>6}  {r['max_ms']:>6}  "
                  f"{r['server_cpu']:>23} {r['watchers_cpu']:>8} {r['writer_cpu']:>6}  "
                  f"{r['rpc_p50_ms']:>7}/{r['rpc_p99_ms']}")
    if "catch_up" in report:
        print(f"catch-up (backlog written at {report['backlog_written_per_s']} events/s):")
        print("  watchers  events each  delivered/s (all watchers)")
        for r in report["catch_up"]:
            print(f"  {r['watchers']:>8}  {r['per_watcher']:>11}  {r['delivered_per_s']:>11}")
    if "store" in report:
        s = report["store"]
        print(f"store ({s['events']} events): raw reads {s['raw_read_per_s']}/s, rendered reads "
              f"{s['rendered_read_per_s']}/s, listings rebuild {s['listings_rebuild_per_s']}/s")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m better_compute.benchmarks.watch",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", choices=["sqlite", "postgres", "both"], default="both")
    parser.add_argument("--pg-url", default=os.environ.get("BC_TEST_PG_URL"),
                        help="a PostgreSQL server to use (a throwaway schema is made and dropped)")
    parser.add_argument("--watchers", default="1,10,100")
    parser.add_argument("--rate", type=float, default=200.0, help="events committed per second")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--writers", type=int, default=16,
                        help="client threads committing the live events")
    parser.add_argument("--writer", choices=["rpc", "store"], default="rpc",
                        help="live events through the server's JSON-RPC, or saved into the "
                             "store by this process (the server learns of them as of another "
                             "replica's writes)")
    parser.add_argument("--phases", default="live,catchup,store",
                        help="which of live, catchup, store to run")
    parser.add_argument("--backlog", type=int, default=50_000)
    parser.add_argument("--catchup-total", type=int, default=200_000,
                        help="events read in all, across watchers, per catch-up run")
    parser.add_argument("--json", action="store_true", help="print the report as JSON too")
    parser.add_argument("--profile-server", metavar="FILE",
                        help="run the server under cProfile, writing its statistics to FILE")
    parser.add_argument("--warmup", type=int, default=0,
                        help="events written (unmeasured, no watchers) before the live phases")
    parser.add_argument("--server-env", metavar="NAME=VALUE", action="append", default=[],
                        help="an extra environment variable for the server only (repeatable): "
                        "e.g. BETTER_COMPUTE_WATCH_WINDOW=1000")
    parser.add_argument("--_watchers", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--token", help=argparse.SUPPRESS)
    parser.add_argument("--n", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--since", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--want", type=int, default=0, help=argparse.SUPPRESS)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args._watchers:
        try:
            import uvloop

            uvloop.run(watchers_main(args))
        except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
            asyncio.run(watchers_main(args))
        return 0
    args.watchers = [int(x) for x in args.watchers.split(",") if x]
    args.phases = {p.strip() for p in args.phases.split(",") if p.strip()}
    backends = ["sqlite", "postgres"] if args.backend == "both" else [args.backend]
    if "postgres" in backends and not args.pg_url:
        raise SystemExit("PostgreSQL needs --pg-url (or BC_TEST_PG_URL); or use --backend sqlite")
    info = machine()
    if "postgres" in backends:
        info["postgresql"] = pg_version(args.pg_url)
    print("machine: " + ", ".join(f"{k} {v}" for k, v in info.items()))
    reports = []
    for backend in backends:
        report = Bench(backend, args.pg_url, args).run()
        _print(report)
        reports.append(report)
    if args.json:
        print(json.dumps({"machine": info, "reports": reports}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
