"""The library's PostgreSQL factory, connecting with a whole libpq conninfo.

The eventsourcing library builds its psycopg pool from five settings (host, port,
user, password, dbname) and nothing else, so TLS modes, unix sockets and several
hosts could not reach libpq. This factory lets the library build its datastore as
usual (pool size, timeouts, schema and the rest from the same environment), then,
before the pool ever opens, gives the pool every parameter of ``POSTGRES_CONNINFO``
(api/store/store_url.py): psycopg passes them to libpq as they are.

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
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from eventsourcing.postgres import PostgresFactory
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import dict_row

from better_compute.api.store.store_url import CONNINFO

TOPIC = f"{__name__}:ConninfoPostgresFactory"


class ConninfoPostgresFactory(PostgresFactory):
    def __init__(self, env: Any) -> None:
        super().__init__(env)
        conninfo = self.env.get(CONNINFO)
        if conninfo:
            # The pool is built closed (open=False): nothing has connected yet.
            self.datastore.pool.kwargs = {**conninfo_to_dict(conninfo), "row_factory": dict_row}
        datastore: Any = self.datastore
        schema = getattr(datastore, "schema", None)
        if schema:  # lower case, as the URL allows (api/store/store_url.py): no quotes
            kwargs: dict[str, Any] = dict(datastore.pool.kwargs or {})
            kwargs["options"] = " ".join(filter(None, [kwargs.get("options"),
                                                       f"-c search_path={schema}"]))
            datastore.pool.kwargs = kwargs
        original = datastore.transaction

        @contextmanager
        def transaction(*, commit: bool = False) -> Iterator[Any]:
            if not commit:  # no BEGIN, no COMMIT: see the docstring
                with datastore.get_connection() as conn, conn.cursor() as cursor:
                    yield cursor
                return
            with original(commit=True) as cursor:
                yield cursor

        datastore.transaction = transaction

