"""The library's SQLite factory, with a datastore whose connections are guarded and whose
writers hold one lock across processes.

``StoreSQLiteDatastore`` is the library's ``SQLiteDatastore`` with ``get_connection`` (the
one method its ``transaction``, its recorders and the read models' SQL take connections
from) overridden: once ``watch`` gave it the store's guard (api/store/outage.py) and writer
lock (api/store/sqlite_writers.py), each connection goes through the guard, and a writing
one holds the writer lock for its transaction at ``synchronous = FULL`` (its commit is on
disk before it returns). Until then (while the library sets the store up) connections are
the library's own.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from eventsourcing.sqlite import SQLiteConnection, SQLiteDatastore, SQLiteFactory

from better_compute.api.store.outage import StoreGuard, guarded
from better_compute.api.store.sqlite_writers import WriterLock

TOPIC = f"{__name__}:StoreSQLiteFactory"


class StoreSQLiteDatastore(SQLiteDatastore):
    guard: StoreGuard | None = None
    writers: WriterLock | None = None

    def watch(self, guard: StoreGuard, writers: WriterLock) -> None:
        """From now on, every connection through ``guard``, every writer holding ``writers``."""
        self.guard, self.writers = guard, writers

    @contextmanager
    def get_connection(self, *, commit: bool) -> Iterator[SQLiteConnection]:
        if self.guard is None:
            with super().get_connection(commit=commit) as conn:
                yield conn
            return
        with guarded(self.guard, self._locked_connection(commit), writing=commit) as conn:
            yield conn

    @contextmanager
    def _locked_connection(self, commit: bool) -> Iterator[SQLiteConnection]:
        """The library's connection, holding the writer lock for its transaction when it
        writes."""
        with super().get_connection(commit=commit) as conn:
            if not commit or self.writers is None:
                yield conn
                return
            with self.writers.held():
                # Durable unless the caller says otherwise for this transaction: a connection a
                # read model's commit left at NORMAL (SqlRunner.transaction) is FULL again here.
                conn.cursor().execute("PRAGMA synchronous = FULL")
                yield conn


class StoreSQLiteFactory(SQLiteFactory):
    """The library's factory, its settings read from the environment as the library reads
    them, its datastore a ``StoreSQLiteDatastore``."""

    def __init__(self, env: Any) -> None:
        super().__init__(env)
        library = self.datastore  # built from the environment; nothing opened yet
        self.datastore = StoreSQLiteDatastore(
            library.pool.db_name, lock_timeout=library.pool.lock_timeout,
            single_row_tracking=library.single_row_tracking,
            originator_id_type=library.originator_id_type)
        library.close()
