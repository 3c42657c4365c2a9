"""The store goes away and comes back: `serve`, its gateway, a watcher and an agent ride it out.

Real processes throughout: `better-compute serve --gateway-listen`, `bcd node` on the fake
GPU source, `better-compute events watch`, and a steady load of JSON-RPC calls over HTTPS
(one writer creating sites, one reader asking system.whoami).

* PostgreSQL: the test's own cluster (scripts/pg), stopped for 15 s and started again, then
  stopped for 60 s and started again (a fast shutdown: what a restart or a failover does).
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
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tests.cluster import Cluster, Machine, Operator, running_cluster
from tests.outage import Load, probe, throwaway_postgres
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
    printed: list[dict[str, Any]] = field(default_factory=list)

    def printed_until(self, subject: str, timeout: float) -> None:
        """Collect the watcher's events until one about ``subject`` arrives."""
        deadline = time.monotonic() + timeout
        while not any(e["subject"] == subject for e in self.printed):
            self.printed += self.watcher.events(1, max(0.01, deadline - time.monotonic()))

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
          f"{max(o.took for o in during):.2f}s; {load.summary(stopped)}")
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
    lost = rig.load.acknowledged_sites() - sites
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


def _run_outages(c: Cluster, outages: list[tuple[float, Callable[[], None], Callable[[], None]]],
                 *, reads_work: bool) -> None:
    node = _adopted_node(c)
    since = (_log_sequences(c) or [0])[-1]
    watcher = CliWatcher(c.env, "--since", str(since))
    try:
        with Load(c.server.url, c.env["BETTER_COMPUTE_TOKEN"], _ca(c)) as load:
            rig = Rig(c, load, node, watcher)
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


def test_serve_rides_out_a_15s_then_a_60s_postgresql_outage(tmp_path: Path) -> None:
    with throwaway_postgres() as pg:
        data = tmp_path / "data"
        data.mkdir()
        env = {"BETTER_COMPUTE_DATA_DIR": str(data), "PATH": os.environ.get("PATH", ""),
               "BETTER_COMPUTE_DATABASE_URL": pg.url}
        with running_cluster(env, tmp_path, FAST) as c:
            _run_outages(c, [(15, pg.pause, pg.resume), (60, pg.pause, pg.resume)],
                         reads_work=False)


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
