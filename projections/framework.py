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
    def recent(self, after: int, upto: int) -> Sequence[Notification] | None: ...
    def decode(self, notification: Notification) -> Any: ...
    def event_type(self, notification: Notification) -> type[Any]: ...
    def head(self) -> int: ...


class ReadModel(ABC):
    """One read model (a projection of the events). Subclasses give a name, their tables and
    ``apply``."""

    name: str
    version: int = 1  # bump to rebuild a read model whose shape changed
    # Caught up at (nearly) every event by the request path: such read models, when in step,
    # are caught up together (``ReadModels._with_company``). The others are left to batch up
    # events until their own readers come (a tick, a query, a scrape).
    together: bool = False

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
        *, batch_size: int = 500,
    ) -> None:
        self.sql = sql
        self.source = source
        self.projections = {p.name: p for p in projections}
        self.batch_size = batch_size
        self.tracking = sql.tracking_recorder()
        # Followed heads (``follow``): the newest sequence this process committed or its
        # event hub read, and each projection's position as last applied or read here.
        self.known_head = 0
        self.head_source: Callable[[], int] | None = None
        self._seen: dict[str, int] = {}
        self._wanted: dict[tuple[str, str], bool] = {}  # (read model, topic): ``wants``
        statements: list[str] = []
        for projection in projections:
            statements.extend(projection.tables())
        sql.create_tables(statements)

    def get(self, name: str) -> ReadModel:
        from better_compute.domain.errors import NotFound

        if name not in self.projections:
            raise NotFound(
                f"no projection {name!r}: projections are {', '.join(sorted(self.projections))}"
            )
        return self.projections[name]

    def position(self, projection: ReadModel) -> int:
        return self.tracking.max_tracking_id(projection.tracking_name) or 0

    def catch_up(self, name: str | None = None, *, until: int | None = None) -> int:
        """Apply every committed event not yet applied; returns how many were applied."""
        names = [name] if name else list(self.projections)
        total = 0
        for each in names:
            total += self._catch_up_one(self.get(each), until)
        return total

    def notice_head(self, sequence: int) -> None:
        """This process committed up to ``sequence`` (the store's commit listener)."""
        if sequence > self.known_head:
            self.known_head = sequence

    def follow(self, name: str) -> bool:
        """Catch ``name`` up when this process knows of events it has not applied: its own
        commits, or what its event hub (``head_source``) read, other processes' included.

        When every event it lacks is one of this process's own saves (``EventSource.recent``:
        a create follows the one before it), they are applied as kept, without a read.

        Returns False when it read nothing from the store. A caller whose answer may be stale
        for that (the placer: no capacity, or a conflict) calls ``catch_up`` and asks again;
        correctness never rests on the read model (the aggregates refuse a double booking).
        """
        seen, head = self._seen.get(name, -1), self._head()
        if seen >= head:
            return False
        if seen >= 0:
            known = self._kept(seen, head)
            if known and self._apply_known(self.get(name), known, seen):
                return False
        self.catch_up(name)
        return True

    def _head(self) -> int:
        """The newest sequence this process knows of: its own commits, what its hub read."""
        if self.head_source is None:
            return self.known_head
        return max(self.known_head, self.head_source())

    def _kept(self, start: int, head: int) -> Sequence[Notification] | None:
        """The notifications after ``start`` up to ``head`` that this process has without a
        read (its own saves, what its event hub read: ``EventSource.recent``); None when
        there are none or it lacks one of them."""
        return self.source.recent(start, head) if head > start else None

    def _apply_known(self, projection: ReadModel, batch: Sequence[Notification], start: int
                     ) -> bool:
        """``batch`` (every event after ``start``, from ``EventSource.recent``) applied as
        one batch of ``_catch_up_one`` would; False when the projection's position was
        behind ``start`` (reset elsewhere): then nothing was applied, and the caller reads."""
        try:
            self._apply_after(projection, batch, start, company=True)
        except _Behind:
            return False
        return True

    def _apply_after(self, projection: ReadModel, batch: Sequence[Notification], start: int,
                     *, company: bool) -> int:
        """One batch read after ``start`` applied (with the read models in step, when
        ``company``), and ``start`` moved past it; the events applied to ``projection``.
        ``_Behind`` (the hint dropped) when its position was behind ``start``."""
        together = self._with_company(projection, batch, start) if company else None
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
        this process saw at the same position come along (``_with_company``). What this
        process already has after the hint (``_kept``) is applied first, without a
        read: the read then finds only what no one here has read yet, usually nothing."""
        applied = 0
        start = self._seen.get(projection.name)
        checked = start is None  # the hint is checked against the tracking position once
        if start is None:
            start = self.position(projection)
        else:  # what this process has of the log after the hint is applied without a read
            known = self._kept(start, self._head() if until is None
                               else min(self._head(), until))
            if known:
                try:
                    applied += self._apply_after(projection, known, start,
                                                 company=until is None)
                    start = known[-1].id
                except _Behind as behind:
                    start, checked = behind.position, True
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
                applied += self._apply_after(projection, batch, start, company=until is None)
            except _Behind as behind:
                start, checked = behind.position, True
                continue
            start = batch[-1].id
            if len(batch) < self.batch_size:
                return applied  # that was the head when read: no second read for nothing

    def _with_company(self, projection: ReadModel, batch: Sequence[Notification], start: int
                      ) -> int | None:
        """``batch`` applied to ``projection`` together with every other ``together`` read
        model this process saw at the same position ``start``: decoded once, applied to each
        in ONE transaction (each under its own lock, its position re-read there), instead of
        one read, one decoding and one transaction per read model. None when there is no such
        company or the shared batch failed: then ``projection`` takes the batch alone, and the
        others, whose hints are dropped, catch up alone too, so a read model that cannot apply
        an event holds back only itself. Returns the events applied to ``projection``."""
        if not projection.together or self._seen.get(projection.name) != start:
            return None
        group = sorted((p for p in self.projections.values()
                        if p.together and self._seen.get(p.name) == start), key=lambda p: p.name)
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
        lock is free (one being caught up elsewhere is left to that), so bringing company
        never makes a caller wait longer. A read model whose position is behind ``after``
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
            self.sql.lock(cursor, projection.tracking_name)
            projection.settle(self.sql, cursor)
            position = self._position_in(cursor, projection)
            tables: dict[str, list[dict[str, Any]]] = {}
            for table in projection.table_names():
                self.sql.execute(cursor, f"SELECT * FROM {table}")
                tables[table] = [dict(row) for row in cursor.fetchall()]
        return position, tables

    def status(self) -> list[ProjectionStatus]:
        head = self.source.head()
        return [
            ProjectionStatus(name, self.position(p), head) for name, p in self.projections.items()
        ]
