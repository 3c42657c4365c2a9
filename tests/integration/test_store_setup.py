"""Processes that open one store at the same moment all succeed (replicas starting together).

Opening a store creates its tables, functions and the projections' tables
when missing. On PostgreSQL, the same DDL run by several sessions at once
fails in some of them ("tuple concurrently updated"); on SQLite the library's
tracking-table migration (read, then insert in another transaction) let two of
them insert the same row (IntegrityError, seen under load). api/store/store.py's
``setup_lock`` lets one process at a time do it on both.
"""

from __future__ import annotations

import re
import threading
from pathlib import Path

import psycopg

from better_compute.api.runtime import Runtime
from better_compute.api.store.store import StoreConfig
from better_compute.api.store.store_url import CONNINFO
from tests.forking import forker
from tests.support import eventually, initialize, open_runtime, store_env

OPENERS = 6

_OPEN = """
from better_compute.api.runtime import Runtime
Runtime.open().close()
print("opened")
"""


def _open_all_at_once(env: dict[str, str]) -> list[tuple[int, str, str]]:
    """OPENERS processes, forked at the same moment from one that imported the product."""
    with forker(env, "better_compute.api.runtime") as processes:
        children = processes.run(_OPEN, *([[]] * OPENERS))
    return [(c.returncode, c.stdout, c.stderr) for c in children]


def test_processes_opening_a_new_store_together_all_succeed(env: dict[str, str]) -> None:
    results = _open_all_at_once(env)
    assert [(code, out.strip()) for code, out, _ in results] == [(0, "opened")] * OPENERS, \
        [err.strip().splitlines()[-1:] for _, _, err in results]


def test_processes_opening_an_initialized_store_together_all_succeed(
        env: dict[str, str]) -> None:
    initialize(env)
    results = _open_all_at_once(env)
    assert [(code, out.strip()) for code, out, _ in results] == [(0, "opened")] * OPENERS, \
        [err.strip().splitlines()[-1:] for _, _, err in results]


def _indexed_tables(runtime: Runtime) -> list[str]:
    """The read models' tables with an index, in the order opening a store creates them."""
    tables: list[str] = []
    for projection in runtime.projections.projections.values():
        for statement in projection.tables():
            found = re.search(r"CREATE (?:UNIQUE )?INDEX IF NOT EXISTS \S+ ON (\w+)", statement)
            if found and found.group(1) not in tables:
                tables.append(found.group(1))
    return tables


def test_a_replica_starting_while_others_write_waits_for_them_and_never_deadlocks(
        tmp_path: Path) -> None:
    """A replica starting in a rolling restart opens the store while the others write. Its
    ``CREATE INDEX IF NOT EXISTS`` takes each table's SHARE lock; were they all one
    transaction, it would hold the first table's while it waits for a writer that holds the
    last one's and wants the first: PostgreSQL ends one of them (deadlock_detected), and the
    replica did not start (seen in tests/e2e/test_high_availability.py). PostgreSQL only:
    SQLite has one writer at a time, and a starting process waits for it whole."""
    env = store_env("postgres", tmp_path)
    first = open_runtime(env)
    try:
        tables = _indexed_tables(first)
        assert len(tables) >= 2, tables
        pg = StoreConfig.from_env(env).pg
        assert pg is not None
        with psycopg.connect(pg[CONNINFO], autocommit=True) as writer, \
                psycopg.connect(pg[CONNINFO], autocommit=True) as watcher:
            writer.execute(f"SET search_path TO {pg['POSTGRES_SCHEMA']}")
            writer.execute("BEGIN")
            writer.execute(f"LOCK TABLE {tables[-1]} IN ROW EXCLUSIVE MODE")
            opened: list[object] = []
            failed: list[BaseException] = []

            def open_another() -> None:
                try:
                    opened.append(open_runtime(env))
                except BaseException as exc:  # what the thread met, for the assertion
                    failed.append(exc)

            thread = threading.Thread(target=open_another)
            thread.start()

            def waits_for_the_writer() -> bool:
                row = watcher.execute(
                    "SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation "
                    "WHERE NOT l.granted AND c.relname = %s", (tables[-1],)).fetchone()
                return bool(row and row[0])

            eventually(waits_for_the_writer, "the opening process waits for the writer")
            # The writer goes on to the first table, as a save touching both would.
            writer.execute(f"LOCK TABLE {tables[0]} IN ROW EXCLUSIVE MODE")
            writer.execute("COMMIT")
            thread.join(timeout=120)
        assert not failed, failed
        assert len(opened) == 1
        opened[0].close()  # type: ignore[attr-defined]
    finally:
        first.close()
