"""Store outages: which errors mean "the store is away", and failing fast while it is.

``outage_error(exc)`` is the ``Unavailable`` that a store exception means, or None when
it means a bug. On PostgreSQL every operational error counts (refused or reset
connections, the server shutting down or starting up, no pooled connection in time, a
lock or statement timeout, a full disk); on SQLite the errors a full, read-only or
failing disk gives (FULL, READONLY, IOERR, CANTOPEN, NOMEM) and a lock wait that ran out
(BUSY, LOCKED). Every boundary translates through it (JSON-RPC, /watch, the gateway,
the join routes), so a caller gets the stable code ``unavailable`` and a message that
says to retry, never ``internal``.

``StoreGuard`` watches every connection the store hands out (its datastores hand each one
out ``guarded``). On PostgreSQL a call that fails with a connection
error makes the guard probe the server with a fresh connection; when that fails too the
store is *down*: from then on every call fails at once with ``Unavailable`` instead of
waiting for a pooled connection (and the library retries connection errors ten times,
so each call would otherwise hang for minutes). A connection whose server takes no writes
(``read_only_sql_transaction``: a standby, a primary being demoted) is closed, so the pool
replaces it with one to whichever server is the primary now (several hosts with
``target_session_attrs=read-write``: docs/high-availability.md); the call answers
``unavailable``. At most every ``PROBE_INTERVAL`` one caller probes again; when a probe
connects, the pool's idle connections are checked (the ones the restart broke are dropped)
and calls go through again. On SQLite nothing
is refused (reads keep working on a full disk); the guard remembers that a write failed
until a write succeeds again, which is what ``/ready`` reports.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from eventsourcing.persistence import ConnectionUnavailableError

from better_compute.domain.errors import Unavailable

log = logging.getLogger("better_compute.store")

PROBE_INTERVAL = 0.5  # seconds between probes of a store that is down
PROBE_CONNECT_TIMEOUT = 2  # seconds (libpq's smallest)

# What libpq says when every host it reached is a standby (target_session_attrs=read-write,
# or primary): the primary is lost and a standby not yet promoted.
_NO_PRIMARY = ("session is read-only", "server is in hot standby mode")
NO_PRIMARY = "no PostgreSQL server takes writes (a standby not promoted yet?)"

# SQLite's primary result codes that mean the disk or the lock, not the statement.
_SQLITE_OUTAGE = {5: "BUSY", 6: "LOCKED", 7: "NOMEM", 8: "READONLY", 10: "IOERR",
                  13: "FULL", 14: "CANTOPEN"}


def _causes(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and the errors it was raised from (the library wraps the driver's)."""
    seen = 0
    current: BaseException | None = exc
    while current is not None and seen < 6:
        yield current
        current = current.__cause__ or current.__context__
        seen += 1


def _postgres_reason(error: BaseException) -> str | None:
    try:
        import psycopg
        import psycopg_pool
    except ImportError:  # pragma: no cover (both are dependencies)
        return None
    if isinstance(error, psycopg_pool.PoolTimeout):
        return "no database connection came free in time"
    if isinstance(error, psycopg_pool.PoolClosed):
        return "the connection pool is closed"
    if isinstance(error, psycopg.errors.LockNotAvailable):
        return "a lock wait timed out"
    if isinstance(error, psycopg.errors.QueryCanceled):
        return "a statement timed out"
    if isinstance(error, psycopg.errors.DiskFull):
        return "PostgreSQL's disk is full"
    if isinstance(error, psycopg.errors.ReadOnlySqlTransaction):
        return "PostgreSQL takes no writes (a standby, or a primary being demoted)"
    if isinstance(error, psycopg.OperationalError | psycopg.InterfaceError):
        state = getattr(error, "sqlstate", None) or ""
        if not state and any(m in str(error) for m in _NO_PRIMARY):
            return NO_PRIMARY
        if state.startswith("57P"):
            return "PostgreSQL is shutting down or starting up"
        if state.startswith("53"):
            return "PostgreSQL is out of resources (connections, memory or disk)"
        return "PostgreSQL is unreachable"
    return None


def outage_reason(exc: BaseException) -> str | None:
    """A short reason when ``exc`` means the store is unavailable (no host names in it)."""
    for error in _causes(exc):
        if isinstance(error, Unavailable):
            return error.data.get("reason") or error.message
        if isinstance(error, ConnectionUnavailableError):
            return "no store connection came free in time"
        if isinstance(error, sqlite3.Error):
            code = getattr(error, "sqlite_errorcode", None)
            if code is not None and code & 0xFF in _SQLITE_OUTAGE:
                return str(error)  # "database or disk is full", "disk I/O error", …
            return None
        reason = _postgres_reason(error)
        if reason is not None:
            return reason
    return None


def unavailable(reason: str) -> Unavailable:
    return Unavailable(
        f"the event store is unavailable: {reason}; the server keeps trying on its own, "
        "retry in a few seconds", data={"reason": reason})


def outage_error(exc: BaseException) -> Unavailable | None:
    """The ``Unavailable`` error ``exc`` means, or None when it is no outage (a bug)."""
    if isinstance(exc, Unavailable):
        return exc
    reason = outage_reason(exc)
    return unavailable(reason) if reason is not None else None


@contextmanager
def unavailable_on_outage() -> Iterator[None]:
    """Re-raise a store outage inside the block as ``Unavailable`` (other errors pass)."""
    try:
        yield
    except Exception as exc:
        mapped = outage_error(exc)
        if mapped is None or mapped is exc:
            raise
        raise mapped from exc


def _connection_lost(exc: BaseException) -> bool:
    """A PostgreSQL error that may mean the server is gone (not a lock or statement timeout)."""
    import psycopg
    import psycopg_pool

    for error in _causes(exc):
        if isinstance(error, psycopg_pool.PoolTimeout):
            return True
        if isinstance(error, psycopg.OperationalError | psycopg.InterfaceError):
            state = getattr(error, "sqlstate", None) or ""
            return not state or state.startswith(("08", "57P"))
    return False


def _read_only(exc: BaseException) -> bool:
    """A PostgreSQL connection that takes no writes: its server is (now) a standby."""
    try:
        import psycopg
    except ImportError:  # pragma: no cover
        return False
    return any(isinstance(e, psycopg.errors.ReadOnlySqlTransaction) for e in _causes(exc))


def _waited_for_the_pool(exc: BaseException) -> bool:
    """No pooled connection came free in time (the library would wait again, ten times)."""
    import psycopg_pool

    return any(isinstance(e, psycopg_pool.PoolTimeout | ConnectionUnavailableError)
               for e in _causes(exc))


class StoreGuard:
    """Fails store calls fast while PostgreSQL is down; remembers SQLite's failed writes.

    ``probe`` raises when the store cannot be reached (PostgreSQL: a fresh connection);
    None (SQLite) never refuses a call. ``recheck`` runs after a probe that succeeded
    following a failure (PostgreSQL: drop the pool's broken connections).
    """

    def __init__(self, probe: Callable[[], None] | None = None,
                 recheck: Callable[[], None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._probe = probe
        self._recheck = recheck
        self._clock = clock
        self.down_reason: str | None = None
        self.down_since: float | None = None
        self.write_failure: str | None = None
        self._probing = threading.Lock()
        self._probed_at = float("-inf")

    def admit(self) -> None:
        """Before a connection is handed out: refuse at once while the store is down."""
        if self.down_reason is None:
            return
        self._probe_now(force=False)
        reason = self.down_reason
        if reason is not None:
            raise unavailable(reason)

    def failed(self, exc: BaseException, *, writing: bool) -> bool:
        """A call failed with ``exc``; True when it was an outage (the caller translates)."""
        reason = outage_reason(exc)
        if reason is None:
            return False
        if writing:
            self.write_failure = reason
        if self._probe is not None and self.down_reason is None and _connection_lost(exc):
            self._probe_now(force=True)
        return True

    def wrote(self) -> None:
        """A write committed: the disk takes writes again."""
        if self.write_failure is not None:
            log.warning("the event store takes writes again")
            self.write_failure = None

    def _probe_now(self, *, force: bool) -> None:
        now = self._clock()
        if self._probe is None or (not force and now - self._probed_at < PROBE_INTERVAL):
            return
        if not self._probing.acquire(blocking=False):
            return  # another thread is probing: go by what is known
        try:
            self._probed_at = now
            try:
                self._probe()
            except Exception as exc:
                reason = outage_reason(exc) or "PostgreSQL is unreachable"
                if self.down_reason is None:
                    self.down_since = now
                    log.warning("the event store is unreachable (%s): calls answer "
                                "`unavailable` until it is back", exc)
                self.down_reason = reason
                return
            if self._recheck is not None:
                self._recheck()
            was_down, since = self.down_reason is not None, self.down_since
            self.down_reason = self.down_since = None  # calls go through before the log line
            if was_down:
                log.warning("the event store answers again after %.1fs", now - (since or now))
        finally:
            self._probing.release()


@contextmanager
def guarded(guard: StoreGuard, connection: AbstractContextManager[Any], *, writing: bool
            ) -> Iterator[Any]:
    """``connection`` (a datastore's, not yet entered) through ``guard``: refused at once
    while the store is down, its failures told to the guard and translated. The store's
    datastores hand out every connection so (api/store/sqlite_factory.py, pg_factory.py)."""
    guard.admit()
    try:
        with connection as conn:
            try:
                yield conn
            except Exception as exc:
                if _read_only(exc):  # the pool drops it; its next one finds the primary
                    conn.close()
                raise
    except Exception as exc:
        if guard.failed(exc, writing=writing):
            if guard.down_reason is not None:
                raise unavailable(guard.down_reason) from exc
            if _waited_for_the_pool(exc):  # not retried: one wait of the pool at most
                raise unavailable(outage_reason(exc) or "no connection") from exc
        raise
    if writing:
        guard.wrote()


def postgres_guard(datastore: Any) -> StoreGuard:
    """The guard of a PostgreSQL datastore: probes with a fresh connection of its own, made
    with every parameter the pool's are (several hosts with ``target_session_attrs``, TLS),
    so a probe succeeds only where the pool's connections would: a standby that a multi-host
    URL skips does not count as the store being back."""
    import psycopg

    pool = datastore.pool
    params = {k: v for k, v in dict(pool.kwargs or {}).items() if k != "row_factory"}
    options = " ".join(filter(None, [str(params.pop("options", "") or ""),
                                     f"-c statement_timeout={PROBE_CONNECT_TIMEOUT * 1000}"]))

    def probe() -> None:
        # Bounded on both ends: the connection (libpq, each host), the query (the server),
        # a peer that stops acknowledging (the kernel).
        with psycopg.connect(**{**params, "connect_timeout": PROBE_CONNECT_TIMEOUT,
                                "tcp_user_timeout": PROBE_CONNECT_TIMEOUT * 1000},
                             autocommit=True, options=options) as conn:
            conn.execute("SELECT 1")

    return StoreGuard(probe, pool.check)
