"""/watch beside etcd, in the same window: 100 bare-socket watchers, 200 writes/s.

    .venv/bin/python -m better_compute.benchmarks.watch_etcd [--backend sqlite|postgres|both]
        [--pg-url postgresql://…] [--watchers 100] [--rate 200] [--seconds 5] [--rounds 3]
        [--workers N] [--writers 16] [--compare DIR]

It starts, once for the whole run: a real ``better-compute serve`` (plain HTTP on
loopback, ``--workers N`` when given) on a fresh SQLite store, one on a fresh PostgreSQL
schema (of ``--pg-url``, or of a throwaway cluster that scripts/pg starts, fsync off as
the tests run it), and a throwaway etcd 3.4 (its own temporary data dir, loopback, free
ports; the ``etcd`` on PATH; killed at the end). Then, round after round, it measures
each of them in turn (the order reversed every other round, A/B/C then C/B/A, so all
see the same load): N watchers in a separate process (uvloop, one raw HTTP/1.1 stream
each: better-compute's ``GET /api/compute/events/watch``; etcd's v3 JSON gateway
``POST /v3/watch`` of the ``bench/`` prefix) while ``--writers`` client threads write
``--rate`` times a second for ``--seconds`` (better-compute: a ``sites.create`` through
JSON-RPC, one event per commit; etcd: ``POST /v3/kv/put``), each write stamped with its
client's send time (benchmarks/watch_etcd_traffic.py). Latency is a watcher's receive
time minus that stamp, the same on both sides. Each row: delivery p50/p99/max, the
writes' own p50/p99, events missing, and the load average when the row began; then the
median of every column over the rounds, and p99 as a multiple of etcd's. With
``--compare DIR`` each backend is also served from DIR's code (the commit before a change),
in the same rounds: before and after, measured in the same minutes.

The test suite never needs this; without ``etcd`` on PATH it says how to install it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from better_compute.benchmarks.harness import (
    cpu_seconds,
    drop_schema,
    free_port,
    initialized,
    load_average,
    machine,
    pg_version,
    serving,
    store_env,
)
from better_compute.benchmarks.watch_etcd_traffic import watchers_main, writer
from better_compute.benchmarks.watch_traffic import paced_writes, pct

REPO = Path(__file__).resolve().parents[1]
INSTALL_ETCD = ("etcd is not on PATH: this benchmark runs etcd 3.4 beside better-compute. "
                "Install it (Debian/Ubuntu: apt-get install -y etcd-server etcd-client) "
                "and run it again")


@dataclass
class Target:
    """One system under measurement: where its watchers connect and its writers write."""

    name: str  # SQLite, PostgreSQL, etcd
    kind: str  # bc or etcd
    port: int
    pid: int  # the server's process (its children counted too: --workers)
    token: str = ""
    host: str = "127.0.0.1"


# ---------------------------------------------------------------- the systems

@contextmanager
def postgres_url(given: str | None) -> Iterator[str]:
    """``--pg-url``, or a throwaway cluster (scripts/pg, fsync off) stopped on exit."""
    if given:
        yield given
        return
    pg = REPO / "scripts" / "pg"
    if not pg.exists():
        raise SystemExit("PostgreSQL needs --pg-url (scripts/pg is not beside this checkout)")
    folder = tempfile.mkdtemp(prefix="bc-bench-pg-")
    try:
        url = subprocess.run([str(pg), "start", folder, str(free_port())], check=True,
                             capture_output=True, text=True).stdout.strip()
        yield url
    finally:
        subprocess.run([str(pg), "stop", folder], check=False, capture_output=True)


@contextmanager
def better_compute(backend: str, pg_url: str | None, workers: int,
                   code: Path | None = None) -> Iterator[Target]:
    """``serve`` on a fresh store of ``backend`` (``code``: another checkout's code, say the
    commit before a change; set-up uses ours); the store dropped on exit."""
    from better_compute.benchmarks.rpc_path import _pythonpath

    tmp = Path(tempfile.mkdtemp(prefix=f"bc-bench-{backend}-"))
    env = store_env(backend, pg_url, tmp / "data")
    try:
        ready = initialized(env)
        ready.runtime.close()
        port = free_port()
        extra = ["--insecure-loopback", *(["--workers", str(workers)] if workers else [])]
        if code is not None:
            env["PYTHONPATH"] = _pythonpath(code, tmp / "code")
        name = ("SQLite" if backend == "sqlite" else "PostgreSQL") + (" before" if code else "")
        with serving(env, port, *extra) as server:
            yield Target(name, "bc", port, server.pid, ready.token)
    finally:
        drop_schema(env)
        shutil.rmtree(tmp, ignore_errors=True)


@contextmanager
def etcd() -> Iterator[Target]:
    """A throwaway etcd: its own data dir, loopback, free ports; killed on exit."""
    binary = shutil.which("etcd")
    if binary is None:
        raise SystemExit(INSTALL_ETCD)
    tmp = Path(tempfile.mkdtemp(prefix="bc-bench-etcd-"))
    client, peer = free_port(), free_port()
    client_url, peer_url = f"http://127.0.0.1:{client}", f"http://127.0.0.1:{peer}"
    with open(tmp / "etcd.log", "w") as log:
        process = subprocess.Popen(
            [binary, "--name", "bench", "--data-dir", str(tmp / "data"),
             "--listen-client-urls", client_url, "--advertise-client-urls", client_url,
             "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
             "--initial-cluster", f"bench={peer_url}"], stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"{client_url}/health", timeout=2) as answer:
                    if json.loads(answer.read()).get("health") == "true":
                        break
            except OSError:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("etcd did not start: " + (tmp / "etcd.log").read_text()[-2000:])
            time.sleep(0.1)
        yield Target("etcd", "etcd", client, process.pid)
    finally:
        process.kill()
        process.wait()
        shutil.rmtree(tmp, ignore_errors=True)


# ------------------------------------------------------------- one measurement

def write_at_rate(target: Target, total: int, rate: float, threads: int) -> list[float]:
    """``total`` writes, the i-th due at start + i/rate, from ``threads`` client threads;
    each write's own time, in seconds."""
    _, times, failures = paced_writes(
        lambda: writer(target.kind, target.host, target.port, target.token), total, rate,
        threads)
    if failures:
        raise SystemExit(f"{target.name}: {len(failures)} writes failed, e.g. {failures[0]}")
    return times


def live(target: Target, args: argparse.Namespace) -> dict[str, Any]:
    """One row: ``--watchers`` streams on ``target`` while it takes ``--rate`` writes/s."""
    load = load_average()
    watchers = subprocess.Popen(
        [sys.executable, "-m", "better_compute.benchmarks.watch_etcd", "--_watchers",
         "--kind", target.kind, "--host", target.host, "--port", str(target.port),
         "--token", target.token, "--n", str(args.watchers)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert watchers.stdout is not None and watchers.stdin is not None
    try:
        if watchers.stdout.readline().strip() != "ready":
            raise SystemExit(f"{target.name}: the watchers did not start")
        total = int(args.rate * args.seconds)
        cpu_before, started = cpu_seconds(target.pid), time.perf_counter()
        watchers_before = cpu_seconds(watchers.pid)
        writes = write_at_rate(target, total, args.rate, args.writers)
        rate = total / (time.perf_counter() - started)
        time.sleep(1.0)  # the last events reach every watcher
        wall = time.perf_counter() - started
        server_cpu = (cpu_seconds(target.pid) - cpu_before) / wall
        watchers.stdin.write("stop\n")
        watchers.stdin.flush()
        result = json.loads(watchers.stdout.readline())
    finally:
        watchers.stdin.close()
        watchers.wait(timeout=60)
    delivered = sum(result["counts"])
    return {"target": target.name, "load": load, "watchers": args.watchers,
            "events": total, "rate": rate, "missing": total * args.watchers - delivered,
            "p50_ms": result["p50"] * 1000, "p99_ms": result["p99"] * 1000,
            "max_ms": result["max"] * 1000, "write_p50_ms": pct(writes, 0.5) * 1000,
            "write_p99_ms": pct(writes, 0.99) * 1000, "server_cpu": server_cpu * 100,
            "watchers_cpu": (result["cpu"] - watchers_before) / wall * 100}


# ------------------------------------------------------------------ the report

COLUMNS = ("rate", "p50_ms", "p99_ms", "max_ms", "write_p50_ms", "write_p99_ms", "server_cpu",
           "watchers_cpu")


def _row(label: str, r: dict[str, Any], etcd_p99: float | None) -> str:
    ratio = f"{r['p99_ms'] / etcd_p99:.2f}x" if etcd_p99 else "-"
    return (f"  {label:<6} {r['target']:<17} {r['rate']:>7.0f} {r['p50_ms']:>7.1f} {r['p99_ms']:>7.1f} "
            f"{r['max_ms']:>7.1f} {r['write_p50_ms']:>7.1f} {r['write_p99_ms']:>7.1f} "
            f"{r['missing']:>7} {ratio:>8} {r['server_cpu']:>6.0f} {r['watchers_cpu']:>8.0f}  "
            f"{r['load']}")


HEADER = ("  round  system            writes/s  p50 ms  p99 ms  max ms  write   write   "
          "missing  p99 vs  CPU % of a core  load average\n  " + " " * 57
          + "p50 ms  p99 ms           etcd  server watchers")


def report(rows: list[dict[str, Any]], names: list[str]) -> dict[str, Any]:
    """Print every row, then the medians over the rounds; returns the medians."""
    print(HEADER)
    for row in rows:
        etcd_row = next((r for r in rows if r["round"] == row["round"]
                         and r["target"] == "etcd"), None)
        print(_row(str(row["round"]), row, etcd_row["p99_ms"] if etcd_row else None))
    medians: dict[str, Any] = {}
    for name in names:
        mine = [r for r in rows if r["target"] == name]
        medians[name] = {"target": name, "missing": sum(r["missing"] for r in mine),
                         "load": f"{mine[0]['load']} .. {mine[-1]['load']}",
                         **{c: statistics.median(r[c] for r in mine) for c in COLUMNS}}
    etcd_p99 = medians["etcd"]["p99_ms"]
    print("  median over the rounds (missing: the sum):")
    for name in names:
        print(_row("median", medians[name], etcd_p99))
    for name in names:
        if name == "etcd":
            continue
        wins = sum(1 for r in rows if r["target"] == name and r["p99_ms"] <= next(
            e["p99_ms"] for e in rows if e["round"] == r["round"] and e["target"] == "etcd"))
        met = "met" if medians[name]["p99_ms"] <= etcd_p99 else "NOT met"
        print(f"  goal p99 <= etcd's, {name}: {met} (median {medians[name]['p99_ms']:.1f} vs "
              f"{etcd_p99:.1f} ms; {wins} of {len(rows) // len(names)} rounds)")
    return medians


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m better_compute.benchmarks.watch_etcd",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", choices=["sqlite", "postgres", "both"], default="both")
    parser.add_argument("--pg-url", help="a PostgreSQL server to make a throwaway schema in "
                        "(default: a throwaway cluster, started with scripts/pg)")
    parser.add_argument("--watchers", type=int, default=100)
    parser.add_argument("--rate", type=float, default=200.0, help="writes per second")
    parser.add_argument("--seconds", type=float, default=5.0, help="of writes per row")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--writers", type=int, default=16, help="client threads that write")
    parser.add_argument("--workers", type=int, default=0,
                        help="serve --workers N (default: serve's own default)")
    parser.add_argument("--compare", metavar="DIR", type=Path,
                        help="also serve DIR's code (say, the commit before a change: git "
                        "archive COMMIT | tar -x -C DIR) on each backend, in the same rounds "
                        "(its rows are named '… before')")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON too")
    parser.add_argument("--_watchers", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--kind", default="bc", help=argparse.SUPPRESS)
    parser.add_argument("--host", default="127.0.0.1", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--token", default="", help=argparse.SUPPRESS)
    parser.add_argument("--n", type=int, default=1, help=argparse.SUPPRESS)
    return parser


def _watchers(args: argparse.Namespace) -> None:
    run: Callable[[Any], Any] = asyncio.run
    try:
        import uvloop

        run = uvloop.run
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        pass
    run(watchers_main(args))


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args._watchers:
        _watchers(args)
        return 0
    if shutil.which("etcd") is None:
        raise SystemExit(INSTALL_ETCD)
    backends = ["sqlite", "postgres"] if args.backend == "both" else [args.backend]
    with ExitStack() as stack:
        pg_url = (stack.enter_context(postgres_url(args.pg_url)) if "postgres" in backends
                  else None)
        info = machine()
        info["etcd"] = subprocess.run(["etcd", "--version"], capture_output=True,
                                      text=True).stdout.split("\n")[0]
        if pg_url:
            info["postgresql"] = pg_version(pg_url)
        print("machine: " + ", ".join(f"{k} {v}" for k, v in info.items()))
        codes = [None] if args.compare is None else [args.compare, None]
        targets = [stack.enter_context(better_compute(b, pg_url, args.workers, code))
                   for b in backends for code in codes]
        targets.append(stack.enter_context(etcd()))
        print(f"{args.watchers} watchers, {args.rate:g} writes/s for {args.seconds:g} s per row, "
              f"{args.writers} writer threads, serve --workers {args.workers or 'default'}; "
              f"load average at the start {load_average()}")
        rows: list[dict[str, Any]] = []
        for round_ in range(1, args.rounds + 1):
            order = targets if round_ % 2 else targets[::-1]
            for target in order:
                rows.append({"round": round_, **live(target, args)})
        medians = report(rows, [t.name for t in targets])
        if args.json:
            print(json.dumps({"machine": info, "rows": rows, "medians": medians}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
