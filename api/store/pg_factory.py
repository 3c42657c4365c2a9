"""The library's PostgreSQL factory, with a datastore that connects with a whole libpq
conninfo, bounds its pool's waits, reads without transactions and guards its connections.

The eventsourcing library builds its psycopg pool from five settings (host, port,
user, password, dbname) and nothing else, so TLS modes, unix sockets and several
hosts could not reach libpq. ``StorePostgresFactory`` lets the library read its settings
from the environment as usual (pool size, timeouts, schema and the rest), then builds a
``StorePostgresDatastore`` with them, whose pool connects with every parameter of
``POSTGRES_CONNINFO`` (api/store/store_url.py; psycopg passes them to libpq as they are),
libpq's ``connect_timeout`` and ``tcp_user_timeout`` unless the URL names its own, and the
pool's ``reconnect_timeout`` (the library sets none of these). Nothing has connected yet;
the pool is never closed while the store is in use: after an outage it reconnects.

Fewer round trips per transaction: the schema's
``search_path`` is set once per connection (libpq ``options``), not by a ``SET LOCAL`` in
every transaction; and a read (``transaction(commit=False)``) opens no transaction at all:
its statements run as they come on the connection, which the library keeps in autocommit.
At PostgreSQL's READ COMMITTED, which the store runs at, each statement of a transaction
takes its own snapshot anyway, so a BEGIN and a COMMIT around reads would buy nothing but two
round trips each (four of our reads per create; the library's own reads open none).
What must see one state reads it under a lock, in a writing transaction
(``ReadModels.rows_at_position``). A writing transaction that did not raise ends with
COMMIT; one that raises rolls back (after every ROLLBACK psycopg forgets its prepared
statements, ``DEALLOCATE ALL``, and prepares them again).

``get_connection`` (which ``transaction``, the recorders and the read models' SQL take
connections from) goes through the store's guard (api/store/outage.py) once ``watch`` gave it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from eventsourcing.postgres import ConnectionPool, PostgresDatastore, PostgresFactory
from psycopg import Connection
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import DictRow, dict_row

from better_compute.api.store.outage import StoreGuard, guarded
from better_compute.api.store.store_url import CONNINFO

TOPIC = f"{__name__}:StorePostgresFactory"
# The pool retries a lost connection with a growing delay (1, 2, 4 … s) for this long, then
# forgets it and connects afresh when a call needs one: so once PostgreSQL is back, a
# connection is made at once, not at the end of a backoff grown long during the outage.
POOL_RECONNECT_TIMEOUT = 3.0
CONNECT_TIMEOUT = 5  # seconds libpq waits for a new connection (default: for ever)
TCP_USER_TIMEOUT_MS = 15_000  # a peer that acknowledges nothing for this long is gone


class StorePostgresDatastore(PostgresDatastore):
    """The library's datastore with the settings ``like`` was built with, its pool
    connecting with ``conninfo`` (else with ``like``'s five settings)."""

    guard: StoreGuard | None = None

    def __init__(self, like: PostgresDatastore, conninfo: str | None) -> None:
        pool = like.pool
        params = dict(pool.kwargs or {}) if not callable(pool.kwargs) else {}
        super().__init__(
            params.get("dbname", ""), params.get("host", ""), params.get("port", ""),
            params.get("user", ""), params.get("password", ""),
            connect_timeout=pool.timeout,
            idle_in_transaction_session_timeout=like.idle_in_transaction_session_timeout,
            pool_size=pool.min_size, max_overflow=pool.max_size - pool.min_size,
            max_waiting=pool.max_waiting, conn_max_age=pool.max_lifetime,
            pre_ping=like.pre_ping, lock_timeout=like.lock_timeout, schema=like.schema,
            pool_open_timeout=like.pool_open_timeout,
            get_password_func=pool.get_password_func,
            single_row_tracking=like.single_row_tracking,
            originator_id_type=like.originator_id_type,  # type: ignore[arg-type]
            enable_db_functions=like.enable_db_functions)
        if conninfo:
            params = {**conninfo_to_dict(conninfo), "row_factory": dict_row}
        # lower case, as the URL allows (api/store/store_url.py): no quotes
        params["options"] = " ".join(filter(None, [params.get("options"),
                                                   f"-c search_path={self.schema}"]))
        self.pool = ConnectionPool(
            connection_class=Connection[DictRow],
            kwargs={"connect_timeout": CONNECT_TIMEOUT, "tcp_user_timeout": TCP_USER_TIMEOUT_MS,
                    **params},  # the URL's own, when it names them, win
            min_size=pool.min_size, max_size=pool.max_size, open=False,
            configure=self.after_connect_func(), timeout=pool.timeout,
            max_waiting=pool.max_waiting, max_lifetime=pool.max_lifetime,
            check=ConnectionPool.check_connection if self.pre_ping else None,
            reconnect_timeout=POOL_RECONNECT_TIMEOUT, get_password_func=pool.get_password_func)

    def watch(self, guard: StoreGuard) -> None:
        """From now on, every connection through ``guard``."""
        self.guard = guard

    @contextmanager
    def get_connection(self) -> Iterator[Connection[DictRow]]:
        if self.guard is None:
            with super().get_connection() as conn:
                yield conn
            return
        with guarded(self.guard, super().get_connection(), writing=False) as conn:
            yield conn

    @contextmanager
    def transaction(self, *, commit: bool = False) -> Iterator[Any]:
        if not commit:  # no BEGIN, no COMMIT: see the module docstring
            with self.get_connection() as conn, conn.cursor() as cursor:
                yield cursor
            return
        with super().transaction(commit=True) as cursor:
            yield cursor


class StorePostgresFactory(PostgresFactory):
    def __init__(self, env: Any) -> None:
        super().__init__(env)
        library = self.datastore  # built from the environment; nothing connected yet
        self.datastore = StorePostgresDatastore(library, self.env.get(CONNINFO))
        library.close()
