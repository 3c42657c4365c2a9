"""Named locks across the processes of one store: one holder at a time per name, from a
read to the save that follows it.

A tenant's creates and releases all change its one quota use (domain/quota.py). Threads of
one process hold a thread lock for it (``ReservationCore.quota_lock``); without a lock
across processes, two workers of ``serve --workers N`` read the same version, both place
and book, and one loses its save and places again. A named lock makes the second wait for
the first's save instead. The locks only save work: correctness never rests on them (the
store refuses a save of a version another wrote), so a lock that cannot be taken in
``WAIT_S`` (a holder stopped, the database away) is given up and the caller goes on
without it.

- SQLite (``FileLocks``): POSIX record locks on one file beside the store
  (``store.sqlite-locks.lock``), a byte per bucket of names (crc32, 65,536 buckets: two
  names in one bucket only wait for each other). A process's record locks do not exclude
  its own threads, so a thread lock per bucket comes first. The kernel drops them with
  their process. Two stores opened on one file in one process (tests do) share its record
  locks, and closing one drops the other's: a saving lost, never a guarantee.
- PostgreSQL (``AdvisoryLocks``): session advisory locks on connections of their own (one
  per lock held at once, kept for the next; at most ``PG_CONNECTIONS`` per process, beyond
  which a lock is gone without, so the locks never take a server's connections from its
  other work), keyed by the schema and the name; a connection whose unlock failed is
  closed, so no lock outlives its holder.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import threading
import time
import zlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol

log = logging.getLogger("better_compute.store")

WAIT_S = 30.0  # the longest wait for a lock; then the caller goes on without it
PG_CONNECTIONS = 8  # per process: locks held at once on PostgreSQL, beyond which none is taken
_BUCKETS = 65536


_warned: dict[str, float] = {}


def _give_up(why: str) -> None:
    """Log that a lock was gone without, at most once a minute per cause (a database away
    would otherwise log at every create)."""
    now = time.monotonic()
    cause = why.split(" (", 1)[0]
    if now - _warned.get(cause, -60.0) >= 60.0:
        _warned[cause] = now
        log.warning("named locks: %s: going on without it (the store still refuses a stale save)",
                    why)


class NamedLocks(Protocol):
    def hold(self, name: str) -> contextlib.AbstractContextManager[bool]:
        """The lock of ``name``, held for the ``with`` block; True when it was taken."""
        ...

    def close(self) -> None: ...


class NoLocks:
    """No other process shares the store (or none is known): nothing to take."""

    @contextlib.contextmanager
    def hold(self, name: str) -> Iterator[bool]:
        yield True

    def close(self) -> None:
        pass


class FileLocks:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None
        self._guard = threading.Lock()
        self._buckets: dict[int, threading.Lock] = {}

    def _file(self) -> int:
        with self._guard:
            if self._fd is None:
                self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
            return self._fd

    @contextlib.contextmanager
    def hold(self, name: str) -> Iterator[bool]:
        bucket = zlib.crc32(name.encode()) % _BUCKETS
        with self._guard:
            local = self._buckets.setdefault(bucket, threading.Lock())
        with local:
            taken = self._take(bucket)
            try:
                yield taken
            finally:
                if taken:
                    fcntl.lockf(self._file(), fcntl.LOCK_UN, 1, bucket)

    def _take(self, bucket: int) -> bool:
        """The record lock of ``bucket``, polled (a blocking wait could not give up)."""
        try:
            fd = self._file()
        except OSError as exc:
            _give_up(f"cannot open {self.path} ({exc})")
            return False
        give_up, pause = time.monotonic() + WAIT_S, 0.0002
        while True:
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, bucket)
                return True
            except OSError:
                if time.monotonic() > give_up:
                    _give_up(f"waited {WAIT_S:.0f} s for a lock at {self.path}")
                    return False
                time.sleep(pause)
                pause = min(pause * 2, 0.002)

    def close(self) -> None:
        with self._guard:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None


class AdvisoryLocks:
    def __init__(self, pg: Mapping[str, str], schema: str) -> None:
        self.pg = dict(pg)
        self.schema = schema
        self._idle: list[Any] = []
        self._open = 0  # connections, idle or holding a lock
        self._guard = threading.Lock()

    def _connection(self) -> Any:
        """An idle connection, a new one, or None when ``PG_CONNECTIONS`` hold locks."""
        with self._guard:
            if self._idle:
                return self._idle.pop()
            if self._open >= PG_CONNECTIONS:
                return None
            self._open += 1
        from better_compute.api.store.store_url import session_connection

        try:
            conn = session_connection(self.pg, 2)
            conn.execute(f"SET lock_timeout = '{int(WAIT_S * 1000)}ms'")
        except BaseException:
            self._closed(None)
            raise
        return conn

    def _closed(self, conn: Any) -> None:
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()
        with self._guard:
            self._open -= 1

    @contextlib.contextmanager
    def hold(self, name: str) -> Iterator[bool]:
        import psycopg

        key = f"{self.schema}/lock/{name}"
        conn = None
        try:
            conn = self._connection()
            if conn is not None:
                conn.execute("SELECT pg_advisory_lock(hashtext(%s))", (key,))
        except psycopg.Error as exc:
            _give_up(f"cannot take a lock ({exc})")
            if conn is not None:
                self._closed(conn)
                conn = None
        if conn is None:
            yield False
            return
        try:
            yield True
        finally:
            try:
                conn.execute("SELECT pg_advisory_unlock(hashtext(%s))", (key,))
            except psycopg.Error:
                self._closed(conn)  # the lock goes with its session
            else:
                with self._guard:
                    self._idle.append(conn)

    def close(self) -> None:
        with self._guard:
            idle, self._idle = self._idle, []
        for conn in idle:
            self._closed(conn)


def locks_for(config: Any) -> NamedLocks:
    """The named locks of the store ``config`` (api/store/store.py ``StoreConfig``) names."""
    if config.backend == "postgres":
        return AdvisoryLocks(config.pg, config.pg.get("POSTGRES_SCHEMA") or "public")
    return FileLocks(Path(f"{config.sqlite_path}-locks.lock"))
