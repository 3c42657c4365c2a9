"""Which store errors are outages (``unavailable``), and the guard that fails fast meanwhile.

The SQLite errors are SQLite's own (a database capped at a few pages fills up, a
read-only one refuses writes); the PostgreSQL ones are psycopg's classes, as the
driver raises them and the library wraps them.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path

import psycopg
import psycopg_pool
import pytest
from eventsourcing.persistence import IntegrityError, OperationalError

from better_compute.api.store.outage import (
    PROBE_INTERVAL,
    StoreGuard,
    outage_error,
    unavailable_on_outage,
)
from better_compute.api.store.sqlite_factory import StoreSQLiteDatastore
from better_compute.api.store.sqlite_writers import WriterLock
from better_compute.domain.errors import Unavailable


def _wrapped(error: Exception) -> OperationalError:
    """As the library re-raises a driver's error."""
    try:
        raise OperationalError(str(error)) from error
    except OperationalError as wrapped:
        return wrapped


def _sqlite_error(run: Callable[[sqlite3.Connection], object], db: Path,
                  uri: str | None = None) -> sqlite3.Error:
    conn = sqlite3.connect(uri or str(db), uri=uri is not None)
    try:
        run(conn)
    except sqlite3.Error as exc:
        return exc
    finally:
        conn.close()
    raise AssertionError("no error")


def test_a_full_or_read_only_sqlite_disk_is_an_outage_a_bad_statement_is_not(
        tmp_path: Path) -> None:
    db = tmp_path / "store.sqlite"

    def fill(conn: sqlite3.Connection) -> None:
        conn.execute("PRAGMA max_page_count = 3")
        conn.execute("CREATE TABLE t (x TEXT)")
        for _ in range(1000):
            conn.execute("INSERT INTO t VALUES (?)", ("x" * 1000,))
            conn.commit()

    full = _sqlite_error(fill, db)
    assert full.sqlite_errorcode == sqlite3.SQLITE_FULL
    mapped = outage_error(_wrapped(full))
    assert isinstance(mapped, Unavailable)
    assert mapped.message.startswith("the event store is unavailable: database or disk is full")
    assert "retry" in mapped.message

    def write(conn: sqlite3.Connection) -> None:
        conn.execute("INSERT INTO t VALUES ('y')")

    read_only = _sqlite_error(write, db, f"file:{db}?mode=ro")
    assert outage_error(_wrapped(read_only)) is not None

    bad = _sqlite_error(lambda conn: conn.execute("SELEC 1"), db)
    assert outage_error(_wrapped(bad)) is None  # a bug: `internal`, with an incident id


def test_postgresql_connection_errors_are_outages_conflicts_are_not() -> None:
    for error, reason in (
        (psycopg.OperationalError("connection refused"), "PostgreSQL is unreachable"),
        (psycopg_pool.PoolTimeout("couldn't get a connection after 5.00 sec"),
         "no database connection came free in time"),
        (psycopg_pool.PoolClosed("the pool is closed"), "the connection pool is closed"),
        (psycopg.errors.AdminShutdown("terminating connection"),
         "PostgreSQL is shutting down or starting up"),
        (psycopg.errors.LockNotAvailable("lock timeout"), "a lock wait timed out"),
    ):
        mapped = outage_error(_wrapped(error))
        assert mapped is not None and mapped.data["reason"] == reason, error
    assert outage_error(IntegrityError("duplicate key")) is None
    assert outage_error(ValueError("a bug")) is None


def test_unavailable_on_outage_translates_outages_and_lets_the_rest_through() -> None:
    with pytest.raises(Unavailable, match="PostgreSQL is unreachable"), unavailable_on_outage():
        raise _wrapped(psycopg.OperationalError("server closed the connection unexpectedly"))
    with pytest.raises(KeyError), unavailable_on_outage():
        raise KeyError("a bug stays a bug")


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class _Server:
    """What a probe finds: the server up or down, and how often it was asked."""

    def __init__(self) -> None:
        self.up = True
        self.probes = 0
        self.rechecks = 0

    def probe(self) -> None:
        self.probes += 1
        if not self.up:
            raise psycopg.OperationalError("connection refused")

    def recheck(self) -> None:
        self.rechecks += 1


def test_the_guard_fails_calls_fast_while_postgresql_is_down_and_lets_them_through_after(
        ) -> None:
    server, clock = _Server(), _Clock()
    guard = StoreGuard(server.probe, server.recheck, clock)
    guard.admit()  # up: nothing asked
    assert server.probes == 0

    # A stale connection while the server answers (it restarted): not an outage.
    guard.failed(_wrapped(psycopg.OperationalError("server closed the connection")),
                 writing=False)
    assert guard.down_reason is None and server.probes == 1 and server.rechecks == 1

    # A lock timeout says nothing about reachability: no probe.
    guard.failed(_wrapped(psycopg.errors.LockNotAvailable("lock timeout")), writing=True)
    assert server.probes == 1

    server.up = False
    guard.failed(_wrapped(psycopg.OperationalError("connection refused")), writing=False)
    assert guard.down_reason == "PostgreSQL is unreachable" and server.probes == 2
    for _ in range(100):  # every call now fails at once, without asking the server
        with pytest.raises(Unavailable, match="retry"):
            guard.admit()
    assert server.probes == 2
    clock.now += PROBE_INTERVAL  # one caller probes again per interval
    with pytest.raises(Unavailable):
        guard.admit()
    assert server.probes == 3

    server.up = True
    clock.now += PROBE_INTERVAL
    guard.admit()  # the probe connects: the broken pooled connections are dropped, calls go
    assert guard.down_reason is None and server.rechecks == 2
    guard.admit()
    assert server.probes == 4


def test_the_guard_remembers_a_failed_write_until_a_write_succeeds(tmp_path: Path) -> None:
    """SQLite: nothing is refused (reads work on a full disk); /ready reads the flag.

    The store's SQLite datastore, once read-only (writes fail with SQLITE_READONLY,
    as on a disk that went read-only) and once writable, both behind one guard.
    """
    db = tmp_path / "store.sqlite"
    writable = StoreSQLiteDatastore(str(db))
    read_only = StoreSQLiteDatastore(f"file:{db}?mode=ro")
    guard = StoreGuard()
    writable.watch(guard, WriterLock(db, timeout=30))
    read_only.watch(guard, WriterLock(db, timeout=30))
    with writable.transaction(commit=True) as cursor:
        cursor.execute("CREATE TABLE t (x TEXT)")

    with pytest.raises(OperationalError), read_only.transaction(commit=True) as cursor:
        cursor.execute("INSERT INTO t VALUES ('x')")
    assert guard.write_failure == "attempt to write a readonly database"
    with read_only.transaction(commit=False) as cursor:
        cursor.execute("SELECT count(*) FROM t")  # reads work; the disk still refuses writes
    assert guard.write_failure is not None and guard.down_reason is None
    guard.admit()  # SQLite: never refused

    with writable.transaction(commit=True) as cursor:
        cursor.execute("INSERT INTO t VALUES ('x')")
    assert guard.write_failure is None
    writable.close()
    read_only.close()
