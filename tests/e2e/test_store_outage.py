"""The store goes away and comes back: `serve`, its gateway, a watcher and an agent ride it out.

Real processes throughout: `better-compute serve --gateway-listen`, `bcd node` on the fake
GPU source, `better-compute events watch`, and a steady load of JSON-RPC calls over HTTPS.

* PostgreSQL: the test's own cluster (scripts/pg), stopped for 15 s and started again, then
  stopped for 60 s and started again (a fast shutdown: what a restart or a failover does).
* SQLite: the data dir is a small tmpfs in the server's own mount namespace (``unshare``),
  filled up with a file, so the store's writes fail with ENOSPC exactly as on a full disk,
  then freed.

What must hold: during the outage every call is answered within ``CALL_BOUND`` seconds with
the stable code ``unavailable`` (never ``internal``, never a hang) while /health stays 200 and
/ready says 503 with a reason; within ``RECOVERY`` seconds of the store's return calls succeed
and /ready is 200, with nothing restarted by hand; the watcher's output is exactly the log
(no gap, no duplicate); the agent's session is up and the node was never marked unreachable;
every acknowledged write is in the store.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from tests.cluster import Cluster, Machine, Operator, running_cluster
from tests.outage import Load, Postgres, probe, throwaway_postgres
from tests.support import (
    CLI,
    Server,
    cli_inprocess,
    client_env,
    eventually,
    free_port,
    initialize,
    open_runtime,
    wait_for_line,
)
from tests.watching import CliWatcher, log_sequences

FAST = {"BETTER_COMPUTE_NODE_HEARTBEAT": "1", "BETTER_COMPUTE_NODE_UNREACHABLE_AFTER": "3",
        "BETTER_COMPUTE_CONTROLLER_TICK": "0.2", "BETTER_COMPUTE_WATCH_HEARTBEAT": "1"}
CALL_BOUND = 10.0  # seconds: every call during an outage is answered within this
RECOVERY = 10.0  # seconds after the store's return by which everything works again


def _ca(c: Cluster) -> str:
    return c.env["BETTER_COMPUTE_CA_FILE"]


def _adopted_node(c: Cluster) -> str:
    node = c.join()
    c.start_agent(epoch=1)
    eventually(lambda: c.provision_state(node) == "adopted", "the node is adopted")
    return node


def _assert_answered_unavailable(load: Load, start: float, end: float, allowed: set[str]
                                 ) -> list[Any]:
    """Every call sent in [start, end) answered in time, each ok or with an allowed code."""
    calls = load.between(start, end)
    assert calls, "the load sent nothing during the outage"
    slow = [(o.method, round(o.took, 1), o.error) for o in calls if o.took > CALL_BOUND]
    assert not slow, f"calls answered after more than {CALL_BOUND}s: {slow[:5]}"
    wrong = [(o.method, o.error) for o in calls if o.error is not None and o.error not in allowed]
    assert not wrong, f"calls answered with other than {allowed}: {wrong[:5]}"
    return calls


def _ride_out_postgres_outage(c: Cluster, pg: Postgres, load: Load, seconds: float
                              ) -> tuple[float, float]:
    """Stop PostgreSQL for ``seconds``, start it again; returns when it stopped and when
    everything had recovered."""
    load.wait_for_success("sites.create", time.monotonic(), 30)
    stopped = time.monotonic()
    pg.pause()
    # While it is down: liveness holds, readiness says why not, the CLI says what to do.
    eventually(lambda: probe(c.server.url, _ca(c), "/ready")[0] == 503,
               "/ready answers 503", timeout=CALL_BOUND)
    status, body = probe(c.server.url, _ca(c), "/ready")
    assert status == 503 and body["status"] == "unavailable", body
    assert "store" in body["checks"] and body["checks"]["store"] != "ok", body
    assert probe(c.server.url, _ca(c), "/health") == (200, {"status": "ok"})
    code, _, err = cli_inprocess(["sites", "list"], c.env)
    assert code == 1 and "unreachable" in err and "retry" in err, err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    time.sleep(max(0.0, stopped + seconds - time.monotonic()))  # the outage itself
    pg.resume()
    back = time.monotonic()
    eventually(lambda: probe(c.server.url, _ca(c), "/ready")[0] == 200,
               f"/ready answers 200 within {RECOVERY}s of the store's return", timeout=RECOVERY)
    load.wait_for_success("sites.create", back, RECOVERY - (time.monotonic() - back))
    load.wait_for_success("system.whoami", back, RECOVERY - (time.monotonic() - back))
    recovered = time.monotonic()
    calls = _assert_answered_unavailable(load, stopped + 1, back, {"unavailable"})
    assert any(o.error == "unavailable" for o in calls), load.summary(stopped)
    return stopped, recovered


def _check_after(c: Cluster, load: Load, watcher: CliWatcher, node: str, since: int,
                 steady_from: float) -> None:
    """Calls succeed again, the watcher printed the log exactly, the agent is still there."""
    late = load.since(steady_from)
    assert late and all(o.error is None for o in late), load.summary(steady_from)
    runtime = open_runtime(c.store_env)
    try:
        sequences = log_sequences(runtime, since)
        sites = {s["id"] for s in c.cli_json("sites", "list")}
    finally:
        runtime.close()
    lost = load.acknowledged_sites() - sites
    assert not lost, f"{len(lost)} acknowledged writes are not in the store: {sorted(lost)[:5]}"
    printed = watcher.events(len(sequences), timeout=30)
    assert [e["sequence"] for e in printed] == sequences  # in order, no gap, no duplicate
    assert watcher.no_more_events(within=1.0)
    session = c.cli_json("nodes", "get", node, "--query", "session")
    assert session["state"] == "connected", session
    status = json.loads(c.bcd("status", "--json").stdout)
    assert status["session"]["state"] == "connected", status["session"]
    assert "node.unreachable" not in c.events(node), c.events(node)


def test_serve_rides_out_a_15s_then_a_60s_postgresql_outage(tmp_path: Path) -> None:
    with throwaway_postgres() as pg:
        data = tmp_path / "data"
        data.mkdir()
        env = {"BETTER_COMPUTE_DATA_DIR": str(data), "PATH": os.environ.get("PATH", ""),
               "BETTER_COMPUTE_DATABASE_URL": pg.url}
        with running_cluster(env, tmp_path, FAST) as c:
            node = _adopted_node(c)
            since = _head(c)
            watcher = CliWatcher(c.env, "--since", str(since))
            token = c.env["BETTER_COMPUTE_TOKEN"]
            try:
                with Load(c.server.url, token, _ca(c)) as load:
                    _, first = _ride_out_postgres_outage(c, pg, load, 15)
                    stopped, second = _ride_out_postgres_outage(c, pg, load, 60)
                    # Once recovered, it stays recovered: every later call succeeds.
                    load.wait_for_success("sites.create", second, 30)
                    between = load.between(first, stopped)
                    assert all(o.error is None for o in between), load.summary(first)
                _check_after(c, load, watcher, node, since, second)
            finally:
                watcher.stop(signal.SIGTERM)


def _head(c: Cluster) -> int:
    runtime = open_runtime(c.store_env)
    try:
        return int(runtime.store.recorder.max_notification_id() or 0)
    finally:
        runtime.close()
