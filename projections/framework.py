"""Read models kept from the event log, on the event store's own tracking machinery.

``ReadModel`` is one read model (its tables, how an event changes them); ``ReadModels`` applies
the notification log to a store's read models, on demand (``catch_up``) or as followed
(``follow``). The eventsourcing library's ``Projection`` and ``ProjectionRunner`` are other
things (an event processor, and a thread that runs one on a subscription); these names keep
them apart. The read models are still called projections in the docs and the CLI
(``better-compute projections status``), as the event-sourcing term.

A read model owns its tables and one tracking position in
the library's tracking table, keyed by the projection's name. It is applied
in batches; each batch writes the read model's rows and the new tracking
position in ONE transaction, so every event counts exactly once even when a
process dies between two batches, and a replayed position is refused.

Catching up takes a per-projection lock inside the transaction and re-reads
the position there, so several processes (CLI, several ``serve`` replicas)
can catch up the same projection at once without applying anything twice.
"""

from __future__ import annotations

import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from eventsourcing.persistence import Notification, Tracking, TrackingRecorder


class Sql(Protocol):
    """What a projection needs of the database (api/store/store.py provides it)."""

    postgres: bool

    def q(self, statement: str) -> str: ...
    def transaction(self, *, commit: bool, durable: bool = True) -> Any: ...
    def execute(self, cursor: Any, statement: str, params: Sequence[Any] = ()) -> None: ...
    def lock(self, cursor: Any, name: str) -> None: ...
    def try_lock(self, cursor: Any, name: str) -> bool: ...
    def exclude_saves(self, cursor: Any) -> int: ...
    def tracking_recorder(self) -> TrackingRecorder: ...
    def create_tables(self, statements: list[str]) -> None: ...


class SnapshotCodec(Protocol):
    """Aggregate snapshots as text, so a read model row can carry the aggregate's state."""

    def snapshot(self, aggregate: Any) -> tuple[str, str]: ...
    def restore(self, topic: str, state: str, originator_id: Any, version: int) -> Any: ...


def after_event(codec: SnapshotCodec, row: Any, event: Any) -> Any:
    """The aggregate once ``event`` applies to the snapshot a read model row holds."""
    previous = codec.restore(row["snapshot_topic"], row["snapshot"], event.originator_id,
                             event.originator_version - 1)
    return event.mutate(previous)


class EventSource(Protocol):
    """The notification log and its decoder (the Application provides both)."""

    def select(self, after: int, limit: int) -> Sequence[Notification]: ...
    def decode(self, notification: Notification) -> Any: ...
    def event_type(self, notification: Notification) -> type[Any]: ...
    def head(self) -> int: ...


class ReadModel(ABC):
    """One read model (a projection of the events). Subclasses give a name, their tables and
    ``apply``."""

    name: str
    version: int = 1  # bump to rebuild a read model whose shape changed

    @abstractmethod
    def tables(self) -> list[str]: ...

    @abstractmethod
    def table_names(self) -> list[str]: ...

    @abstractmethod
    def apply(self, sql: Sql, cursor: Any, sequence: int, event: Any) -> None:
        """Write what ``event`` changes; runs inside the batch's transaction."""

    def wants(self, event_type: type[Any]) -> bool:
        """Whether events of ``event_type`` can change this read model: the others are
        not decoded for it (its position still moves past them). All, by default."""
        return True

    def begin_batch(self) -> None:  # noqa: B027 (optional hook)
        """Before a batch's events: forget what an earlier batch that failed left behind."""

    def end_batch(self, sql: Sql, cursor: Any) -> None:  # noqa: B027 (optional hook)
        """After a batch's events, in its transaction: write what is derived once per batch."""

    def unsettled(self, sql: Sql, cursor: Any) -> bool:
        """Whether rows derived only when read wait to be brought up to date (``settle``)."""
        return False

    def settle(self, sql: Sql, cursor: Any) -> int:
        """Bring up to date the rows this read model derives only when they are read (under
        its lock; ``ReadModels.settle``); how many it recomputed. Nothing, by default."""
        return 0

    @property
    def tracking_name(self) -> str:
        return f"projection:{self.name}:v{self.version}"


@dataclass
class Pending:
    """An aggregate as a batch's events left it so far: the sequence that created it, whether
    its row is new, and the row it was read from (None for a new one)."""

    aggregate: Any
    created_seq: int
    new: bool
    row: Any = None


class SnapshotRows(ReadModel):
    """A read model with a row per aggregate that carries the aggregate's snapshot, applied
    a batch at a time per aggregate: each row is read (its snapshot) and written once per
    batch, however many of its aggregate's events the batch holds (a node takes one event
    per reservation bound on it; a create that starts now records two of its reservation's).
    Subclasses say which events and aggregates they keep, how a row is read and written."""

    def __init__(self, codec: SnapshotCodec) -> None:
        self.codec = codec
        self.begin_batch()

    def follows(self, event: Any) -> bool:
        """Whether ``event`` may change a row (False: skipped without a read): whether the
        read model ``wants`` its type."""
        return self.wants(type(event))

    def keeps(self, aggregate: Any) -> bool:
        """Whether a newly created ``aggregate`` gets a row."""
        return True

    @abstractmethod
    def read_row(self, sql: Sql, cursor: Any, uuid: str) -> Any:
        """The row of ``uuid`` (with ``snapshot_topic``, ``snapshot``, ``created_seq``), or
        None when there is none."""

    @abstractmethod
    def write(self, sql: Sql, cursor: Any, uuid: str, pending: Pending) -> None:
        """Write the row of ``uuid`` as the batch left it."""

    def begin_batch(self) -> None:
        self._pending: dict[str, Pending] = {}
        self._absent: set[str] = set()  # aggregates without a row here

    def apply(self, sql: Sql, cursor: Any, sequence: int, event: Any) -> None:
        if not self.follows(event):
            return
        uuid = str(event.originator_id)
        pending = self._pending.get(uuid)
        if pending is not None:
            pending.aggregate = event.mutate(pending.aggregate)
            return
        if uuid in self._absent:
            return
        if event.originator_version == 1:
            aggregate = event.mutate(None)
            if self.keeps(aggregate):
                self._pending[uuid] = Pending(aggregate, sequence, True)
            else:
                self._absent.add(uuid)
            return
        row = self.read_row(sql, cursor, uuid)
        if row is None:
            self._absent.add(uuid)
            return
        self._pending[uuid] = Pending(after_event(self.codec, row, event),
                                      int(row["created_seq"]), False, row)

    def end_batch(self, sql: Sql, cursor: Any) -> None:
        pending, self._pending = self._pending, {}
        for uuid, each in pending.items():
            self.write(sql, cursor, uuid, each)


@dataclass(frozen=True)
class ProjectionStatus:
    name: str
    position: int
    head: int

    @property
    def lag(self) -> int:
        return max(0, self.head - self.position)


class _Behind(Exception):
    """A batch read from a hint ahead of the projection's tracked position."""

    def __init__(self, position: int) -> None:
        super().__init__(position)
        self.position = position


class ReadModels:
    """A store's read models and their tracking: applies the notification log to them, on
    demand or from a follower."""

    def __init__(
        self, sql: Sql, source: EventSource, projections: Sequence[ReadModel],
        *, batch_size: int = 500, inline: Sequence[str] = (),
    ) -> None:
        self.sql = sql
        self.source = source
        self.projections = {p.name: p for p in projections}
        self.batch_size = batch_size
        self.tracking = sql.tracking_recorder()
        # Read models kept inline: applied by every save in its own transaction
        # (``apply_inline``), never followed. One apply at a time per process (a save holds
        # the store's write lock while it applies; a rebuild here takes it first).
        self.inline = {name: self.projections[name] for name in inline}
        self._inline_lock = threading.Lock()
        # Each projection's position as last applied or read here (a hint, checked under
        # the projection's lock before anything is applied).
        self._seen: dict[str, int] = {}
        # This process's follower of the log, once one runs (``Follower``): a caller that
        # needs a read model current waits for it instead of catching up by itself.
        self.follower: Follower | None = None
        # Called after each of the follower's passes (what is derived from the read models
        # as they now stand, kept in memory by the services).
        self.after_follow: list[Callable[[], None]] = []
        self._wanted: dict[tuple[str, str], bool] = {}  # (read model, topic): ``wants``
        statements: list[str] = []
        for projection in projections:
            statements.extend(projection.tables())
        sql.create_tables(statements)
        for projection in self.inline.values():
            self._establish(projection)

    def get(self, name: str) -> ReadModel:
        from better_compute.domain.errors import NotFound

        if name not in self.projections:
            raise NotFound(
                f"no projection {name!r}: projections are {', '.join(sorted(self.projections))}"
            )
        return self.projections[name]

    def position(self, projection: ReadModel) -> int:
        if projection.name in self.inline:  # every committed save applied it
            return self.source.head()
        return self.tracking.max_tracking_id(projection.tracking_name) or 0

    def catch_up(self, name: str | None = None, *, until: int | None = None) -> int:
        """Bring ``name`` (every read model: None) up to the head of the log as it is now;
        returns how many events were applied here. A read model kept inline has none to
        apply. Where this process's ``Follower`` runs, the caller waits for it to reach that
        head (one catch-up serves every caller waiting meanwhile); else it applies them
        itself."""
        names = [name] if name else list(self.projections)
        followed = [self.get(each) for each in names if each not in self.inline]
        follower = self.follower
        if follower is not None and until is None and followed and not follower.is_running_here():
            head = self.source.head()
            behind = [p for p in followed if self._seen.get(p.name, -1) < head]
            if not behind or follower.wait([p.name for p in behind], head):
                return 0
        return sum(self._catch_up_one(p, until) for p in followed)

    def followed(self, name: str) -> None:
        """``name`` as current as this process keeps it, for a periodic pass that needs no
        read of its own writes (the controllers): where a ``Follower`` runs, as it is (at most
        its period behind); else caught up here."""
        if self.follower is None:
            self.catch_up(name)

    def wait_for(self, name: str, position: int) -> None:
        """Return once ``name`` holds every event up to ``position`` (this process's own save,
        say): at once when it is known to; else as ``catch_up``."""
        if name in self.inline or self._seen.get(name, -1) >= position:
            return
        self.catch_up(name)

    def follow_all(self) -> None:
        """Every followed read model up to the head, together where they are in step (the
        ``Follower``'s pass): the first one's catch-up brings the others along."""
        reached = -1
        failed: list[BaseException] = []
        for projection in self.projections.values():
            if projection.name in self.inline or self._seen.get(projection.name, -2) == reached:
                continue
            try:
                self._catch_up_one(projection, None)
            except Exception as exc:  # the others still follow; raised once they did
                self._seen.pop(projection.name, None)
                failed.append(exc)
                continue
            reached = max(reached, self._seen.get(projection.name, -1))
        for each in self.after_follow:
            each()
        if failed:
            raise failed[0]

    def known_position(self, name: str) -> int:
        """The position this process last saw ``name`` at (-1: not yet): it holds at least
        every event up to there."""
        return self._seen.get(name, -1)

    # ------------------------------------------------------------ inline read models

    def inline_wants(self, events: Sequence[Any]) -> bool:
        """Whether a save of ``events`` changes a read model kept inline."""
        return any(p.wants(type(e)) for p in self.inline.values() for e in events)

    def apply_inline(self, cursor: Any, events: Sequence[Any], sequences: Sequence[int]
                     ) -> None:
        """A save's ``events`` (with the sequences the store gave them) applied to the read
        models kept inline, in the save's own transaction (``cursor``), under the store's
        write lock: the save and the rows it changes commit together."""
        with self._inline_lock:
            for projection in self.inline.values():
                projection.begin_batch()
                for sequence, event in zip(sequences, events, strict=True):
                    if projection.wants(type(event)):
                        projection.apply(self.sql, cursor, sequence, event)
                projection.end_batch(self.sql, cursor)

    def _establish(self, projection: ReadModel) -> None:
        """A read model kept inline, made to hold every event saved before it was kept so:
        once per version (its tracking row records that it is established), in one
        transaction that holds saves off, rebuilt from the log when rows of an older version
        or events of the store's past are there."""
        with self.sql.transaction(commit=True, durable=False) as cursor:
            head = self.sql.exclude_saves(cursor)
            if self._tracked_in(cursor, projection) is not None:
                return
            with self._inline_lock:
                self._rebuild_inline(cursor, projection, head)

    def _rebuild_inline(self, cursor: Any, projection: ReadModel, head: int) -> None:
        """Empty ``projection`` and apply the whole log up to ``head`` to it in the
        transaction of ``cursor`` (saves held off), then track ``head``."""
        for table in projection.table_names():
            self.sql.execute(cursor, f"DELETE FROM {table}")
        self._reset_tracking(cursor, projection)
        position = 0
        while position < head:
            batch = [n for n in self.source.select(position, self.batch_size) if n.id <= head]
            if not batch:
                break
            todo = [(n.id, self.source.decode(n)) for n in batch if self._wants(projection, n)]
            projection.begin_batch()
            for sequence, event in todo:
                projection.apply(self.sql, cursor, sequence, event)
            projection.end_batch(self.sql, cursor)
            position = batch[-1].id
        self._track(cursor, projection, head)

    def _tracked_in(self, cursor: Any, projection: ReadModel) -> int | None:
        table = "bc_tracking" if self.sql.postgres else "tracking"
        self.sql.execute(cursor, f"SELECT notification_id FROM {table} "
                         "WHERE application_name = ?", (projection.tracking_name,))
        row = cursor.fetchone()
        return None if row is None else int(row["notification_id"])

    def _apply_after(self, projection: ReadModel, batch: Sequence[Notification], start: int,
                     *, in_step: bool) -> int:
        """One batch read after ``start`` applied (with the read models in step, when
        ``in_step``), and ``start`` moved past it; the events applied to ``projection``.
        ``_Behind`` (the hint dropped) when its position was behind ``start``."""
        together = self._with_those_in_step(projection, batch, start) if in_step else None
        if together is None:
            try:
                together = self._apply_batch(projection, batch, start)
            except _Behind:
                self._seen.pop(projection.name, None)
                raise
        self._saw(projection, batch[-1].id)  # applied up to here (by this or another process)
        return together

    def _catch_up_one(self, projection: ReadModel, until: int | None) -> int:
        """Reads from where this process last saw the projection (its tracking position
        only the first time): a batch re-reads the position under the projection's lock
        anyway, and starts again from it when the hint was ahead (a rebuild elsewhere, an
        upgrade's reset); with nothing new, the position is read to tell. The read models
        this process saw at the same position come along (``_with_those_in_step``)."""
        applied = 0
        start = self._seen.get(projection.name)
        checked = start is None  # the hint is checked against the tracking position once
        if start is None:
            start = self.position(projection)
        while True:
            if until is not None and start >= until:
                return applied
            batch = self.source.select(start, self.batch_size)
            if not batch and not checked:  # nothing new: was the position reset meanwhile?
                checked, position = True, self.position(projection)
                if position < start:
                    self._seen.pop(projection.name, None)
                    start = position
                    continue
            if not batch:
                self._saw(projection, start)
                return applied
            try:
                applied += self._apply_after(projection, batch, start, in_step=until is None)
            except _Behind as behind:
                start, checked = behind.position, True
                continue
            start = batch[-1].id
            if len(batch) < self.batch_size:
                return applied  # that was the head when read: no second read for nothing

    def _with_those_in_step(self, projection: ReadModel, batch: Sequence[Notification],
                            start: int) -> int | None:
        """``batch`` applied to ``projection`` together with every other followed read
        model this process saw at the same position ``start``: decoded once, applied to each
        in ONE transaction (each under its own lock, its position re-read there), instead of
        one read, one decoding and one transaction per read model. None when no other read model
        is in step or the shared batch failed: then ``projection`` takes the batch alone, and the
        others, whose hints are dropped, catch up alone too, so a read model that cannot apply
        an event holds back only itself. Returns the events applied to ``projection``."""
        if projection.name in self.inline or self._seen.get(projection.name) != start:
            return None
        group = sorted((p for p in self.projections.values()
                        if p.name not in self.inline and self._seen.get(p.name) == start),
                       key=lambda p: p.name)
        if len(group) < 2:
            return None
        try:
            counts = self._apply_together(projection, group, batch, start)
        except Exception:
            for other in group:
                if other is not projection:
                    self._seen.pop(other.name, None)
            return None
        if projection.name not in counts:  # its position was behind: alone, from there
            return None
        for each in group:
            if each.name in counts:
                self._saw(each, batch[-1].id)
        return counts[projection.name]

    def _apply_together(self, first: ReadModel, group: list[ReadModel],
                        batch: Sequence[Notification], after: int) -> dict[str, int]:
        """One batch applied to several read models in one transaction; the events each
        applied, by name. ``first`` waits for its lock; the others come along only when their
        lock is free (one being caught up elsewhere is left to that), so bringing the others
        along never makes a caller wait longer. A read model whose position is behind ``after``
        is left out."""
        counts: dict[str, int] = {}
        with self.sql.transaction(commit=True, durable=False) as cursor:
            self.sql.lock(cursor, first.tracking_name)
            positions: list[tuple[ReadModel, int]] = []
            for projection in [first, *(p for p in group if p is not first)]:
                if projection is not first and not self.sql.try_lock(
                        cursor, projection.tracking_name):
                    continue
                position = self._position_in(cursor, projection)
                if position < after:  # reset elsewhere: it catches up alone
                    self._seen.pop(projection.name, None)
                    continue
                positions.append((projection, position))
            if not positions:
                return counts
            # Decoded once, and only what one of them still needs: when several threads catch
            # up at once, those that come second find it applied and decode nothing.
            lowest = min(position for _, position in positions)
            fresh = [n for n in batch if n.id > lowest]
            decoded = [(n, self.source.decode(n)) for n in fresh
                       if any(self._wants(p, n) for p, _ in positions)]
            for projection, position in positions:
                mine = [n for n in fresh if n.id > position]
                counts[projection.name] = len(mine)
                if mine:
                    todo = [(n.id, event) for n, event in decoded
                            if n.id > position and self._wants(projection, n)]
                    self._apply_in(cursor, projection, position, todo, mine[-1].id)
        return counts

    def _wants(self, projection: ReadModel, notification: Notification) -> bool:
        """``projection.wants`` the type of ``notification``'s event (kept per topic)."""
        key = (projection.name, notification.topic)
        wanted = self._wanted.get(key)
        if wanted is None:
            wanted = self._wanted[key] = bool(
                projection.wants(self.source.event_type(notification)))
        return wanted

    def _saw(self, projection: ReadModel, position: int) -> None:
        if position > self._seen.get(projection.name, -1):
            self._seen[projection.name] = position

    def _apply_batch(self, projection: ReadModel, batch: Sequence[Notification],
                     after: int | None = None) -> int:
        with self.sql.transaction(commit=True, durable=False) as cursor:
            self.sql.lock(cursor, projection.tracking_name)
            position = self._position_in(cursor, projection)
            if after is not None and position < after:
                raise _Behind(position)  # events up to ``after`` were never applied
            fresh = [n for n in batch if n.id > position]
            if fresh:
                todo = [(n.id, self.source.decode(n)) for n in fresh
                        if self._wants(projection, n)]
                self._apply_in(cursor, projection, position, todo, fresh[-1].id)
            return len(fresh)

    def _apply_in(self, cursor: Any, projection: ReadModel, position: int,
                  todo: list[tuple[int, Any]], upto: int) -> None:
        """``todo`` (sequence, decoded event: those it wants of the events after
        ``position`` up to ``upto``) applied to ``projection``, and ``upto`` tracked as its
        position, in the transaction of ``cursor``."""
        projection.begin_batch()
        if position == 0:  # a new version: rows an older version wrote are rebuilt
            for table in projection.table_names():
                self.sql.execute(cursor, f"DELETE FROM {table}")
        for sequence, event in todo:
            projection.apply(self.sql, cursor, sequence, event)
        projection.end_batch(self.sql, cursor)
        self._track(cursor, projection, upto)

    def _position_in(self, cursor: Any, projection: ReadModel) -> int:
        return self.tracking._max_tracking_id(projection.tracking_name, cursor) or 0  # type: ignore[attr-defined]

    def _track(self, cursor: Any, projection: ReadModel, position: int) -> None:
        self.tracking._insert_tracking(  # type: ignore[attr-defined]
            cursor, Tracking(notification_id=position, application_name=projection.tracking_name)
        )

    def rebuild(self, name: str | None = None) -> int:
        """Empty the read model(s) and apply the whole log again from sequence 0."""
        names = [name] if name else list(self.projections)
        total = 0
        for each in names:
            projection = self.get(each)
            if projection.name in self.inline:
                with self.sql.transaction(commit=True, durable=False) as cursor:
                    head = self.sql.exclude_saves(cursor)
                    with self._inline_lock:
                        self._rebuild_inline(cursor, projection, head)
                total += head
                continue
            with self.sql.transaction(commit=True, durable=False) as cursor:
                self.sql.lock(cursor, projection.tracking_name)
                for table in projection.table_names():
                    self.sql.execute(cursor, f"DELETE FROM {table}")
                self._reset_tracking(cursor, projection)
            self._seen.pop(projection.name, None)
            total += self._catch_up_one(projection, None)
        return total

    def _reset_tracking(self, cursor: Any, projection: ReadModel) -> None:
        table = "bc_tracking" if self.sql.postgres else "tracking"
        self.sql.execute(
            cursor, f"DELETE FROM {table} WHERE application_name = ?", (projection.tracking_name,)
        )

    def settle(self, name: str) -> int:
        """Bring ``name``'s rows derived when read up to date (``ReadModel.settle``), in a
        transaction of its own under the read model's lock; when nothing waits, one read.
        Its position does not move: what is settled is derived from rows already applied."""
        projection = self.get(name)
        with self.sql.transaction(commit=False) as cursor:
            if not projection.unsettled(self.sql, cursor):
                return 0
        with self.sql.transaction(commit=True, durable=False) as cursor:
            self.sql.lock(cursor, projection.tracking_name)
            return projection.settle(self.sql, cursor)

    def rows_at_position(self, name: str) -> tuple[int, dict[str, list[dict[str, Any]]]]:
        """A read model's rows, table by table, settled, and the position they belong to
        (read under the projection's lock, so no batch commits in between)."""
        projection = self.get(name)
        with self.sql.transaction(commit=True, durable=False) as cursor:
            if name in self.inline:  # saves held off: the rows are those of the head
                position = self.sql.exclude_saves(cursor)
                self.sql.lock(cursor, projection.tracking_name)
            else:
                self.sql.lock(cursor, projection.tracking_name)
                position = self._position_in(cursor, projection)
            projection.settle(self.sql, cursor)
            tables: dict[str, list[dict[str, Any]]] = {}
            for table in projection.table_names():
                self.sql.execute(cursor, f"SELECT * FROM {table}")
                tables[table] = [dict(row) for row in cursor.fetchall()]
        return position, tables

    def status(self) -> list[ProjectionStatus]:
        head = self.source.head()
        return [
            ProjectionStatus(name, head if name in self.inline else self.position(p), head)
            for name, p in self.projections.items()
        ]


class Follower:
    """The one follower of the log in a server process: keeps its ``ReadModels``' followed
    read models (all but the inline ones) current, in batches.

    A pass (``ReadModels.follow_all``: one read of the log, one decoding and one transaction
    for the read models in step) runs ``period`` seconds after this process's first commit
    not yet applied (``poke``, its commit listener), so a stream of creates is applied a
    batch at a time, each aggregate's row written once per batch however many of its events
    came (a node binds one reservation after another); when the log's head moved (other
    processes' commits: the head is read every ``poll`` seconds); and at once for a caller
    waiting for a position (``wait``, from ``ReadModels.catch_up``), so the period bounds
    how stale a read model may be only for readers that do not wait (the queue's head seen
    from another process, the metrics' gauges). A pass that fails is logged by ``on_failure`` and tried
    again at the next poll; its waiters are let go at once, to catch up by themselves (and
    raise what failed).
    """

    def __init__(self, models: ReadModels, *, period: float = 1.0, poll: float = 1.0,
                 on_failure: Callable[[BaseException], object] | None = None,
                 on_success: Callable[[], object] | None = None) -> None:
        self.models = models
        self.period, self.poll = period, poll
        self.on_failure, self.on_success = on_failure, on_success
        self._cond = threading.Condition()
        self._due = False  # this process committed what no pass applied yet
        self._waiting = 0
        self._passes = 0  # passes ended (a waiter whose pass failed stops waiting)
        self._failed_pass = -1
        self._stopping = False
        self._thread: int | None = None

    def is_running_here(self) -> bool:
        """Whether the calling thread is the follower's (which never waits for itself)."""
        return self._thread == threading.get_ident()

    def poke(self, sequence: int) -> None:
        """This process committed up to ``sequence`` (a commit listener: quick)."""
        with self._cond:
            if not self._due:
                self._due = True
                self._cond.notify_all()

    def wait(self, names: Sequence[str], position: int, timeout: float = 30.0) -> bool:
        """Until each of ``names`` holds every event up to ``position``; False when a pass
        failed meanwhile, the follower stopped or ``timeout`` passed."""
        seen = self.models._seen
        give_up = time.monotonic() + timeout
        with self._cond:
            self._waiting += 1
            self._cond.notify_all()
            started = self._passes
            try:
                while any(seen.get(name, -1) < position for name in names):
                    left = give_up - time.monotonic()
                    if self._stopping or self._failed_pass >= started or left <= 0:
                        return False
                    self._cond.wait(left)
                return True
            finally:
                self._waiting -= 1

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()

    def run(self) -> None:
        """The follower's loop, until ``stop`` (in a thread of its own)."""
        self._thread = threading.get_ident()
        head = -1
        while True:
            with self._cond:
                if not (self._waiting or self._due or self._stopping):
                    self._cond.wait(self.poll)
                if self._stopping:
                    return
                if self._due and not self._waiting:  # a batch: let more commits come
                    self._cond.wait_for(lambda: self._waiting or self._stopping, self.period)
                asked = self._waiting or self._due
                self._due = False
            failed = False
            try:
                if not asked:  # the poll: only when another process moved the head
                    now = self.models.source.head()
                    asked = now != head
                    head = now
                if asked:
                    self.models.follow_all()
                    if self.on_success is not None:
                        self.on_success()
            except Exception as exc:
                failed, head = True, -1  # tried again at the next poll
                if self.on_failure is not None:
                    self.on_failure(exc)
            with self._cond:
                if failed:
                    self._failed_pass = self._passes
                self._passes += 1
                self._cond.notify_all()
