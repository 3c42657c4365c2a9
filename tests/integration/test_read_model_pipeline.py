"""A read inside a read model's transaction gets its own answer (api/store/store.py
``SqlRunner.transaction``).

On PostgreSQL those transactions run in psycopg's pipeline mode: a write's answer is read
whenever it arrives. psycopg gives every answer to the cursor that sent the statement, and a
cursor's ``execute`` forgets its earlier answers before it sends; so when one cursor sent
both, the answers of earlier writes that arrived during a read's ``execute`` became the read's
own. The library's ``_insert_tracking`` (reached from ``ReadModels._track``) then raised
``ProgrammingError: the last operation didn't produce records (command status: INSERT 0 1)``,
as a benchmark's ``projections.catch_up()`` did once on a pool of 2,200 nodes.
"""

from __future__ import annotations

import select
from typing import Any

from eventsourcing.persistence import Tracking


def _answers_arrived(sql: Any, cursor: Any) -> None:
    """The server's answers to every statement sent so far are on the client's socket,
    unread (what a full output buffer on the server does in a long batch)."""
    if not sql.postgres:
        return
    pgconn = cursor.connection.pgconn
    pgconn.send_flush_request()
    pgconn.flush()
    readable, _, _ = select.select([pgconn.socket], [], [], 30)
    assert readable, "the server did not answer within 30 s"


def test_a_read_after_writes_whose_answers_wait_gets_its_own_answer(runtime: Any) -> None:
    sql = runtime.projections.sql
    sql.create_tables(["CREATE TABLE IF NOT EXISTS test_pipeline (n INTEGER)"])
    tracking = runtime.projections.tracking
    name = "projection:test-pipeline:v1"
    for position in (1, 2):
        with sql.transaction(commit=True, durable=False) as cursor:
            for n in range(3):
                sql.execute(cursor, "INSERT INTO test_pipeline (n) VALUES (?)", (n,))
            _answers_arrived(sql, cursor)
            # What ReadModels._track and _position_in run after a batch's writes.
            tracking._insert_tracking(cursor, Tracking(notification_id=position,
                                                       application_name=name))
            assert tracking._max_tracking_id(name, cursor) == position
            sql.execute(cursor, "INSERT INTO test_pipeline (n) VALUES (?)", (9,))
            _answers_arrived(sql, cursor)
            sql.execute(cursor, "SELECT COUNT(*) AS n FROM test_pipeline")
            assert dict(cursor.fetchone())["n"] == 4 * position
    assert tracking.max_tracking_id(name) == 2
