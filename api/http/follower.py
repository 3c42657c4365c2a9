"""The follower of the event log in a server process, fanned out to /watch streams.

One ``WatchHub`` per server process follows the store's notification log
with one follower thread. While a /watch stream is open it wakes right after
this process's own commits (the store's commit listener) and, for other
processes' commits: on PostgreSQL, on ONE ``LISTEN`` connection to the channel
the library notifies at each commit (plus a read every second, should a
notification be lost while that connection reconnects); on SQLite, by checking
``PRAGMA data_version`` on a dedicated connection every
``BETTER_COMPUTE_WATCH_POLL`` seconds (default 0.005). With no stream open, it
reads at most every 50 ms, whatever committed meanwhile at once (the
controllers and the gateway's sessions that wait on it need no quicker
wake-up). Each wake reads every new event in pages of 500 and
hands them to the event loop in one call. The hub keeps them, as stored, in
a bounded window of recent events (``BETTER_COMPUTE_WATCH_WINDOW`` events,
default 10,000, and ``BETTER_COMPUTE_WATCH_WINDOW_BYTES`` bytes, default
16 MiB, whichever is reached first: the bytes of the lines, or of the stored
events not rendered yet) and wakes the streams; it never waits for a stream.
An event's public line is rendered lazily and once: when the first reader
needs it, shared by every stream after it; a reader that filters on types
alone (the controllers' wake-ups) renders nothing, and with no stream reading
nothing is rendered at all.

A hub nobody reads (no /watch stream open, no caller of ``wait_beyond`` in the last two
heartbeat periods: a worker of ``serve --workers`` that runs neither the controllers nor the
gateway) reads nothing: commits only wake it to find that out. When a reader comes, it reads
what came meanwhile, or the last window's worth of it when more came (a stream from an older
position reads the store until it reaches the window, as one older than the window always
did; a waiter from an older position is answered at once); until then streams read the
store.

The HTTP stream that reads it is api/http/watch.py; what bounds the window and a
stream, api/http/watch_limits.py.
"""

from __future__ import annotations

import bisect
import contextlib
import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc
import anyio.from_thread
import anyio.to_thread

from better_compute.api.http.watch_limits import MAX_WRITE_BYTES, WINDOW_BYTES, revoked_tokens
from better_compute.api.settings import env_seconds
from better_compute.api.store.codec import event_class
from better_compute.api.store.eventlog import PAGE_SIZE, EventFilter, EventLog, LogEntry, render
from better_compute.api.store.outage import unavailable_on_outage
from better_compute.api.supervise import Retry

if TYPE_CHECKING:
    from eventsourcing.persistence import Notification

log = logging.getLogger("better_compute.watch")

MAX_LINES_PER_WRITE = 1000
PG_SAFETY_READ = 1.0  # seconds between reads when no commit was notified (PostgreSQL)
# With no /watch stream open, commits are read at most this often, a batch at a time (the
# controllers and the gateway's sessions, which wait on the hub, need no quicker wake-up;
# a read and a hand-off to the event loop per commit cost ~1 ms of a create's CPU).
IDLE_POLL = 0.05


@lru_cache(maxsize=512)
def _type_of(topic: str) -> str:
    """An event's public type from its stored topic (what a type filter matches)."""
    return str(event_class(topic).TOPIC)


def _types_only(flt: EventFilter) -> bool:
    """Whether ``flt`` looks at nothing but the type: it matches without rendering."""
    return (flt.tenant_id is None and flt.actor is None and flt.subject is None
            and flt.since_time is None and flt.until_time is None)


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
        self._types: list[str] = []
        # As read from the store, each replaced by its rendered LogEntry when first needed.
        self._entries: list[LogEntry | Notification] = []
        self._decode = store.mapper.to_domain_event
        self._changed = anyio.Event()
        self._new_event: Callable[[], anyio.Event] = anyio.Event
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._read_pos = 0  # last sequence read by the follower thread
        self._streams_until = 0.0  # monotonic time until which streams count as reading
        self._waited_until = 0.0  # monotonic time until which ``wait_beyond`` counts as reading
        self._streams = 0  # /watch streams open (``reading``)
        # Nobody read: the follower stopped reading (``_wanted``), and the window is not kept
        # until it resumes (set in the follower's thread, cleared in the loop's).
        self._idle = False
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
        # The loop's own event class: ``anyio.Event()`` looks the backend up at every publish.
        self._new_event = type(anyio.Event())
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
        if self._streams:  # else the next poll reads it (``IDLE_POLL``)
            self._wake.set()

    def _wanted(self) -> bool:
        """Whether anybody reads the hub: an open stream, or a caller of ``wait_beyond`` (the
        controllers, the gateway's sessions) in the last two heartbeat periods."""
        return self._streams > 0 or time.monotonic() < self._waited_until

    @contextlib.contextmanager
    def reading(self) -> Iterator[None]:
        """Held by a /watch stream for as long as it is open."""
        self._streams += 1
        if self._idle:
            self._wake.set()
        try:
            yield
        finally:
            self._streams -= 1

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
                streams = time.monotonic() < self._streams_until
                woken = self._wake.wait(self.poll_interval if streams
                                        else max(self.poll_interval, IDLE_POLL))
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
            if not self._streams:  # commits read together, at most every ``IDLE_POLL``
                self._stop.wait(IDLE_POLL)
            self._wake.wait(PG_SAFETY_READ)
            self._wake.clear()
            self._drain()

    def _drain(self) -> None:
        """Read every event after the last one read, and hand each page to the loop at once;
        nothing while nobody reads the hub, and from the log's head once somebody does."""
        if not self._wanted():
            self._idle = True
            return
        if self._idle:  # read what came meanwhile, at most a window's worth of it
            with unavailable_on_outage():
                head = self.log.head()
            self._read_pos = max(self._read_pos, head - self.window)
            anyio.from_thread.run_sync(self._resume, self._read_pos)
        recorder = self.store.recorder
        while not self._stop.is_set():
            with unavailable_on_outage():  # read as stored: rendered when a reader needs it
                notes = recorder.select_notifications(start=self._read_pos, limit=PAGE_SIZE,
                                                      inclusive_of_start=False)
            if not notes or self._stop.is_set():
                return
            self._read_pos = notes[-1].id
            anyio.from_thread.run_sync(self._publish, notes)
            if len(notes) < PAGE_SIZE:
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

    def _publish(self, entries: Sequence[LogEntry | Notification]) -> None:
        """Add events read from the store (or already rendered) to the window; wake streams."""
        head = self.head
        fresh = [e for e in entries if _sequence(e) > head]
        if not fresh:
            return
        start = len(self._entries)
        self._entries.extend(fresh)
        self._seqs.extend(_sequence(e) for e in fresh)
        self._types.extend(e.type if isinstance(e, LogEntry) else _type_of(e.topic)
                           for e in fresh)
        self._bytes += sum(_size(e) for e in fresh)
        revoked = [self._entry(i) for i in range(start, len(self._entries))
                   if self._types[i] == "token.revoked"]
        if revoked:
            self.revoked.update(revoked_tokens(revoked))
        self.head = self._seqs[-1]
        excess = len(self._entries) - self.window
        if excess > self.window // 4 or (excess > 0 and self.window < 4):
            self._drop_oldest(excess)
        if self._bytes > self.window_bytes:  # down to 3/4 of the bound, so trims are rare
            target, drop, freed = self.window_bytes * 3 // 4, 0, 0
            while drop < len(self._entries) - 1 and self._bytes - freed > target:
                freed += _size(self._entries[drop])
                drop += 1
            self._drop_oldest(drop)
        self._chunks.clear()
        self._wake_streams()

    def _resume(self, start: int) -> None:
        """The hub was idle and reads on from ``start``: the events after its head, or (more
        came meanwhile than the window holds) the window's worth before the log's head."""
        if start > self.head:
            self._drop_oldest(len(self._entries))
            self.floor = self.head = start
            self._chunks.clear()
        self._idle = False
        self._wake_streams()

    def _drop_oldest(self, count: int) -> None:
        if count <= 0:
            return
        self.floor = self._seqs[count - 1]
        self._bytes -= sum(_size(e) for e in self._entries[:count])
        del self._entries[:count]
        del self._seqs[:count]
        del self._types[:count]

    def _entry(self, i: int) -> LogEntry:
        """The window's ``i``-th event, rendered (once: kept for every later reader)."""
        item = self._entries[i]
        if isinstance(item, LogEntry):
            return item
        entry = render(item, self._decode)
        self._entries[i] = entry
        self._bytes += len(entry.line) - _size(item)
        return entry

    def _matches(self, flt: EventFilter, i: int) -> bool:
        if _types_only(flt):
            return flt.types is None or bool(flt.types.match(self._types[i]))
        return bool(flt.matches(self._entry(i)))

    def _wake_streams(self) -> None:
        changed, self._changed = self._changed, self._new_event()
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
            if self._matches(flt, i):
                line = self._entry(i).line
                if lines and size + len(line) + 1 > max_bytes:
                    break  # this one starts the next write
                lines.append(line)
                size += len(line) + 1
            position = self._seqs[i]
            if len(lines) >= max_lines:
                break
        return lines, position

    def chunk(self, position: int, flt: EventFilter) -> tuple[bytes, int] | None:
        """``after`` as one write (lines joined, each ending in a newline); None: too old."""
        if self._idle:  # the window is not kept: read from the store until it is again
            self._wake.set()
            return None
        now = time.monotonic()
        if now >= self._streams_until:  # the first stream for a while: check every poll again
            self._wake.set()
        self._streams_until = now + 2 * self.heartbeat  # a stream reads at least every tick
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
        self._waited_until = time.monotonic() + max(2 * self.heartbeat, timeout)
        if self._idle:
            self._wake.set()
        await self._wait_beyond(position, timeout, flt)

    async def _wait_beyond(self, position: int, timeout: float, flt: EventFilter | None
                           ) -> None:
        with anyio.move_on_after(timeout):
            while not self.stopping:
                if self.head > position:
                    if flt is None or position < self.floor:
                        return
                    start = bisect.bisect_right(self._seqs, position)
                    if any(self._matches(flt, i) for i in range(start, len(self._seqs))):
                        return  # (rendering nothing when ``flt`` looks at types alone)
                    position = self.head
                    continue
                await self._changed.wait()


def _sequence(item: LogEntry | Notification) -> int:
    return item.sequence if isinstance(item, LogEntry) else int(item.id)


def _size(item: LogEntry | Notification) -> int:
    """What an event of the window counts for its bytes: its line, or its stored state."""
    return len(item.line) if isinstance(item, LogEntry) else len(item.state)
