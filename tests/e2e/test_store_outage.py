"""The store goes away and comes back: `serve`, its gateway, a watcher and an agent ride it out.

Real processes throughout: `better-compute serve --gateway-listen`, `bcd node` on the fake
GPU source, `better-compute events watch`, and a steady load of JSON-RPC calls over HTTPS
(one writer creating sites, one reader asking system.whoami).

* PostgreSQL: the test's own cluster (scripts/pg), stopped for 5 s and started again, then
  stopped for 20 s and started again (a fast shutdown: what a restart or a failover does),
  served by ``serve --workers 2``: what ships on a 2-core machine (the default is a worker
  per core), each worker with its own pool, guard and follower. 20 s outlasts every bound
  inside (the pool gives up reconnecting after 3 s, a silent peer counts as gone after
  15 s, the background tasks' backoff reaches its 10 s cap after 15.5 s). Each worker is
  reached on a connection of its own (which worker accepted it is read from /proc): each
  answers ``unavailable`` during the outage and creates again within ``RECOVERY`` seconds
  of the return. SIGTERM stops the parent and every worker within ``STOP_BOUND`` seconds
  after the outages, and on a second server while PostgreSQL is down under load. These
  are PostgreSQL's tests by nature (a server stopped for real): they run whichever
  backends the suite runs.
* SQLite: a full disk. The server runs in a mount namespace of its own (``unshare``, no
  root needed) whose data dir is a small tmpfs holding the store; the test fills that
  tmpfs with a file, so the store's writes fail with ENOSPC exactly as on a full disk
  (SQLITE_FULL), then deletes the file.

What must hold: during the outage every call is answered within ``CALL_BOUND`` seconds, ok
or with the stable code ``unavailable`` (never ``internal``, never a hang), /health stays
200 and /ready answers 503 with the reason; on a full disk reads keep working; within
``RECOVERY`` seconds of the store's return calls succeed and /ready is 200, with nothing
restarted by hand, and every later call succeeds; the watcher printed exactly the log (no
gap, no duplicate); the agent's session is up and its node was never marked unreachable;
every acknowledged write is in the store.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import queue
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tests.cluster import Cluster, Machine, Operator, running_cluster
from tests.e2e.test_serve_workers import _children, _gone
from tests.e2e.test_serve_workers_metrics import Connection, on_every_worker
from tests.outage import Load, Postgres, probe, throwaway_postgres
from tests.support import (
    cli_inprocess,
    client_env,
    eventually,
    free_port,
    initialize,
    serve,
)
from tests.watching import CliWatcher

FAST = {"BETTER_COMPUTE_NODE_HEARTBEAT": "1", "BETTER_COMPUTE_NODE_UNREACHABLE_AFTER": "3",
        "BETTER_COMPUTE_CONTROLLER_TICK": "0.2", "BETTER_COMPUTE_WATCH_HEARTBEAT": "1"}
CALL_BOUND = 10.0  # seconds: every call during an outage is answered within this
RECOVERY = 10.0  # seconds after the store's return by which everything works again
# Seconds from SIGTERM until the parent and every worker have ended: 1-5 s measured. Twice
# in full suites a worker was still alive after 20-30 s, its threads idle (so its event
# loop waited on something); cause not found. A call in flight can no longer hold a stop
# past the grace (15 s: api/http/serve.py), a slow stop logs every task's await chain after
# 5 s, and a worker still alive here is asked for its stacks (SIGUSR1) into serve's log.
# The unit's TimeoutStopSec: 60.
STOP_BOUND = 30.0
WORKERS = 2  # the default on a 2-core machine (a worker per core)


def _ca(c: Cluster) -> str:
    return c.env["BETTER_COMPUTE_CA_FILE"]


def _ready(c: Cluster) -> tuple[int, dict[str, object]]:
    return probe(c.server.url, _ca(c), "/ready")


def _adopted_node(c: Cluster) -> str:
    node = c.join()
    c.start_agent(epoch=1)
    eventually(lambda: c.provision_state(node) == "adopted", "the node is adopted")
    return node


def _log_sequences(c: Cluster, since: int = 0) -> list[int]:
    """The sequence of every event after ``since``, as the server's log holds them."""
    lines = c.cli("events", "list", "--since", str(since)).splitlines()
    return [json.loads(line)["sequence"] for line in lines if line.strip()]


@dataclass
class Rig:
    """What rides the outage out: the cluster, its load, its agent's node, a watcher."""

    c: Cluster
    load: Load
    node: str
    watcher: CliWatcher
    workers: list[int]  # the worker processes of serve --workers (none: one process)
    printed: list[dict[str, Any]] = field(default_factory=list)
    created: set[str] = field(default_factory=set)  # sites the per-worker calls created

    def printed_until(self, subject: str, timeout: float) -> None:
        """Collect the watcher's events until one about ``subject`` arrives."""
        deadline = time.monotonic() + timeout
        while not any(e["subject"] == subject for e in self.printed):
            self.printed += self.watcher.events(1, max(0.01, deadline - time.monotonic()))

    def create_on(self, connection: Connection, key: str) -> dict[str, Any]:
        """sites.create on ``connection`` (so on the worker that holds it): the JSON-RPC
        answer's error, or {} when it created (the site kept in ``created``)."""
        body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "sites.create",
                           "params": {"kind": "shared", "region": "eu-8", "key": key}})
        connection.http.request("POST", "/api/compute/rpc", body=body, headers={
            "content-type": "application/json",
            "authorization": f"Bearer {self.c.env['BETTER_COMPUTE_TOKEN']}"})
        answer = connection.http.getresponse()
        doc = json.loads(answer.read())
        assert answer.status == 200, (answer.status, doc)
        if "result" in doc:
            self.created.add(doc["result"]["id"])
            return {}
        return dict(doc["error"])

    def each_worker_answers(self, expect: str, since: float, timeout: float
                            ) -> dict[int, float]:
        """Reach every worker on a connection of its own and call sites.create on each
        until each answers ``expect`` ("ok", or "unavailable" with its message); every
        answer meanwhile is one of the two. Returns the seconds from ``since`` to each
        worker's first such answer."""
        if not self.workers:
            return {}
        started = time.monotonic()
        took: dict[int, float] = {}
        n = 0
        with contextlib.ExitStack() as stack, \
                on_every_worker(stack, self.c.server.port, Path(_ca(self.c)),
                                self.workers) as held:
            while len(took) < len(held):
                assert time.monotonic() - started < timeout, (
                    f"workers {sorted(set(held) - set(took))} did not answer {expect} within "
                    f"{timeout:.0f}s (those that did: {took})")
                for pid, connection in held.items():  # each kept busy: none idles out
                    n += 1
                    error = self.create_on(connection, f"worker-call-{time.time_ns()}-{n}")
                    code = error.get("data", {}).get("code", "ok") if error else "ok"
                    assert code in ("ok", "unavailable"), (pid, error)
                    if code == "unavailable":
                        assert error["message"].startswith(
                            "the event store is unavailable") and "retry" in error["message"], error
                    if code == expect:
                        took.setdefault(pid, time.monotonic() - since)
                time.sleep(0.05)
        return took

    def reported_since(self, moment: datetime) -> bool:
        """The gateway wrote a report of the node's that it heard after ``moment``."""
        at = self.c.cli("nodes", "get", self.node, "--query", "report.at")
        return at not in ("", "null") and datetime.fromisoformat(at) > moment


def _ride_out(rig: Rig, seconds: float, stop: Callable[[], None], start: Callable[[], None],
              *, reads_work: bool) -> tuple[float, float]:
    """Take the store away for ``seconds`` and give it back; returns when it went and when
    everything had recovered. ``reads_work``: reads keep succeeding meanwhile (a full disk)."""
    c, load = rig.c, rig.load
    load.wait_for_success("sites.create", time.monotonic(), 30)
    stopped = time.monotonic()
    stop()
    # While it is away: liveness holds, readiness says why not, writes answer unavailable.
    eventually(lambda: _ready(c)[0] == 503, "/ready answers 503", timeout=CALL_BOUND)
    status, body = _ready(c)
    assert status == 503 and body["status"] == "unavailable", body
    assert isinstance(body["checks"], dict) and body["checks"]["store"] != "ok", body
    assert "reason" in body, body
    assert probe(c.server.url, _ca(c), "/health") == (200, {"status": "ok"})
    failed = load.wait_for_error("sites.create", stopped, CALL_BOUND)
    assert failed.error == "unavailable", failed
    refusing = rig.each_worker_answers("unavailable", stopped, CALL_BOUND)
    if reads_work:
        load.wait_for_success("system.whoami", time.monotonic(), CALL_BOUND)
    code, _, err = cli_inprocess(["sites", "create", "--kind", "shared", "--region", "eu-1"],
                                 c.env)
    assert code == 11 and err.startswith("error [unavailable]: the event store is unavailable"), err
    assert "retry" in err and err.count("\n") == 1, err
    time.sleep(max(0.0, stopped + seconds - time.monotonic()))  # the outage itself
    start()
    back, returned_at = time.monotonic(), datetime.now(UTC)

    def left() -> float:
        return RECOVERY - (time.monotonic() - back)

    # Within RECOVERY seconds of its return: ready, calls succeed, the watcher prints the
    # new writes. The gateway writes what the agent reports again (bcd reports every 6th
    # heartbeat: a report heard after the return comes up to 6 s later).
    eventually(lambda: _ready(c)[0] == 200, "/ready answers 200", timeout=left())
    per_worker = rig.each_worker_answers("ok", back, left())
    written = load.wait_for_success("sites.create", back, left())
    load.wait_for_success("system.whoami", back, left())
    rig.printed_until(written.result["id"], left())
    serving = time.monotonic()
    eventually(lambda: rig.reported_since(returned_at), "the node's reports are written",
               timeout=left() + 10)
    recovered = time.monotonic()
    during = load.between(stopped, back)
    print(f"outage of {seconds:.0f}s: /ready 200, calls and the watcher back "
          f"{serving - back:.1f}s after the store's return, reports written after "
          f"{recovered - back:.1f}s; slowest answer meanwhile "
          f"{max(o.took for o in during):.2f}s; {load.summary(stopped)}; each worker "
          f"refused {_seconds(refusing)} after the stop and created again "
          f"{_seconds(per_worker)} after the return")
    slow = [(o.method, round(o.took, 1), o.error) for o in during if o.took > CALL_BOUND]
    assert not slow, f"calls answered after more than {CALL_BOUND}s: {slow[:5]}"
    wrong = [(o.method, o.error) for o in during if o.error not in (None, "unavailable")]
    assert not wrong, f"calls answered with other than ok or unavailable: {wrong[:5]}"
    if reads_work:
        assert all(o.error is None for o in during if o.method == "system.whoami"), \
            load.summary(stopped)
    return stopped, recovered


def _check_after(rig: Rig, since: int) -> None:
    """Every acknowledged write is in the store, the watcher printed exactly the log, and
    the agent is still in session (its node never marked unreachable)."""
    c = rig.c
    sites = {s["id"] for s in c.cli_json("sites", "list")}
    lost = (rig.load.acknowledged_sites() | rig.created) - sites
    assert not lost, f"{len(lost)} acknowledged writes are not in the store: {sorted(lost)[:5]}"
    sequences = _log_sequences(c, since)
    rig.printed += rig.watcher.events(len(sequences) - len(rig.printed), timeout=30)
    assert [e["sequence"] for e in rig.printed] == sequences  # in order, no gap, no duplicate
    with contextlib.suppress(queue.Empty):
        extra = rig.watcher.lines.get(timeout=1.0)
        raise AssertionError(f"the watcher printed more than the log ({sequences[-3:]}): "
                             f"{extra!r}; {''.join(rig.watcher.stderr)[-2000:]}")
    session = c.cli_json("nodes", "get", rig.node, "--query", "session")
    assert session["state"] == "connected", session
    status = json.loads(c.bcd("status", "--json").stdout)
    assert status["session"]["state"] == "connected", status["session"]
    assert "node.unreachable" not in c.events(rig.node), c.events(rig.node)
    # The gateway takes new sessions too: bcd restarted connects with the next epoch.
    for agent in c.machine.agents:
        agent.kill()
        agent.wait(timeout=30)
    c.start_agent(epoch=2)


def _seconds(took: dict[int, float]) -> str:
    return ", ".join(f"{t:.1f}s (pid {pid})" for pid, t in sorted(took.items())) or "-"


def _run_outages(c: Cluster, outages: list[tuple[float, Callable[[], None], Callable[[], None]]],
                 *, reads_work: bool, workers: list[int] | None = None) -> None:
    node = _adopted_node(c)
    since = (_log_sequences(c) or [0])[-1]
    watcher = CliWatcher(c.env, "--since", str(since))
    try:
        with Load(c.server.url, c.env["BETTER_COMPUTE_TOKEN"], _ca(c)) as load:
            rig = Rig(c, load, node, watcher, workers or [])
            recovered = 0.0
            for seconds, stop, start in outages:
                stopped, back = _ride_out(rig, seconds, stop, start, reads_work=reads_work)
                if recovered:  # between two outages, every call succeeded
                    calm = load.between(recovered, stopped)
                    assert all(o.error is None for o in calm), load.summary(recovered)
                recovered = back
            # Once recovered, it stays recovered: every later call succeeds.
            load.wait_for_success("sites.create", recovered + 1, 30)
        late = load.since(recovered)
        assert late and all(o.error is None for o in late), load.summary(recovered)
        _check_after(rig, since)
    finally:
        watcher.stop(signal.SIGTERM)


def _log_tail(log: Path) -> str:
    return log.read_text(errors="replace")[-12000:] if log.exists() else "(no log)"


def _sigterm_stops_all(process: subprocess.Popen[str], workers: list[int], log: Path
                       ) -> float:
    """SIGTERM ``serve``: the parent and every worker end within STOP_BOUND seconds, the
    parent with status 0. Returns how long it took."""
    sent = time.monotonic()
    process.send_signal(signal.SIGTERM)
    try:
        status = process.wait(timeout=STOP_BOUND)
    except subprocess.TimeoutExpired:
        alive = [w for w in workers if not _gone(w)]
        for pid in alive:  # their stacks into the log (api/http/workers.py)
            os.kill(pid, signal.SIGUSR1)
        time.sleep(1)  # the stacks' write: nothing to await across processes
        raise AssertionError(f"serve did not stop within {STOP_BOUND}s of SIGTERM (workers "
                             f"still alive: {alive}); its log: {_log_tail(log)}") from None
    eventually(lambda: all(_gone(w) for w in workers), "every worker ended",
               timeout=max(0.1, sent + STOP_BOUND - time.monotonic()))
    assert status == 0, (status, _log_tail(log))
    return time.monotonic() - sent


def _postgres_env(pg: Postgres, tmp_path: Path) -> dict[str, str]:
    data = tmp_path / "data"
    data.mkdir(exist_ok=True)
    return {"BETTER_COMPUTE_DATA_DIR": str(data), "PATH": os.environ.get("PATH", ""),
            "BETTER_COMPUTE_DATABASE_URL": pg.url}


def test_two_workers_ride_out_a_5s_then_a_20s_postgresql_outage(tmp_path: Path) -> None:
    """PostgreSQL only by nature: the outage is the database server stopped for real
    (SQLite's outage is the full disk below)."""
    with throwaway_postgres() as pg:
        env = _postgres_env(pg, tmp_path)
        log = tmp_path / "serve.log"
        with running_cluster(env, tmp_path, FAST, serve_args=("--workers", str(WORKERS)),
                             log_file=log) as c:
            workers = _children(c.server.process.pid)
            assert len(workers) == WORKERS, workers
            try:
                _run_outages(c, [(5, pg.pause, pg.resume), (20, pg.pause, pg.resume)],
                             reads_work=False, workers=workers)
            except AssertionError as exc:
                raise AssertionError(f"{exc}\nserve's log: {_log_tail(log)}") from exc
            # An outage is logged as one line per activity that fails and one when it
            # works again, never a traceback (those are for bugs): a long outage does not
            # fill the log, nor a pipe nobody drains (which stalls the server).
            assert "Traceback" not in log.read_text(), _log_tail(log)
            took = _sigterm_stops_all(c.server.process, workers, log)
            print(f"SIGTERM after the outages: stopped in {took:.1f}s")


def test_sigterm_stops_two_workers_promptly_while_postgresql_is_down(tmp_path: Path) -> None:
    """PostgreSQL only by nature, as above: a service manager stops the server while the
    database is away, calls in flight; nothing acknowledged is lost."""
    with throwaway_postgres() as pg:
        env = _postgres_env(pg, tmp_path)
        token = initialize(env)
        log = tmp_path / "serve.log"
        ca = Path(env["BETTER_COMPUTE_DATA_DIR"]) / "serving-ca.pem"
        with serve(env, log_file=log, workers=str(WORKERS)) as server:
            workers = _children(server.process.pid)
            assert len(workers) == WORKERS, workers
            with Load(server.url, token, ca) as load:
                load.wait_for_success("sites.create", time.monotonic(), 30)
                pg.pause()
                took = _sigterm_stops_all(server.process, workers, log)
            print(f"SIGTERM while PostgreSQL was down: stopped in {took:.1f}s; "
                  f"{load.summary()}")
        pg.resume()
        code, out, err = cli_inprocess(["sites", "list", "--output", "json"], env)
        assert code == 0, err
        lost = load.acknowledged_sites() - {s["id"] for s in json.loads(out)}
        assert not lost, f"{len(lost)} acknowledged writes are not in the store"


# ------------------------------------------------------------------ SQLite: a full disk

DISK = "32m"  # the tmpfs the server's store lives on


def _on_small_disk(seed: dict[str, str], disk: Path) -> list[str]:
    """A command that runs a server in its own mount namespace, its data dir ``disk`` a tmpfs
    of ``DISK`` holding a copy of the seed store (``unshare --map-root-user``: no root
    needed)."""
    script = ('mount -t tmpfs -o size="$1",mode=0700 bc-outage "$2" && cp -a "$3/." "$2/" '
              '&& shift 3 && exec "$@"')
    return ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", script, "sh",
            DISK, str(disk), seed["BETTER_COMPUTE_DATA_DIR"]]


def _fill(path: Path) -> None:
    """Write ``path`` until the file system has no block left (ENOSPC)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        for size in (1 << 20, 1 << 12, 1):
            chunk = bytes(size)
            try:
                while True:
                    os.write(fd, chunk)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc
    finally:
        os.close(fd)


def test_serve_rides_out_a_full_disk_under_its_sqlite_store(tmp_path: Path) -> None:
    seed_dir, disk = tmp_path / "seed", tmp_path / "disk"
    seed_dir.mkdir()
    disk.mkdir()
    seed = {"BETTER_COMPUTE_DATA_DIR": str(seed_dir), "PATH": os.environ.get("PATH", "")}
    token = initialize(seed)
    server_env = {**seed, **FAST, "BETTER_COMPUTE_DATA_DIR": str(disk)}
    with serve(server_env, "--gateway-listen", f"127.0.0.1:{free_port()}",
               wrap=_on_small_disk(seed, disk)) as server:
        # The disk as the server sees it, through its mount namespace (a file, not the
        # store: SQLite resolves the /proc link and would open the empty folder outside).
        inside = Path(f"/proc/{server.process.pid}/root") / disk.relative_to("/")
        operator = Operator(client_env(seed, server, token))
        pool = operator.create_pool(tmp_path)
        machine = Machine(tmp_path / "SN-7701")
        c = Cluster(operator.env, {**seed, "BETTER_COMPUTE_DATA_DIR": str(disk)}, server,
                    machine, pool)
        filler = inside / "filler"
        try:
            _run_outages(c, [(8, lambda: _fill(filler), filler.unlink)], reads_work=True)
        finally:
            machine.stop()
