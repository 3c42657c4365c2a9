"""Leader election: exactly one ``serve`` process of a deployment runs the controllers.

PostgreSQL: a session-level advisory lock, held on a dedicated connection
(not one of the store's pool), keyed by the store's schema so deployments
sharing a database do not block each other. When the leader dies its
connection closes and the lock is free; the others try again every
``retry`` seconds (default 1), so one takes over within seconds.

SQLite: an exclusive ``flock`` on ``controllers.lock`` in the data dir; the
kernel releases it when the process dies. Only processes on this machine
share an SQLite file, so that is the whole deployment.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path
from typing import Any, Protocol


class Leadership(Protocol):
    def try_acquire(self) -> bool: ...
    def still_leader(self) -> bool: ...
    def release(self) -> None: ...


class FileLeadership:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    def try_acquire(self) -> bool:
        if self._fd is not None:
            return True
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return False
        self._fd = fd
        return True

    def still_leader(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


class PostgresLeadership:
    def __init__(self, pg: dict[str, str], name: str) -> None:
        self.pg = pg
        self.name = name
        self._conn: Any = None

    def _connect(self) -> Any:
        from better_compute.api.store.store_url import session_connection

        return session_connection(self.pg, 5)

    def try_acquire(self) -> bool:
        import psycopg

        if self._conn is not None:
            return self.still_leader()
        try:
            conn = self._connect()
        except psycopg.Error:
            return False
        try:
            row = conn.execute("SELECT pg_try_advisory_lock(hashtext(%s))", (self.name,)).fetchone()
        except psycopg.Error:
            conn.close()
            return False
        if not row or not row[0]:
            conn.close()
            return False
        self._conn = conn
        return True

    def still_leader(self) -> bool:
        """The lock lives as long as its connection: check the connection answers."""
        import psycopg

        if self._conn is None:
            return False
        try:
            self._conn.execute("SELECT 1")
        except psycopg.Error:
            self._drop()
            return False
        return True

    def _drop(self) -> None:
        with contextlib.suppress(Exception):
            self._conn.close()
        self._conn = None

    def release(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.execute("SELECT pg_advisory_unlock(hashtext(%s))", (self.name,))
            self._drop()


def leadership_for(runtime: Any) -> Leadership:
    config = runtime.config
    if config.backend == "postgres":
        schema = config.pg.get("POSTGRES_SCHEMA") or "public"
        return PostgresLeadership(config.pg, f"better-compute controllers {schema}")
    return FileLeadership(Path(config.data_dir) / "controllers.lock")
