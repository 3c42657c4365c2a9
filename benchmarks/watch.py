"""Benchmark of the event log: /watch delivery, commit-to-delivery latency, projection rebuild.

    .venv/bin/python -m better_compute.benchmarks.watch [--backend sqlite|postgres|both]
        [--pg-url postgresql://…] [--watchers 1,10,100] [--rate 200] [--seconds 5]

For each backend it makes a fresh store, starts a real ``better-compute serve``
(plain HTTP on loopback: the figures are the server's, not TLS's), and:

1. live: commits ``--rate`` events/s through the server's JSON-RPC
   (``sites.create``, one event per commit) for ``--seconds`` while N watchers
   follow; latency is a watcher's receive time minus the event's ``time``
   (stamped just before the commit, so it includes the commit itself);
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
import platform
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

CLI = str(Path(sys.executable).parent / "better-compute")


# ------------------------------------------------------------------ the machine

def machine() -> dict[str, str]:
    cpu = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory = "unknown"
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                memory = f"{int(line.split()[1]) / 1024 / 1024:.1f} GiB"
    except OSError:
        pass
    from importlib.metadata import version

    return {"cpu": cpu, "cores": str(os.cpu_count()), "memory": memory,
            "python": platform.python_version(), "sqlite": sqlite3.sqlite_version,
            "eventsourcing": version("eventsourcing"), "os": platform.platform()}


def pg_version(url: str) -> str:
    import psycopg

    with psycopg.connect(url.partition("?")[0]) as conn:
        row = conn.execute("SHOW server_version").fetchone()
    return str(row[0]) if row else "unknown"


# ---------------------------------------------------------------- percentiles

def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# -------------------------------------------------------------- watcher process

async def _follow(url: str, token: str, since: int | None, want: int | None,
                  ready: asyncio.Event, stop: asyncio.Event, out: dict[str, Any]) -> None:
    """One raw HTTP/1.1 stream, parsed as little as possible so the reader stays cheap.

    The server sends whole lines per chunk, so splitting on newlines and keeping
    the lines that start with ``{`` skips the chunk framing.
    """
    from urllib.parse import urlparse

    parsed = urlparse(url)
    reader, writer = await asyncio.open_connection(parsed.hostname, parsed.port)
    query = "" if since is None else f"?since={since}"
    writer.write((f"GET {parsed.path}{query} HTTP/1.1\r\nHost: {parsed.netloc}\r\n"
                  f"Authorization: Bearer {token}\r\n\r\n").encode())
    await writer.drain()
    latencies: list[float] = out.setdefault("latencies", [])
    out.setdefault("count", 0)
    buffer = b""
    marker = b'"time":"'
    try:
        while not stop.is_set():
            data = await reader.read(1 << 16)
            if not data:
                break
            now = time.time()
            buffer += data
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                if line.startswith(b'{"heartbeat"'):
                    ready.set()
                elif line.startswith(b'{"sequence"'):
                    out["count"] += 1
                    if want is None:
                        at = line.index(marker) + len(marker)
                        stamp = line[at:line.index(b'"', at)].decode()
                        latencies.append(now - datetime.fromisoformat(stamp).timestamp())
            if want is not None and out["count"] >= want:
                break
    finally:
        writer.close()


async def _watchers_main(args: argparse.Namespace) -> None:
    url = f"{args.url}/api/compute/events/watch"
    stop = asyncio.Event()
    readies = [asyncio.Event() for _ in range(args.n)]
    outs: list[dict[str, Any]] = [{} for _ in range(args.n)]
    want = args.want if args.want > 0 else None
    tasks = [asyncio.create_task(_follow(url, args.token, args.since, want, readies[i], stop,
                                         outs[i]))
             for i in range(args.n)]
    started = time.perf_counter()
    if want is None:
        await asyncio.gather(*(r.wait() for r in readies))
        print("ready", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        stop.set()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    else:
        await asyncio.gather(*tasks)
    elapsed = time.perf_counter() - started
    latencies = [x for o in outs for x in o.get("latencies", [])]
    print(json.dumps({"elapsed": elapsed, "counts": [o.get("count", 0) for o in outs],
                      "p50": pct(latencies, 0.50), "p99": pct(latencies, 0.99),
                      "max": max(latencies) if latencies else float("nan")}), flush=True)


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
            self.env["BETTER_COMPUTE_DATABASE_URL"] = f"{pg_url}?schema={self.schema}"
        self.pg_url = pg_url

    def runtime(self) -> Any:
        from better_compute.api.runtime import Runtime

        return Runtime.open(self.env)

    def init(self) -> str:
        from better_compute.api import pki

        runtime = self.runtime()
        try:
            key = pki.new_master_key()
            key_file = Path(self.env["BETTER_COMPUTE_DATA_DIR"]) / "master.key"
            key_file.parent.mkdir(parents=True, exist_ok=True)
            key_file.write_text(key)
            bundle = pki.generate_bundle()
            return str(runtime.service.initialize(
                pki.public_parts(bundle), pki.seal_bundle(bundle, pki.parse_master_key(key))))
        finally:
            runtime.close()

    def serve(self, port: int) -> subprocess.Popen[str]:
        process = subprocess.Popen(
            [CLI, "serve", "--listen", f"127.0.0.1:{port}", "--insecure-loopback"],
            env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
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

    def live(self, url: str, token: str, n: int) -> dict[str, Any]:

        watchers = self.watchers(url, token, n)
        assert watchers.stdout is not None and watchers.stdin is not None
        if watchers.stdout.readline().strip() != "ready":
            raise SystemExit("the watchers did not start")
        rate, seconds = self.args.rate, self.args.seconds
        total = int(rate * seconds)
        achieved = self._write_at_rate(url, token, total, rate)
        time.sleep(1.0)  # the last events reach every watcher
        watchers.stdin.write("stop\n")
        watchers.stdin.flush()
        result = json.loads(watchers.stdout.readline())
        watchers.wait(timeout=60)
        delivered = sum(result["counts"])
        return {"watchers": n, "committed_per_s": round(achieved), "events": total,
                "delivered": delivered, "missing": total * n - delivered,
                "delivered_per_s": round(delivered / seconds),
                "p50_ms": round(result["p50"] * 1000, 2), "p99_ms": round(result["p99"] * 1000, 2),
                "max_ms": round(result["max"] * 1000, 2)}

    def _write_at_rate(self, url: str, token: str, total: int, rate: float) -> float:
        """``total`` sites.create calls, the i-th due at start + i/rate, from 4 writer threads."""
        import threading

        import httpx

        start = time.perf_counter() + 0.05
        counter = iter(range(total))
        lock = threading.Lock()
        failures: list[str] = []

        def writer() -> None:
            with httpx.Client(base_url=url, headers={"authorization": f"Bearer {token}"}) as http:
                while True:
                    with lock:
                        i = next(counter, None)
                    if i is None:
                        return
                    delay = start + i / rate - time.perf_counter()
                    if delay > 0:
                        time.sleep(delay)
                    answer = http.post("/api/compute/rpc", json={
                        "jsonrpc": "2.0", "id": i, "method": "sites.create",
                        "params": {"kind": "shared", "region": "eu-1"}}).json()
                    if "error" in answer:
                        failures.append(str(answer["error"]))

        threads = [threading.Thread(target=writer) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if failures:
            raise SystemExit(f"{len(failures)} writes failed, e.g. {failures[0]}")
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
                    runtime.store.save(*batch)
                    batch = []
            if batch:
                runtime.store.save(*batch)
            return count / (time.perf_counter() - started)
        finally:
            runtime.close()

    def store_reads(self) -> dict[str, int]:
        from better_compute.api.eventlog import render

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
        report: dict[str, Any] = {"backend": self.backend}
        try:
            report["live"] = [self.live(url, token, n) for n in self.args.watchers]
            report["backlog_written_per_s"] = round(self.backlog(self.args.backlog))
            report["catch_up"] = [self.catch_up(url, token, n, self.args.backlog)
                                  for n in self.args.watchers]
        finally:
            server.terminate()
            server.wait(timeout=60)
        report["store"] = self.store_reads()
        return report


def _print(report: dict[str, Any]) -> None:
    print(f"\n== {report['backend']}")
    print(f"live: {report['live'][0]['events']} events committed through JSON-RPC at the rate "
          "below while N watchers follow")
    print("  watchers  committed/s  delivered/s  missing  p50 ms  p99 ms  max ms")
    for r in report["live"]:
        print(f"  {r['watchers']:>8}  {r['committed_per_s']:>11}  {r['delivered_per_s']:>11}  "
              f"{r['missing']:>7}  {r['p50_ms']:>6}  {r['p99_ms']:>6}  {r['max_ms']:>6}")
    print(f"catch-up (backlog written at {report['backlog_written_per_s']} events/s):")
    print("  watchers  events each  delivered/s (all watchers)")
    for r in report["catch_up"]:
        print(f"  {r['watchers']:>8}  {r['per_watcher']:>11}  {r['delivered_per_s']:>11}")
    s = report["store"]
    print(f"store ({s['events']} events): raw reads {s['raw_read_per_s']}/s, rendered reads "
          f"{s['rendered_read_per_s']}/s, listings rebuild {s['listings_rebuild_per_s']}/s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m better_compute.benchmarks.watch",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", choices=["sqlite", "postgres", "both"], default="both")
    parser.add_argument("--pg-url", default=os.environ.get("BC_TEST_PG_URL"),
                        help="a PostgreSQL server to use (a throwaway schema is made and dropped)")
    parser.add_argument("--watchers", default="1,10,100")
    parser.add_argument("--rate", type=float, default=200.0, help="events committed per second")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--backlog", type=int, default=50_000)
    parser.add_argument("--catchup-total", type=int, default=200_000,
                        help="events read in all, across watchers, per catch-up run")
    parser.add_argument("--json", action="store_true", help="print the report as JSON too")
    parser.add_argument("--_watchers", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--token", help=argparse.SUPPRESS)
    parser.add_argument("--n", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--since", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--want", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args._watchers:
        asyncio.run(_watchers_main(args))
        return 0
    args.watchers = [int(x) for x in args.watchers.split(",") if x]
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
