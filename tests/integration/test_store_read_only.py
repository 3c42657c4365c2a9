"""A PostgreSQL connection that takes no writes answers `unavailable`, and is replaced.

A connection whose server is a standby, or a primary being demoted, refuses every write with
``read_only_sql_transaction`` ("cannot execute INSERT in a read-only transaction"): that
answered `internal`. It is an outage like the others (api/store/outage.py): the call answers
`unavailable`, and the connection is closed, so the pool makes a new one, which a multi-host
URL with ``target_session_attrs=read-write`` opens to the primary (docs/high-availability.md).
Here the pool's connections are made read-only the way a standby's are (every transaction
read-only); PostgreSQL only, as SQLite has no such state.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from better_compute.api.store.outage import outage_error
from better_compute.domain.access import LOCAL_OPERATOR
from better_compute.domain.errors import Unavailable
from tests.support import open_runtime, quick_init, store_env


def test_a_connection_that_takes_no_writes_answers_unavailable_and_is_replaced(
        tmp_path: Path) -> None:
    runtime = open_runtime(store_env("postgres", tmp_path))
    try:
        quick_init(runtime)
        pool = runtime.store.recorder.datastore.pool  # type: ignore[attr-defined]
        held = [pool.getconn(timeout=10) for _ in range(pool.get_stats()["pool_size"])]
        for conn in held:
            conn.execute("SET default_transaction_read_only = on")
        for conn in held:
            pool.putconn(conn)

        def create(n: int) -> None:
            runtime.service.sites_create(LOCAL_OPERATOR, "shared", "eu-1", None, f"ro-{n}")

        refused = 0
        for n in range(len(held) + 1):
            try:
                create(n)
            except Exception as exc:
                mapped = outage_error(exc)
                assert isinstance(mapped, Unavailable), repr(exc)
                assert "takes no writes" in mapped.message
                refused += 1
                continue
            break
        else:
            pytest.fail("every connection stayed read-only: none was replaced")
        assert 1 <= refused <= len(held)
        assert sum(c.closed for c in held) >= refused  # each one that refused was dropped
    finally:
        runtime.close()
