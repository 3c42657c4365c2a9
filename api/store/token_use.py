"""When each API token was last used, kept beside the events (like api/store/node_presence.py).

Recording every authenticated call as an event, or as a write on the
request's path, would cost a write per request. Instead authentication
notes the use in memory (``seen``: a dict update under a lock), at most once
a minute per token and process, and ``flush`` writes what was noted in one
transaction: every few seconds in ``serve`` (a lifespan task) and when a
Runtime closes (the CLI's in-process mode). So ``lastUsedAt`` in
``tokens list`` is coarse: up to a minute early, and up to the flush
interval late.

``bc_token_use``: one row per token id, ``last_used`` in seconds since the
epoch (the authenticating process's clock). A newer time wins.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

import anyio
import anyio.abc

from better_compute.api.settings import env_seconds
from better_compute.api.supervise import Retry
from better_compute.projections.framework import Sql

log = logging.getLogger("better_compute.tokens")

TABLE = ("CREATE TABLE IF NOT EXISTS bc_token_use (token_id TEXT PRIMARY KEY, "
         "last_used DOUBLE PRECISION NOT NULL)")
RESOLUTION_S = 60.0  # a token's use is noted at most once a minute per process
FLUSH_INTERVAL_S = 10.0


class TokenUse:
    def __init__(self, sql: Sql) -> None:
        self.sql = sql
        self._lock = threading.Lock()
        self._noted: dict[str, float] = {}  # token id -> last time noted (epoch seconds)
        self._pending: dict[str, float] = {}

    @staticmethod
    def create_table(sql: Sql) -> None:
        sql.create_tables([TABLE])

    def seen(self, token_id: str, at: datetime) -> None:
        """A request authenticated with ``token_id`` at ``at`` (memory only)."""
        when = at.timestamp()
        with self._lock:
            if when - self._noted.get(token_id, float("-inf")) < RESOLUTION_S:
                return
            self._noted[token_id] = when
            self._pending[token_id] = when

    def flush(self) -> int:
        """Write the uses noted since the last flush; returns how many rows."""
        with self._lock:
            pending, self._pending = self._pending, {}
        if not pending:
            return 0
        try:
            with self.sql.transaction(commit=True) as cursor:
                for token_id, when in pending.items():
                    self.sql.execute(
                        cursor,
                        "INSERT INTO bc_token_use (token_id, last_used) VALUES (?, ?) "
                        "ON CONFLICT (token_id) DO UPDATE SET last_used = excluded.last_used "
                        "WHERE excluded.last_used > bc_token_use.last_used",
                        (token_id, when))
        except Exception:
            with self._lock:  # keep them for the next flush (newer notes win)
                for token_id, when in pending.items():
                    self._pending.setdefault(token_id, when)
            raise
        return len(pending)

    def last_used(self, token_ids: Iterable[str]) -> dict[str, str]:
        """token id -> RFC 3339 time of its last recorded use (absent: never recorded)."""
        ids = list(token_ids)
        if not ids:
            return {}
        marks = ", ".join("?" for _ in ids)
        with self.sql.transaction(commit=False) as cursor:
            self.sql.execute(cursor, f"SELECT token_id, last_used FROM bc_token_use WHERE "
                             f"token_id IN ({marks})", ids)
            rows: list[Any] = cursor.fetchall()
        out = {}
        for row in rows:
            at = datetime.fromtimestamp(float(row["last_used"]), UTC)
            out[str(row["token_id"])] = at.isoformat().replace("+00:00", "Z")
        return out


async def flush_token_use(state: Any, *,
                          task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
                          ) -> None:
    """``serve``'s lifespan task: flush the noted token uses every few seconds. A store
    outage is logged once (one line) and once more when a flush works again, as every
    retrying loop does (api/supervise.py ``Retry``): never a traceback every interval."""
    runtime = state.runtime
    interval = env_seconds(runtime.env, "BETTER_COMPUTE_TOKEN_USE_FLUSH", FLUSH_INTERVAL_S)
    use: TokenUse = runtime.service.token_use
    retry = Retry("recording the tokens' last use", log)
    task_status.started()
    while True:
        await anyio.sleep(interval)
        try:
            await anyio.to_thread.run_sync(use.flush)
        except Exception as exc:
            retry.failed(exc)  # the next try is the next interval's
        else:
            retry.succeeded()
