"""What a person types against a real server: names where ids were, and `--watch`.

A real `better-compute serve` over TLS, on both backends, with a pool made by the tutorial's
key (`pool-eu-1-h100`) and two adopted nodes whose hostnames are gpu-sn-7701 and
gpu-sn-7702. `reserve --pool pool-eu-1-h100`, `pools get pool-eu-1-h100` and `nodes get
gpu-sn-7701` work; `reservations list -w` and `nodes get NAME -w` print the objects, then a
row each time one changes, read from the /watch stream.
"""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager

from better_compute.benchmarks.fleet import build_node
from tests.fleet import make_pool
from tests.support import CLI, client_env, initialize, open_runtime, run, serve, wait_for_line
from tests.watching import watch_env


def _fleet(env: dict[str, str]) -> list[str]:
    rt = open_runtime(env)
    try:
        pool = make_pool(rt.service, key="pool-eu-1-h100")
        nodes = [build_node(pool, hostname=f"gpu-sn-770{i}") for i in (1, 2)]
        rt.service.store.save(*nodes, actor="local")
    finally:
        rt.close()
    return [n.public_id for n in nodes]


@contextmanager
def _watching(env: dict[str, str], *argv: str) -> Iterator[subprocess.Popen[str]]:
    process = subprocess.Popen([CLI, *argv], env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        yield process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
        process.communicate(timeout=60)


def test_names_and_watch_against_a_real_server(env: dict[str, str]) -> None:
    token = initialize(env)
    nodes = _fleet(env)
    with serve(watch_env(env)) as server:
        cli = client_env(env, server, token)

        def ok(*argv: str) -> str:
            done = run([CLI, *argv], cli)
            assert done.returncode == 0, done.stderr
            return done.stdout.strip()

        pool = ok("pools", "get", "pool-eu-1-h100", "--query", "id")
        assert pool.startswith("pool_")
        assert ok("nodes", "get", "gpu-sn-7702", "--query", "id") == nodes[1]
        with _watching(cli, "reservations", "list", "-w", "-o", "json") as rows, \
                _watching(cli, "nodes", "get", "gpu-sn-7701", "--watch", "-o", "wide") as node:
            header = wait_for_line(node, "HOSTNAME")
            assert wait_for_line(node, nodes[0]).split()[0] == nodes[0]
            first = ok("reserve", "--pool", "pool-eu-1-h100", "--gpus", "1", "--for", "1h",
                       "--wait", "0", "--query", "id")
            seen = json.loads(wait_for_line(rows, first))
            assert (seen["id"], seen["poolId"]) == (first, pool)
            ok("nodes", "cordon", "gpu-sn-7701", "--reason", "fan")
            cordoned = wait_for_line(node, "cordoned")
            assert cordoned.index(nodes[0]) == 0 and "gpu-sn-7701" in cordoned
            assert cordoned.index("adopted,cordoned") == header.index("STATE")
            started = ok("reservations", "get", first, "--query", "state") != "placed"
            ok("release", first, *(() if started else ("--cancel",)))
            while seen["state"] not in ("released", "cancelled"):
                seen = json.loads(wait_for_line(rows, first))  # each change, in order
            assert seen["id"] == first
        ambiguous = run([CLI, "api", "reservations.create", "poolId=nope", "gpus:=1",
                         "duration=1h"], cli)
        assert ambiguous.returncode == 3 and "no pool named 'nope'" in ambiguous.stderr
