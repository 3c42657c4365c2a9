"""The PostgreSQL application recorder: every save is one statement, lock to commit.

The library's recorder pipelines ``BEGIN``, the events table's ``LOCK … IN
EXCLUSIVE MODE``, ``NOTIFY`` and the ``INSERT``, waits for their answers, and
only then sends ``COMMIT``. Between the lock and the commit the saving thread
runs Python several times (each statement queued, the answers read), and in a
server whose event loop fans events out to many /watch streams, every one of
those steps can wait for the GIL: the table lock is held that long, and the
next saves queue behind it (measured with 100 /watch streams).

This recorder calls one server-side function per save, in autocommit mode:
``SELECT * FROM bc_insert_<table>(events)`` takes the same lock, sends the
same ``NOTIFY``, inserts and returns the notification ids, and the statement's
own transaction commits as it ends. So the lock is held only while PostgreSQL
executes, never while this process waits, and a save is one round trip. The
order guarantee is the library's (commit order equals notification order,
which the gap-free tail of /watch relies on; the library's own function
skips the lock, reference/eventsourcing-facts.md). Errors are the library's
too: a conflicting aggregate version is its ``IntegrityError``.

A save whose events change a read model kept inline (the free-GPU index) is one transaction
instead: the same call, then that read model's writes, sent in pipeline mode and committed
at the pipeline's Sync (two round trips: the call's ids, then the rest).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from eventsourcing.persistence import InterfaceError, OperationalError, StoredEvent
from eventsourcing.postgres import PostgresApplicationRecorder, PostgresDatastore
from eventsourcing.utils import retry
from psycopg.sql import SQL, Identifier

from better_compute.api.store.pipeline import PipelineCursor

TOPIC = f"{__name__}:LockingFunctionApplicationRecorder"


class LockingFunctionApplicationRecorder(PostgresApplicationRecorder):
    """``insert_events`` as one call of a function that locks, notifies and inserts."""

    def __init__(self, datastore: PostgresDatastore, *, events_table_name: str = "stored_events"
                 ) -> None:
        super().__init__(datastore, events_table_name=events_table_name)
        schema = Identifier(self.datastore.schema)
        self.insert_function = f"bc_insert_{self.events_table_name}"
        function = Identifier(self.insert_function)
        table = Identifier(self.events_table_name)
        self.sql_create_statements.append(SQL(
            "CREATE OR REPLACE FUNCTION {schema}.{function}(events {schema}.{event_type}[]) "
            "RETURNS SETOF bigint LANGUAGE plpgsql AS $BODY$ "
            "BEGIN "
            "SET LOCAL lock_timeout = '{lock_timeout}s'; "
            "LOCK TABLE {schema}.{table} IN EXCLUSIVE MODE; "
            "NOTIFY {channel}; "
            "RETURN QUERY INSERT INTO {schema}.{table} "
            "(originator_id, originator_version, topic, state) "
            "SELECT originator_id, originator_version, topic, state FROM unnest(events) "
            "RETURNING notification_id; "
            "END; $BODY$"
        ).format(schema=schema, function=function, table=table,
                 event_type=Identifier(self.stored_event_type_name),
                 lock_timeout=self.datastore.lock_timeout,
                 channel=Identifier(self.channel_name)))
        self._call_insert = SQL(
            "SELECT notification_id FROM {schema}.{function}(%s) AS notification_id"
        ).format(schema=schema, function=function)

    @retry((InterfaceError, OperationalError), max_attempts=10, wait=0.2)
    def insert_events(self, stored_events: Sequence[StoredEvent], **kwargs: Any
                      ) -> Sequence[int] | None:
        if not stored_events:
            ids: Sequence[int] | None = super().insert_events(stored_events, **kwargs)
            return ids
        events = [self.construct_pg_stored_event(e.originator_id, e.originator_version,
                                                 e.topic, e.state) for e in stored_events]
        inline = kwargs.get("inline")
        with self.datastore.get_connection() as conn:
            assert conn.autocommit  # the statement is its own transaction
            if inline is None:
                with conn.cursor() as curs:
                    curs.execute(self._call_insert, (events,), prepare=True)
                    return [int(row["notification_id"]) for row in curs.fetchall()]
            # With read models kept inline: their writes in the same transaction, after the
            # insert (the lock is held from it to the commit), in pipeline mode: the insert's
            # ids are the one answer waited for before the commit. No BEGIN and no COMMIT:
            # what a pipeline sends before its Sync (at the block's end) is ONE transaction in
            # PostgreSQL's extended protocol, committed at the Sync, or rolled back whole when
            # a statement fails (tests/integration/test_free_gpus_inline.py).
            with conn.pipeline():
                curs = conn.cursor()
                curs.execute(self._call_insert, (events,), prepare=True)
                ids = [int(row["notification_id"]) for row in curs.fetchall()]
                inline(PipelineCursor(curs), ids)
            return ids
