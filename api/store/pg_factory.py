"""The library's PostgreSQL factory, connecting with a whole libpq conninfo.

The eventsourcing library builds its psycopg pool from five settings (host, port,
user, password, dbname) and nothing else, so TLS modes, unix sockets and several
hosts could not reach libpq. This factory lets the library build its datastore as
usual (pool size, timeouts, schema and the rest from the same environment), then,
before the pool ever opens, gives the pool every parameter of ``POSTGRES_CONNINFO``
(api/store/store_url.py): psycopg passes them to libpq as they are.
"""

from __future__ import annotations

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
