"""``GET /api/compute/events/watch``: the event log, live, one JSON line per event.

One ``WatchHub`` per server process follows the store's notification log
with one follower thread, which wakes right after this process's own commits
(the store's commit listener) and, for other processes' commits: on
PostgreSQL, on ONE ``LISTEN`` connection to the channel the library notifies
at each commit (plus a read every second, should a notification be lost
while that connection reconnects); on SQLite, by checking ``PRAGMA
data_version`` on a dedicated connection every ``BETTER_COMPUTE_WATCH_POLL``
seconds (default 0.005). Each wake reads every new event in pages of 500 and
hands them to the event loop in one call. The hub renders each event once
into a bounded window of recent events (``BETTER_COMPUTE_WATCH_WINDOW``
events, default 10,000, and ``BETTER_COMPUTE_WATCH_WINDOW_BYTES`` bytes of
lines, default 16 MiB, whichever is reached first) and wakes the streams; it
never waits for a stream.

Each stream keeps its own position (the last sequence it has read) and
copies the window's lines after it that its reader may see, at most
``MAX_WRITE_BYTES`` (256 KiB) or 1,000 lines per write, so a stream that is
behind catches up in few large writes and a reader that stops reading pins
at most one write (plus what its socket buffers). A stream that starts older
than the window (``since`` far back) reads the store itself, a page of
``CATCH_UP_PAGE`` events at a time (each write again at most 256 KiB), until
it reaches the window. A stream that has reached the window and then falls
out of it again (its reader reads slower than events arrive, by more than
the window) is ended with a ``fell_behind`` line saying where to resume
(``--since N``, which the CLI does by itself). So a slow reader only slows
itself, writers and other streams never wait for it, and the server holds
at most the window plus one write per stream.

A stream ends with an ``unauthenticated`` line as soon as its token is
revoked (the hub notes every ``token.revoked`` it publishes;
``credential_ended`` in api/http/watch_limits.py is also where a token's expiry will
end its streams).

The stream opens with a heartbeat line and sends another whenever no line
went out for ``BETTER_COMPUTE_WATCH_HEARTBEAT`` seconds (default 5):
``{"heartbeat": true, "head": N}``. ``head`` is the stream's position:
every event up to N that the reader may see has been sent before that line,
so a reader with a narrow ``types`` filter can checkpoint at N. It never
goes backwards. An error after the stream started is one last line
``{"error": {"code": "expired", "message": "..."}}`` before the stream ends.
"""

from __future__ import annotations

import bisect
import contextlib
import logging
import sqlite3
import threading
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import anyio.from_thread
import anyio.to_thread
import msgspec
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from better_compute.api.http.watch_limits import (
    MAX_WRITE_BYTES,
    WINDOW_BYTES,
    catch_up,
    credential_ended,
    fell_behind,
    revoked_tokens,
)
from better_compute.api.settings import env_seconds
from better_compute.api.store.eventlog import (
    PAGE_SIZE,
    AuditFilter,
    EventFilter,
    EventLog,
    LogEntry,
    filter_for,
)
from better_compute.api.store.outage import unavailable_on_outage
from better_compute.api.supervise import Retry
from better_compute.domain.access import Principal
from better_compute.domain.errors import BetterComputeError, InvalidInput

log = logging.getLogger("better_compute.watch")

WATCH_PATH = "/api/compute/events/watch"
MAX_LINES_PER_WRITE = 1000
PG_SAFETY_READ = 1.0  # seconds between reads when no commit was notified (PostgreSQL)

AUDIT_PARAMS = ("actor", "subject", "from", "to")  # as events.list takes them

_HTTP_STATUS = {
    "invalid_input": 400, "unauthenticated": 401, "permission_denied": 403,
    "not_found": 404, "expired": 410, "not_initialized": 503, "unavailable": 503,
}


class WatchHub:
    """The one follower of the notification log in this process, fanned out to streams."""

    def __init__(self, store: Any, *, sqlite_path: Path | None = None, window: int = 10_000,
                 poll_interval: float = 0.005, heartbeat: float = 5.0,
                 window_bytes: int = WINDOW_BYTES) -> None:
        self.store = store
        self.log = EventLog(store)
        self.sqlite_path = sqlite_path
        self.window = max(1, window)
        self.window_bytes = max(1, window_bytes)
        self._bytes = 0  # bytes of the lines in the window
        self.revoked: set[str] = set()  # tok_ ids of token.revoked events published so far
        self.poll_interval = poll_interval
        self.heartbeat = heartbeat
        self.head = 0  # last sequence the hub has read (loop thread only)
        self.floor = 0  # the window holds every event after floor up to head
        self.stopping = False
        self._seqs: list[int] = []
        self._entries: list[LogEntry] = []
        self._changed = anyio.Event()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._read_pos = 0  # last sequence read by the follower thread
        # Chunks already built since the last publish, by (position, filter): streams that
        # follow live with the same filter share one (bounded: at most 256 of up to 64 KiB).
        self._chunks: dict[tuple[int, EventFilter], tuple[bytes, int]] = {}
        store.add_commit_listener(self._on_commit)

    @classmethod
    def for_runtime(cls, runtime: Any) -> WatchHub:
        env = runtime.env
        return cls(
            runtime.store,
            sqlite_path=runtime.config.sqlite_path if runtime.config.backend == "sqlite" else None,
            window=int(env_seconds(env, "BETTER_COMPUTE_WATCH_WINDOW", 10_000)),
            poll_interval=env_seconds(env, "BETTER_COMPUTE_WATCH_POLL", 0.005),
            heartbeat=env_seconds(env, "BETTER_COMPUTE_WATCH_HEARTBEAT", 5.0),
            window_bytes=int(env_seconds(env, "BETTER_COMPUTE_WATCH_WINDOW_BYTES", WINDOW_BYTES)),
        )

    # ------------------------------------------------------------ lifecycle

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
                  ) -> None:
        """Follow the log until ``stop``; started in the server's lifespan task group."""
        head = await anyio.to_thread.run_sync(self.log.head)
        self.head = self.floor = self._read_pos = head
        async with anyio.create_task_group() as tg:
            if self.store.backend == "postgres":
                tg.start_soon(self._in_thread, self._listen_postgres)
            tg.start_soon(self._tick)
            tg.start_soon(self._stop_when_cancelled)
            task_status.started()
            # Not abandoned when cancelled: the follower may be handing a page to this loop,
            # and a hand-off the loop never runs would block that thread (and the process's
            # exit) for ever. ``stop`` ends it within one read.
            await self._in_thread(self._follow, abandon_on_cancel=False)
            tg.cancel_scope.cancel()

    @staticmethod
    async def _in_thread(function: Callable[[], None], *, abandon_on_cancel: bool = True) -> None:
        await anyio.to_thread.run_sync(function, abandon_on_cancel=abandon_on_cancel,
                                       limiter=anyio.CapacityLimiter(1))

    async def _stop_when_cancelled(self) -> None:
        try:
            await anyio.sleep_forever()
        finally:
            self.stop()

    async def _tick(self) -> None:
        """Wake every stream a few times per heartbeat period, so that each can send its
        heartbeat on time while waiting on one event (no timer per stream and wait)."""
        period = min(1.0, self.heartbeat / 4)
        while not self.stopping:
            await anyio.sleep(period)
            self._wake_streams()

    def stop(self) -> None:
        """End every stream (cleanly, so readers reconnect elsewhere) and the follower."""
        self.stopping = True
        self._stop.set()
        self._wake.set()
        self._changed.set()

    def _on_commit(self, sequence: int) -> None:
        self._wake.set()

    # ------------------------------------------------------- follower thread

    def _follow(self) -> None:
        """Follow until ``stop``; a failed read (the store away) is retried every 0.1-2 s,
        from the last event read: streams resume with no gap once the store is back."""
        retry = Retry("following the event log", log)
        while not self._stop.is_set():
            try:
                if self.store.backend == "postgres":
                    self._follow_postgres(retry)
                else:
                    self._follow_sqlite(retry)
            except anyio.RunFinishedError:
                return
            except Exception as exc:
                self._stop.wait(retry.failed(exc))

    def _follow_sqlite(self, retry: Retry) -> None:
        assert self.sqlite_path is not None
        connection = sqlite3.connect(str(self.sqlite_path), check_same_thread=False)
        try:
            version = None
            self._drain()
            retry.succeeded()
            while not self._stop.is_set():
                woken = self._wake.wait(self.poll_interval)
                self._wake.clear()
                now = connection.execute("PRAGMA data_version").fetchone()[0]
                if woken or now != version:
                    version = now
                    self._drain()
        finally:
            connection.close()

    def _follow_postgres(self, retry: Retry) -> None:
        self._drain()
        retry.succeeded()
        while not self._stop.is_set():
            self._wake.wait(PG_SAFETY_READ)
            self._wake.clear()
            self._drain()

    def _drain(self) -> None:
        """Read every event after the last one read, and hand each page to the loop at once."""
        while not self._stop.is_set():
            entries = self.log.read(self._read_pos, PAGE_SIZE)
            if not entries or self._stop.is_set():
                return
            self._read_pos = entries[-1].sequence
            anyio.from_thread.run_sync(self._publish, entries)
            if len(entries) < PAGE_SIZE:
                return

    def _listen_postgres(self) -> None:
        """Wake the follower at each commit of any process: LISTEN to the library's channel.

        Holds one connection of the store's pool for the life of the server
        (the only one the hub keeps: one per process, never one per stream).
        """
        from psycopg.sql import SQL, Identifier

        recorder = self.store.recorder
        retry = Retry("listening for commits", log)
        while not self._stop.is_set():
            try:
                with recorder.datastore.get_connection() as conn:
                    conn.execute(SQL("LISTEN {0}").format(Identifier(recorder.channel_name)))
                    self._wake.set()  # whatever was committed while nobody listened
                    retry.succeeded()
                    while not self._stop.is_set():
                        for _ in conn.notifies(timeout=0.5, stop_after=1):
                            self._wake.set()
            except Exception as exc:
                self._stop.wait(retry.failed(exc))

    # -------------------------------------------------------- event loop side

    def _publish(self, entries: list[LogEntry]) -> None:
        fresh = [e for e in entries if e.sequence > self.head]
        if not fresh:
            return
        self._entries.extend(fresh)
        self._seqs.extend(e.sequence for e in fresh)
        self._bytes += sum(len(e.line) for e in fresh)
        self.revoked.update(revoked_tokens(fresh))
        self.head = fresh[-1].sequence
        excess = len(self._entries) - self.window
        if excess > self.window // 4 or (excess > 0 and self.window < 4):
            self._drop_oldest(excess)
        if self._bytes > self.window_bytes:  # down to 3/4 of the bound, so trims are rare
            target, drop, freed = self.window_bytes * 3 // 4, 0, 0
            while drop < len(self._entries) - 1 and self._bytes - freed > target:
                freed += len(self._entries[drop].line)
                drop += 1
            self._drop_oldest(drop)
        self._chunks.clear()
        self._wake_streams()

    def _drop_oldest(self, count: int) -> None:
        if count <= 0:
            return
        self.floor = self._seqs[count - 1]
        self._bytes -= sum(len(e.line) for e in self._entries[:count])
        del self._entries[:count]
        del self._seqs[:count]

    def _wake_streams(self) -> None:
        changed, self._changed = self._changed, anyio.Event()
        changed.set()

    @property
    def changed(self) -> anyio.Event:
        """Set at the next publish or tick: take it BEFORE reading with ``after``."""
        return self._changed

    def after(self, position: int, flt: EventFilter, max_lines: int = MAX_LINES_PER_WRITE,
              max_bytes: int = MAX_WRITE_BYTES) -> tuple[list[bytes], int] | None:
        """Lines after ``position`` from the window (at most ``max_lines`` lines and
        ``max_bytes`` bytes with their newlines, or one longer line), and the new
        position; None: ``position`` is older than the window."""
        if position < self.floor:
            return None
        start = bisect.bisect_right(self._seqs, position)
        lines: list[bytes] = []
        size = 0
        end = min(len(self._entries), start + 5 * max_lines)
        for i in range(start, end):
            entry = self._entries[i]
            if flt.matches(entry):
                if lines and size + len(entry.line) + 1 > max_bytes:
                    break  # this one starts the next write
                lines.append(entry.line)
                size += len(entry.line) + 1
            position = entry.sequence
            if len(lines) >= max_lines:
                break
        return lines, position

    def chunk(self, position: int, flt: EventFilter) -> tuple[bytes, int] | None:
        """``after`` as one write (lines joined, each ending in a newline); None: too old."""
        key = (position, flt)
        hit = self._chunks.get(key)
        if hit is not None:
            return hit
        got = self.after(position, flt)
        if got is None:
            return None
        lines, position = got
        if lines:
            lines.append(b"")
        result = (b"\n".join(lines), position)
        if len(self._chunks) < 256 and len(result[0]) <= 65536:
            self._chunks[key] = result
        return result

    async def wait_beyond(self, position: int, timeout: float,
                          flt: EventFilter | None = None) -> None:
        """Return once the hub has read past ``position``, it stops, or ``timeout`` passed.

        With ``flt``, only once it has read an event after ``position`` that
        ``flt`` lets through (or the window no longer holds ``position``), so
        a caller interested in a few types does not wake for every event.
        """
        with anyio.move_on_after(timeout):
            while not self.stopping:
                if self.head > position:
                    if flt is None:
                        return
                    got = self.after(position, flt)
                    if got is None or got[0]:
                        return
                    position = got[1]
                    continue
                await self._changed.wait()


def _heartbeat(position: int) -> bytes:
    return b'{"heartbeat":true,"head":%d}\n' % position


def _error_line(exc: BetterComputeError) -> bytes:
    return msgspec.json.encode({"error": {"code": exc.code, "message": exc.message,
                                          **({"data": exc.data} if exc.data else {})}}) + b"\n"


class TokenCheck:
    """The stream's token, checked again by the same authentication when its end comes.

    An expired token fails ``authenticate`` like a revoked one (api/services/tokens.py),
    so a stream open when its token's lifetime (or rotation grace) ends gets
    the ``unauthenticated`` line and ends.
    """

    def __init__(self, service: Any, secret: str | None, principal: Principal) -> None:
        self.service = service
        self.secret = secret
        self.ends_at = principal.expires_at

    def due(self) -> bool:
        return self.ends_at is not None and self.service.clock() >= self.ends_at

    def check(self) -> None:
        """Raises Unauthenticated once the token no longer authenticates."""
        self.ends_at = self.service.authenticate(self.secret).expires_at


async def stream_events(hub: WatchHub, flt: EventFilter, since: int,
                        limiter: anyio.CapacityLimiter, token: TokenCheck | None = None,
                        principal: Principal | None = None
                        ) -> AsyncIterator[bytes]:
    """The lines of one watcher: events after ``since`` in order, heartbeats, maybe an error."""
    position = since
    live = False  # has read from the window: falling out of it again ends the stream
    yield _heartbeat(position)
    last_sent = time.monotonic()
    while not hub.stopping:
        ended = credential_ended(hub, principal)
        if ended is not None:
            yield _error_line(ended)
            return
        if token is not None and token.due():
            try:
                await anyio.to_thread.run_sync(token.check, limiter=limiter)
            except BetterComputeError as exc:
                yield _error_line(exc)
                return
        changed = hub.changed  # taken before reading: a publish after this read sets it
        got = hub.chunk(position, flt)
        if got is None and live:
            yield _error_line(fell_behind(hub, position))
            return
        if got is None:  # started older than the window: read the store, a page at a time
            try:
                data, position = await anyio.to_thread.run_sync(
                    lambda p=position: catch_up(hub, flt, p), limiter=limiter)
            except BetterComputeError as exc:
                yield _error_line(exc)
                return
        else:
            live = True
            data, position = got
        if data:
            yield data
            last_sent = time.monotonic()
        elif time.monotonic() - last_sent >= hub.heartbeat:
            yield _heartbeat(position)
            last_sent = time.monotonic()
        if position < hub.head:
            continue  # more to read (events this reader does not see count as read)
        await changed.wait()  # the next publish, or the hub's tick


def _error_response(exc: BetterComputeError) -> Response:
    return JSONResponse({"error": {"code": exc.code, "message": exc.message}},
                        status_code=_HTTP_STATUS.get(exc.code, 400))


def _parse_since(text: str | None) -> int | None:
    if text is None or text == "":
        return None
    try:
        return int(text)
    except ValueError:
        raise InvalidInput(
            f"since={text!r} is not a sequence: use the sequence of the last event you read"
        ) from None


async def watch_endpoint(request: Request) -> Response:
    state = request.app.state.bc
    hub: WatchHub = state.extra["watch_hub"]
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    secret = token.strip() if scheme.lower() == "bearer" else None
    service = state.runtime.service

    def admit() -> tuple[EventFilter, int, TokenCheck, Principal]:
        principal: Principal = service.authenticate(secret or None)
        check = TokenCheck(service, secret or None, principal)
        query = request.query_params
        unknown = set(query) - {"since", "types", *AUDIT_PARAMS}
        if unknown:
            raise InvalidInput(
                f"unknown query parameter(s) {', '.join(sorted(unknown))}: /events/watch takes "
                "since=SEQUENCE, types=GLOB,GLOB, actor, subject, from and to"
            )
        audit = AuditFilter.parse(query.get("actor"), query.get("subject"), query.get("from"),
                                  query.get("to"), service.clock())
        flt = filter_for(principal, query.getlist("types"), audit=audit)
        since = _parse_since(request.query_params.get("since"))
        head = hub.log.head()
        if since is None:
            return flt, head, check, principal
        hub.log.check_position(since, head)
        return flt, since, check, principal

    try:
        with unavailable_on_outage():
            flt, since, check, principal = await anyio.to_thread.run_sync(
                admit, limiter=state.limiter)
    except BetterComputeError as exc:
        return _error_response(exc)
    return StreamingResponse(
        request.app.state.metrics.stream(
            stream_events(hub, flt, since, state.limiter, check, principal)),
        media_type="application/x-ndjson",
        headers={"cache-control": "no-store", "x-accel-buffering": "no"},
    )


ROUTES = [Route(WATCH_PATH, watch_endpoint, methods=["GET"])]


@contextlib.asynccontextmanager
async def running_hub(state: Any) -> AsyncIterator[WatchHub]:
    """Run the process's hub for the life of the server (used by the app's lifespan)."""
    hub = WatchHub.for_runtime(state.runtime)
    state.extra["watch_hub"] = hub
    projections = getattr(state.runtime, "projections", None)
    if projections is not None:  # read models followed as far as the hub has read
        projections.head_source = lambda: hub.head
    async with anyio.create_task_group() as tg:
        await tg.start(hub.run)
        try:
            yield hub
        finally:
            hub.stop()
            tg.cancel_scope.cancel()


def stop_streams(app: Any) -> Callable[[], None]:
    """A callback that ends every watch stream of ``app`` (the server calls it on shutdown)."""

    def stop() -> None:
        state = getattr(app.state, "bc", None)
        hub = state.extra.get("watch_hub") if state is not None else None
        if hub is not None:
            hub.stop()

    return stop
