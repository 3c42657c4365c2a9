"""SQLite writers of several processes take turns on an flock, woken within a millisecond
(api/store/sqlite_writers.py), instead of SQLite's busy handler's growing sleeps."""

from __future__ import annotations

import fcntl
import os
import threading
import time
from pathlib import Path
from typing import Any

from better_compute.api.store.outage import StoreGuard
from better_compute.api.store.sqlite_factory import StoreSQLiteDatastore
from better_compute.api.store.sqlite_writers import WriterLock


def test_two_holders_take_turns_and_the_waiting_one_goes_once_released(tmp_path: Path) -> None:
    db = tmp_path / "store.sqlite"
    first, second = WriterLock(db, timeout=30), WriterLock(db, timeout=30)  # two processes
    order: list[str] = []
    inside = threading.Event()
    release = threading.Event()

    def hold() -> None:
        with first.held():
            order.append("first in")
            inside.set()
            release.wait(30)
            order.append("first out")

    holder = threading.Thread(target=hold)
    holder.start()
    assert inside.wait(30)
    waiting_done = threading.Event()

    def wait_turn() -> None:
        with second.held():
            order.append("second in")
        waiting_done.set()

    waiter = threading.Thread(target=wait_turn)
    waiter.start()
    assert not waiting_done.wait(0.2)  # it waits while the first holds the lock
    release.set()
    assert waiting_done.wait(30)
    holder.join(30)
    waiter.join(30)
    assert order == ["first in", "first out", "second in"]
    assert (tmp_path / "store.sqlite-writer.lock").stat().st_mode & 0o777 == 0o600


def test_a_lock_held_past_the_timeout_lets_the_write_go_on_to_sqlite(tmp_path: Path) -> None:
    db = tmp_path / "store.sqlite"
    lock = WriterLock(db, timeout=0.3)
    fd = os.open(lock.path, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)  # a process that holds it and never lets go
    try:
        began = time.monotonic()
        with lock.held():
            waited = time.monotonic() - began
        assert waited >= 0.3  # it waited its timeout, then went on (SQLite decides)
    finally:
        os.close(fd)


def test_only_writing_connections_take_the_lock_each_at_full_synchronous(tmp_path: Path
                                                                          ) -> None:
    """The store's SQLite datastore: a writer holds the lock and is handed out at FULL
    whatever a read model's commit left its connection at; a reader takes nothing."""
    db = tmp_path / "store.sqlite"
    datastore = StoreSQLiteDatastore(str(db), pool_size=1, max_overflow=0)
    datastore.watch(StoreGuard(), WriterLock(db, timeout=30))
    other = os.open(tmp_path / "store.sqlite-writer.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        with datastore.get_connection(commit=True) as conn:
            try:  # held: another process's try fails
                fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
                raise AssertionError("a writer did not hold the lock")
            except BlockingIOError:
                pass
            assert _synchronous(conn) == FULL
            conn.cursor().execute("PRAGMA synchronous = NORMAL")  # as a read model's commit
            first = conn
        with datastore.get_connection(commit=False) as conn:  # a reader takes nothing
            fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
            fcntl.flock(other, fcntl.LOCK_UN)
        with datastore.get_connection(commit=True) as conn:
            assert conn is first and _synchronous(conn) == FULL  # durable again
    finally:
        os.close(other)
        datastore.close()


FULL = 2


def _synchronous(conn: Any) -> int:
    cursor = conn.cursor()
    cursor.execute("PRAGMA synchronous")
    return int(cursor.fetchone()[0])


def test_the_sqlite_store_s_writes_wait_for_the_lock_and_its_reads_do_not(tmp_path: Path) -> None:
    """The store opened as every command and server opens it (SQLite only: PostgreSQL's
    writers wait on row locks, woken by the server)."""
    from better_compute.domain.access import LOCAL_OPERATOR as OP
    from better_compute.domain.tenant import Tenant, tenant_uuid
    from tests.support import open_runtime, store_env

    runtime = open_runtime(store_env("sqlite", tmp_path))
    try:
        runtime.service.tenants_create(OP, "acme", None)  # the store's tables exist
        other = os.open(runtime.config.sqlite_path.with_name("store.sqlite-writer.lock"),  # type: ignore[union-attr]
                        os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(other, fcntl.LOCK_EX)  # another process writes
        done = threading.Event()

        def write() -> None:
            runtime.service.tenants_create(OP, "initech", None)
            done.set()

        writer = threading.Thread(target=write)
        writer.start()
        tenant = runtime.services.aggregates.get(Tenant, tenant_uuid("acme"))
        assert tenant is not None  # reads go on
        assert not done.wait(0.3)  # the write waits for the other process's
        os.close(other)  # it is done
        assert done.wait(30)
        writer.join(30)
        assert "initech" in {t["id"] for t in runtime.service.listing("tenant")}
    finally:
        runtime.close()
