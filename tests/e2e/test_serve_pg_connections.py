"""``serve`` on PostgreSQL counts the connections its workers may open against max_connections.

A real PostgreSQL (tests/pg_clusters.py) restarted with a small ``max_connections``, and a
real ``serve``: ``--workers`` that could not all connect under load is refused at start
(``invalid_input``, exit status 2, the fix named); the default (a worker per core) starts
as many workers as fit, with one line saying so; connections other clients hold now only
warn. What ``serve`` counts bounds what it opens: its connections under a burst of calls
stay within ``connections_needed``. PostgreSQL only by nature (SQLite has no connection
limit): these tests run whichever backends the suite runs.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import threading
from pathlib import Path

import psycopg

from better_compute.api.http.workers import default_workers
from better_compute.api.store.pg_capacity import PER_WORKER, SERVER_EXTRA, connections_needed
from tests.outage import api_client, rpc_call
from tests.pg_clusters import Cluster, cluster
from tests.support import CLI, free_port, initialize, serve

RESERVED = 3  # superuser_reserved_connections (PostgreSQL's default)


def _restart_with(pg: Cluster, max_connections: int) -> None:
    pg.stop()
    options = (f"-c listen_addresses=127.0.0.1 -p {pg.port} -k {pg.folder} -c fsync=off "
               f"-c synchronous_commit=off -c max_connections={max_connections} "
               f"-c superuser_reserved_connections={RESERVED}")
    pg.pg_ctl("-l", str(pg.folder / "server.log"), "-w", "-t", "60", "-o", options, "start")


def _env(pg: Cluster, tmp_path: Path) -> dict[str, str]:
    data = tmp_path / "data"
    data.mkdir(exist_ok=True)
    return {"BETTER_COMPUTE_DATA_DIR": str(data), "PATH": os.environ.get("PATH", ""),
            "BETTER_COMPUTE_DATABASE_URL": pg.url()}


def _refused(env: dict[str, str], *args: str) -> str:
    """``serve`` that must not start: its one line on stderr (exit status 2)."""
    done = subprocess.run([CLI, "serve", "--listen", f"127.0.0.1:{free_port()}", *args],
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    assert "serving" not in done.stdout, done.stdout
    assert done.stderr.count("\n") == 1, done.stderr
    return done.stderr


def _server_connections(pg: Cluster) -> int:
    with pg.admin() as admin:
        row = admin.execute("SELECT count(*) FROM pg_stat_activity WHERE backend_type = "
                            "'client backend' AND pid <> pg_backend_pid()").fetchone()
    assert row is not None
    count = row[0]
    assert isinstance(count, int), count  # count(*): a bigint
    return count


def _burst(url: str, ca: Path, token: str, clients: int = 24, calls: int = 10) -> None:
    def client(n: int) -> None:
        with api_client(url, ca) as http:
            for i in range(calls):
                out = rpc_call(http, token, "sites.create",
                               {"kind": "shared", "region": "eu-1", "key": f"burst-{n}-{i}"})
                assert out.error is None, out

    threads = [threading.Thread(target=client, args=(n,)) for n in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)


def test_workers_that_max_connections_cannot_hold_are_refused_or_warned(
        tmp_path: Path) -> None:
    with cluster() as pg:
        env = _env(pg, tmp_path)
        token = initialize(env)
        # 40 - 3 reserved = 37 usable: two workers (2 x 16 + 1 = 33) fit, three (49) do not.
        _restart_with(pg, 40)
        err = _refused(env, "--workers", "3")
        needed = connections_needed(3)
        assert err.startswith(f"error [invalid_input]: --workers 3 may open {needed} "
                              "PostgreSQL connections"), err
        assert "max_connections is 40 (3 kept for superusers)" in err, err
        assert f"use --workers 2, or raise max_connections to at least {needed + RESERVED}" \
            in err, err
        assert _server_connections(pg) == 0  # nothing was left connected
        # Two fit, but not beside the 10 connections another client holds: a warning only.
        log = tmp_path / "serve.log"
        with contextlib.ExitStack() as held:
            for _ in range(10):
                held.enter_context(psycopg.connect(pg.url(), connect_timeout=10))
            with serve(env, workers="2", log_file=log) as server:
                warning = log.read_text()
                assert "PostgreSQL has 10 client connections open besides this server, " \
                       f"which may open {connections_needed(2)}" in warning, warning
                _burst(server.url, Path(env["BETTER_COMPUTE_DATA_DIR"]) / "serving-ca.pem",
                       token)
                opened = _server_connections(pg) - 10
                assert 0 < opened <= connections_needed(2), opened
        print(f"refused: {err.strip()}; --workers 2 beside 10 other connections opened "
              f"{opened} of at most {connections_needed(2)} under a burst")


def test_the_default_starts_as_many_workers_as_max_connections_holds(tmp_path: Path) -> None:
    """The default is a worker per core; this needs at least 2 cores to have any to cap
    (CI has 2): on one core it says so and checks only the refusal below."""
    with cluster() as pg:
        env = _env(pg, tmp_path)
        initialize(env)
        one = SERVER_EXTRA + PER_WORKER + RESERVED  # room for exactly one worker
        _restart_with(pg, one)
        log = tmp_path / "serve.log"
        cores = default_workers()
        with serve(env, workers=None, log_file=log) as server:
            children = Path(f"/proc/{server.process.pid}/task/{server.process.pid}/children")
            assert children.read_text().split() == []  # one process serves
            text = log.read_text()
            if cores > 1:
                assert (f"serving with 1 worker processes instead of the core count, {cores}"
                        in text), text
                assert f"raise max_connections to at least " \
                       f"{connections_needed(cores) + RESERVED}" in text, text
            else:
                print("one core: the default is one worker, nothing to cap")
        # Not even one worker fits: the default is refused too.
        _restart_with(pg, one - 1)
        err = _refused(env)
        assert err.startswith(f"error [invalid_input]: {cores} workers (one per core) may "
                              "open"), err
        assert "not even one worker fits: raise max_connections to at least " \
               f"{connections_needed(1) + RESERVED}" in err, err
