"""A cursor for transactions in psycopg's pipeline mode (PostgreSQL)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any


class PipelineCursor:
    """A cursor of a transaction in psycopg's pipeline mode, each statement on a cursor of
    its own.

    psycopg hands every answer to the cursor that sent the statement, whenever it arrives,
    and ``execute`` forgets a cursor's earlier answers before it sends. On one shared cursor,
    answers of earlier writes that arrived while a read was being sent became the read's
    own (``the last operation didn't produce records (command status: INSERT 0 1)`` from the
    library's ``_insert_tracking``). A cursor per statement keeps each answer with its own
    statement; errors still raise from the fetch or the pipeline's end."""

    def __init__(self, cursor: Any) -> None:
        self.connection = cursor.connection
        self._cursor = cursor

    def execute(self, query: Any, params: Any = None, **kwargs: Any) -> PipelineCursor:
        self._cursor = self.connection.cursor()
        self._cursor.execute(query, params, **kwargs)
        return self

    def executemany(self, query: Any, params_seq: Any, **kwargs: Any) -> None:
        self._cursor = self.connection.cursor()
        self._cursor.executemany(query, params_seq, **kwargs)

    def fetchone(self) -> Any:
        return self._cursor.fetchone()

    def fetchall(self) -> list[Any]:
        return self._cursor.fetchall()  # type: ignore[no-any-return]

    def __iter__(self) -> Iterator[Any]:
        return iter(self._cursor)
