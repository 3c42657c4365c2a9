"""Before and after in the same window: ``benchmarks.reservations --compare DIR``.

DIR's code (say, ``git archive COMMIT | tar -x -C DIR``) and ours are served side by side,
each on its own store with the same pool, and every phase alternates between them round
by round in ABBA order, so that a machine shared with others weighs on both alike. Each
phase prints the median of its rounds for each server and ours against DIR's (server CPU
per operation, the steadier figure on a loaded machine).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path
from typing import Any

from better_compute.benchmarks.harness import load_average as _load
from better_compute.benchmarks.reservations import Bench, Server, _pg_pid, _set_up, _warm_up


def _serving(backend: str, args: argparse.Namespace, code: str | None, tmp: Path
             ) -> tuple[dict[str, str], Server, Bench]:
    """A fresh store with the pool set up, and a server of ``code`` (ours: None) on it."""
    from better_compute.benchmarks.harness import store_env as _store_env

    env = _store_env(backend, args.pg_url, tmp)
    tokens, ca_pem, pool = _set_up(env, args.nodes, max(int(c) for c in args.clients.split(",")),
                                   args.quota)
    # Both sides get the same count, given or 1: serve's default (the core count) differs
    # between versions of the code.
    extra = ["--workers", str(args.workers or 1)]
    server = Server(env, extra, code)
    return env, server, Bench(server, tokens, ca_pem, pool, args.client_procs, 0.0,
                              _pg_pid(backend, args))


def compare(backend: str, args: argparse.Namespace) -> None:
    """``--compare DIR``: the same phases on two servers at once (DIR's code and ours, each
    with its own store and pool), alternating round by round in ABBA order, so that both
    meet the same machine; the median of the rounds for each, and ours against DIR's."""
    from better_compute.benchmarks.harness import drop_schema as _drop

    print(f"{backend}: load average {_load()} at the start", flush=True)
    with tempfile.TemporaryDirectory() as tmp_a, tempfile.TemporaryDirectory() as tmp_b:
        served: dict[str, tuple[dict[str, str], Server, Bench]] = {}
        try:
            served["before"] = _serving(backend, args, args.compare, Path(tmp_a))
            served["after"] = _serving(backend, args, args.code, Path(tmp_b))
            for name, (_, _, bench) in served.items():
                _warm_up(bench, f"{backend}/{name}")
            for clients in [int(c) for c in args.clients.split(",") if c]:
                got: dict[tuple[str, str], list[dict[str, Any]]] = {}
                for round_ in range(args.rounds):
                    order = list(served) if round_ % 2 == 0 else list(served)[::-1]
                    for name in order:
                        bench = served[name][2]
                        made = bench.creates(clients, seconds=args.seconds)
                        gone = bench.releases(clients, made["ids"])
                        got.setdefault((name, "create"), []).append(made)
                        got.setdefault((name, "release"), []).append(gone)
                for what in ("create", "release"):
                    for name in served:
                        _show_median(backend, name, what, clients, got[(name, what)])
                    before = statistics.median(r["cpu_ms"] for r in got[("before", what)])
                    after = statistics.median(r["cpu_ms"] for r in got[("after", what)])
                    print(f"  {backend:<10} {what} {clients:>2} clients: server CPU per op "
                          f"after / before {after / before:.2f}", flush=True)
        finally:
            for env, server, _ in served.values():
                server.close()
                _drop(env)


def _show_median(backend: str, name: str, what: str, clients: int,
                 rounds: list[dict[str, Any]]) -> None:
    def med(key: str) -> float:
        return float(statistics.median(r[key] for r in rounds))

    errors = sum(len(r["errors"]) for r in rounds)
    print(f"  {backend:<10} {name:<6} {what:<7} {clients:>2} clients, median of {len(rounds)}: "
          f"{med('rate'):7.1f}/s  p50 {1000 * med('p50'):7.1f} ms  p99 {1000 * med('p99'):7.1f} "
          f"ms  server CPU {med('cpu_ms'):5.2f} ms/op ({med('cores'):.2f} cores)"
          + (f" + PostgreSQL {med('pg_cpu_ms'):5.2f}" if backend == "postgres" else "")
          + f"  load {rounds[-1]['load']}  steal {med('steal'):.0f} %"
          + (f"  {errors} errors" if errors else ""), flush=True)
