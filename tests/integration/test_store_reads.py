"""A read on PostgreSQL opens no transaction (api/store/pg_factory.py).

At READ COMMITTED each statement takes its own snapshot, so a BEGIN and a COMMIT around a
read only cost two round trips; a create made four such reads. SQLite keeps its BEGIN: there a
read of several statements sees one snapshot.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from psycopg.pq import TransactionStatus

from better_compute.domain.access import LOCAL_OPERATOR as OP
from tests.fleet import offered_pool
from tests.support import open_runtime, store_env


def _in_transaction(sql: Any, cursor: Any) -> bool:
    if sql.postgres:
        return bool(cursor.connection.info.transaction_status != TransactionStatus.IDLE)
    return bool(cursor.sqlite_cursor.connection.in_transaction)


def test_reads_open_no_transaction_on_postgres_and_writes_do(runtime: Any) -> None:
    sql = runtime.projections.sql
    with sql.transaction(commit=False) as cursor:
        sql.execute(cursor, "SELECT COUNT(*) AS n FROM bc_rsv")
        assert cursor.fetchone()[0 if not sql.postgres else "n"] == 0
        assert _in_transaction(sql, cursor) is (not sql.postgres)
    with sql.transaction(commit=True) as cursor:
        sql.execute(cursor, "SELECT COUNT(*) FROM bc_rsv")
        assert _in_transaction(sql, cursor)

    # The store's own reads (an aggregate's events) and a create over them work as before.
    pool = offered_pool(runtime.service, nodes=2, gpus=16)
    rs = runtime.services.reservations
    doc = rs.create(OP, tenant_id="acme", pool_id=pool, gpus=1, duration="1h")
    assert rs.reservation(OP, doc["id"]).gpu_count == 1


def test_sqlite_reads_see_one_snapshot(tmp_path: Path) -> None:
    rt: Any = open_runtime(store_env("sqlite", tmp_path))
    try:
        sql = rt.projections.sql
        with sql.transaction(commit=False) as cursor:
            sql.execute(cursor, "SELECT COUNT(*) FROM bc_rsv")
            before = cursor.fetchone()[0]
            with sql.transaction(commit=True) as writer:  # another connection commits
                sql.execute(writer, "INSERT INTO bc_locks(name, n) VALUES ('snapshot', 1)")
            sql.execute(cursor, "SELECT COUNT(*) FROM bc_locks WHERE name = 'snapshot'")
            assert cursor.fetchone()[0] == 0  # not seen: the read's snapshot is older
            assert _in_transaction(sql, cursor) and before == 0
        with sql.transaction(commit=False) as cursor:
            sql.execute(cursor, "SELECT COUNT(*) FROM bc_locks WHERE name = 'snapshot'")
            assert cursor.fetchone()[0] == 1
    finally:
        rt.close()
