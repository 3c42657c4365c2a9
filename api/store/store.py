"""Opening the event store: SQLite by default, PostgreSQL when a URL is set.

``BETTER_COMPUTE_DATABASE_URL=postgresql://user:pw@host:port/db[?schema=NAME]``
selects PostgreSQL; libpq reads the URL, every parameter of it (api/store/store_url.py;
the ``schema`` query parameter is ours: it puts every table of this control plane
in that schema, which is how tests isolate runs);
otherwise the store is ``store.sqlite`` in ``BETTER_COMPUTE_DATA_DIR``
(default: the user's data dir).
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol
from uuid import UUID

from eventsourcing.application import AggregateNotFoundError, Application, ProcessingEvent
from eventsourcing.domain import Aggregate
from eventsourcing.persistence import (
    IntegrityError,
    Mapper,
    StoredEvent,
    TrackingRecorder,
    Transcoder,
)
from eventsourcing.sqlite import SQLiteApplicationRecorder
from eventsourcing.utils import Environment

import better_compute.domain.aggregates  # noqa: F401  (registers every event topic)
from better_compute.api.store.actor import stamp
from better_compute.api.store.aggregate_cache import AggregateCache, project
from better_compute.api.store.codec import EventMapper, MsgspecTranscoder
from better_compute.api.store.locks import NamedLocks, NoLocks, locks_for
from better_compute.api.store.outage import StoreGuard, postgres_guard
from better_compute.api.store.pg_recorder import TOPIC as PG_RECORDER_TOPIC
from better_compute.api.store.pipeline import PipelineCursor
from better_compute.api.store.sqlite_factory import TOPIC as SQLITE_FACTORY_TOPIC
from better_compute.api.store.sqlite_writers import WriterLock, flock_within
from better_compute.api.store.store_url import connect_kwargs, parse_database_url
from better_compute.api.store.store_url import describe as describe_pg
from better_compute.domain.bookings import NodeBookings
from better_compute.domain.errors import Unavailable
from better_compute.domain.node import Node
from better_compute.domain.quota import QuotaUse

APP_NAME = "bc"
PG_FACTORY_TOPIC = "better_compute.api.store.pg_factory:StorePostgresFactory"
POOL_WAIT = 5  # seconds a call waits for a pooled PostgreSQL connection
POOL_SIZE = 5  # PostgreSQL connections a process's pool keeps open
POOL_MAX = 15  # … and opens at most, under load (api/store/pg_capacity.py counts them)
SQLITE_LOCK_TIMEOUT_S = 30  # seconds a SQLite write waits for another (sqlite_writers.py too)


def default_data_dir(env: Mapping[str, str]) -> Path:
    if env.get("BETTER_COMPUTE_DATA_DIR"):
        return Path(env["BETTER_COMPUTE_DATA_DIR"]).expanduser()
    base = env.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "better-compute"


@dataclass(frozen=True)
class StoreConfig:
    """Where the store lives; built from the environment once, at the composition root."""

    backend: str  # "sqlite" | "postgres"
    data_dir: Path
    sqlite_path: Path | None = None
    pg: dict[str, str] | None = field(default=None, repr=False)  # holds the password

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> StoreConfig:
        env = os.environ if env is None else env
        data_dir = default_data_dir(env)
        url = env.get("BETTER_COMPUTE_DATABASE_URL", "").strip()
        if not url:
            return cls("sqlite", data_dir, sqlite_path=data_dir / "store.sqlite")
        return cls("postgres", data_dir, pg=parse_database_url(url))

    @property
    def password(self) -> str | None:
        return (self.pg or {}).get("POSTGRES_PASSWORD") or None

    def describe(self) -> str:
        if self.backend == "sqlite":
            return f"SQLite {self.sqlite_path}"
        assert self.pg is not None
        return describe_pg(self.pg)

    def library_env(self) -> dict[str, str]:
        if self.backend == "sqlite":
            return {
                # The library's factory, guarding the store's connections (sqlite_factory.py).
                "PERSISTENCE_MODULE": SQLITE_FACTORY_TOPIC,
                "SQLITE_DBNAME": str(self.sqlite_path),
                "SQLITE_LOCK_TIMEOUT": str(SQLITE_LOCK_TIMEOUT_S),
                "CREATE_TABLE": "y",
                "APPLICATION_RECORDER_TOPIC": SQLITE_RECORDER_TOPIC,
            }
        assert self.pg is not None
        return {
            # The library's factory, handing libpq the whole URL and guarding the store's
            # connections (api/store/pg_factory.py).
            "PERSISTENCE_MODULE": PG_FACTORY_TOPIC,
            "CREATE_TABLE": "y",
            "POSTGRES_POOL_SIZE": str(POOL_SIZE),
            "POSTGRES_MAX_OVERFLOW": str(POOL_MAX - POOL_SIZE),
            # The library passes this to the pool as its wait for a free connection.
            "POSTGRES_CONNECT_TIMEOUT": str(POOL_WAIT),
            "POSTGRES_LOCK_TIMEOUT": "10",
            # Saves through one function that locks, notifies and inserts (api/store/pg_recorder.py).
            "APPLICATION_RECORDER_TOPIC": PG_RECORDER_TOPIC,
            # Never POSTGRES_ENABLE_DB_FUNCTIONS: its insert path skips the table lock
            # and a tailing reader then skips events (reference/eventsourcing-facts.md).
            **self.pg,
        }


def redact(text: str, secret: str | None) -> str:
    """``text`` (an error message from a library, say) with ``secret`` replaced by ***."""
    return text.replace(secret, "***") if secret else text


class ComputeStore(Application[Any]):
    """The event store: every aggregate of the control plane, one notification log.

    Configured only by the explicit environment it is given, never by stray
    process variables (the library would otherwise read PERSISTENCE_MODULE and
    friends from os.environ).
    """

    name = APP_NAME
    # A node's bookings gain two events per reservation, forever; snapshots every 100
    # events keep loading them (each placement does) from growing with the node's age.
    # A node gains two events per reservation too (its devices assigned, then unassigned):
    # binding and every release load it. A tenant's quota use gains two per reservation of
    # the tenant on the pool (taken, refunded): every create and release of the tenant loads
    # it (tests/integration/test_quota_snapshots.py).
    snapshotting_intervals = {NodeBookings: 100, Node: 100, QuotaUse: 100}

    def __init__(self, env: Any = None) -> None:
        self.cache = AggregateCache()  # before the library's set-up, which may save
        super().__init__(env)

    def construct_transcoder(self) -> Transcoder:
        return MsgspecTranscoder()

    def construct_mapper(self) -> Mapper[Any]:
        """Events stored as msgspec JSON typed by their class (api/store/codec.py)."""
        return self.factory.mapper(transcoder=self.construct_transcoder(),
                                   mapper_class=EventMapper)

    def construct_env(self, name: str, env: Any = None) -> Environment:
        return Environment(name, {"IS_SNAPSHOTTING_ENABLED": "y", **dict(env or {})})

    @property
    def backend(self) -> str:
        return "postgres" if self.env.get("PERSISTENCE_MODULE") == PG_FACTORY_TOPIC else "sqlite"

    _commit_listeners: tuple[Callable[[int], None], ...] = ()
    # The read models every save applies in its own transaction (api/runtime.py sets them).
    inline: InlineReadModels | None = None
    guard: StoreGuard  # every connection goes through it (api/store/outage.py); set by open_store
    locks: NamedLocks = NoLocks()  # across the processes of the store (api/store/locks.py)

    def close(self) -> None:
        self.locks.close()
        super().close()

    def add_commit_listener(self, listener: Callable[[int], None]) -> None:
        """Call ``listener(last_sequence)`` after each save of this process commits.

        The /watch hub uses it to wake at once on writes made in its own process
        (SQLite has no LISTEN/NOTIFY); listeners must be quick and never raise.
        """
        self._commit_listeners = (*self._commit_listeners, listener)

    _recording_listeners: tuple[Callable[[list[Any]], None], ...] = ()

    def add_recording_listener(self, listener: Callable[[list[Any]], None]) -> None:
        """Call ``listener(recordings)`` with the library's recordings (each event and its
        notification) after each save of this process commits, before the commit listeners
        (the reservations note where they changed a pool's queue:
        api/services/reservation_base.py). Quick, never raising."""
        self._recording_listeners = (*self._recording_listeners, listener)

    def _notify(self, recordings: list[Any]) -> None:
        if not recordings:
            return
        for each in self._recording_listeners:
            each(recordings)
        if self._commit_listeners:
            last = max(r.notification.id for r in recordings)
            for listener in self._commit_listeners:
                listener(last)

    def sql(self) -> SqlRunner:
        return SqlRunner(self)

    def load(self, uuid: UUID, *, snapshots: bool = True, fresh: bool = True) -> Any:
        """An aggregate as stored now, from the aggregate cache (api/store/aggregate_cache.py):
        only the events after its cached version are read. AggregateNotFoundError if none.
        ``snapshots=False`` for a class never snapshotted (read from its events alone).
        ``fresh=False``: as this process last saw it, with no read, for an aggregate the
        caller saves (a save of a stale one is refused, and the next load reads)."""
        return self.cache.load(uuid, self.repository, snapshots=snapshots, fresh=fresh)

    def load_each(self, uuids: Sequence[UUID]) -> dict[UUID, Any]:
        """The aggregates of ``uuids`` that exist, each as ``load`` gives it. On PostgreSQL
        two queries for them all (the latest snapshot of each one not kept, then every
        event after what is kept or snapshotted) instead of one or two round trips each: a
        batch of a fleet's node changes (``NodeService.change_each``) reads its 500 nodes
        so. On SQLite, whose reads are in this process, each is ``load``."""
        ids = list(dict.fromkeys(uuids))
        found: dict[UUID, Any] = {}
        if self.backend != "postgres" or len(ids) < 2:
            for uuid in ids:
                with contextlib.suppress(AggregateNotFoundError):
                    found[uuid] = self.load(uuid)
            return found
        start: dict[UUID, Any] = {}  # a kept copy, or a snapshot's aggregate
        after: dict[UUID, int] = {}  # its version: the events after it are read
        for uuid in ids:
            kept = self.cache.kept(uuid)
            if kept is not None:
                after[uuid], start[uuid] = kept
        missing = [u for u in ids if u not in after]
        events: dict[UUID, list[Any]] = {}
        sql = self.sql()
        with sql.transaction(commit=False) as cursor:
            if missing and self.snapshots is not None:
                table = self.snapshots.recorder.events_table_name  # type: ignore[attr-defined]
                cursor.execute(
                    f"SELECT DISTINCT ON (originator_id) originator_id, originator_version, "
                    f"topic, state FROM {table} WHERE originator_id = ANY(%s) "
                    "ORDER BY originator_id, originator_version DESC", (missing,))
                for row in cursor.fetchall():
                    snapshot = self.snapshots.mapper.to_domain_event(_stored(row))
                    uuid = snapshot.originator_id
                    start[uuid], after[uuid] = project(None, [snapshot]), snapshot.originator_version
            table = self.recorder.events_table_name  # type: ignore[attr-defined]
            cursor.execute(
                f"SELECT e.originator_id, e.originator_version, e.topic, e.state FROM {table} e "
                "JOIN unnest(%s::uuid[], %s::bigint[]) AS k(id, v) "
                "ON e.originator_id = k.id AND e.originator_version > k.v "
                "ORDER BY e.originator_id, e.originator_version",
                (ids, [after.get(u, 0) for u in ids]))
            for row in cursor.fetchall():
                event = self.events.mapper.to_domain_event(_stored(row))
                events.setdefault(event.originator_id, []).append(event)
        for uuid in ids:
            aggregate, newer = start.get(uuid), events.get(uuid)
            if newer or (aggregate is not None and uuid in missing):
                aggregate = project(aggregate, newer or ())
                if aggregate is not None:
                    self.cache.put(aggregate)
            if aggregate is not None:
                found[uuid] = aggregate
        return found

    def save(self, *objs: Any, actor: str | None, **kwargs: Any) -> Any:  # type: ignore[override]
        """The library's ``Application.save``, collecting each aggregate's events without its
        ``isinstance`` checks against two runtime Protocols (typing's slow path: 0.35 ms of a
        reservation create's 10 ms in-process); anything not one of our aggregates goes the
        library's way. Every event is stamped with ``actor``, who did it (None: the caller
        stamped each event itself, api/store/actor.py; the mapper refuses one with none).
        Then this process's aggregate cache keeps what was saved."""
        processing: ProcessingEvent[Any] = ProcessingEvent()
        for obj in objs:
            if isinstance(obj, Aggregate):
                processing.events.extend(obj.collect_events())
                processing.aggregates[obj.id] = obj
            elif obj is not None:
                processing.collect_events(obj)
        stamp(processing.events, actor)
        processing.saved_kwargs.update(kwargs)
        inline = self.inline
        if inline is not None and inline.inline_wants(processing.events):
            events = processing.events
            processing.saved_kwargs["inline"] = (
                lambda cursor, sequences: inline.apply_inline(cursor, events, sequences))
        try:
            recordings = self._record(processing)
        except IntegrityError:  # another writer's version: what this process kept is stale
            self.cache.forget(processing.aggregates)
            raise
        self._take_snapshots(processing)
        self._notify(recordings)
        self.cache.saved(objs)
        return recordings


class InlineReadModels(Protocol):
    """Read models a save applies in its own transaction (projections/framework.py)."""

    def inline_wants(self, events: Sequence[Any]) -> bool: ...
    def apply_inline(self, cursor: Any, events: Sequence[Any], sequences: Sequence[int]
                     ) -> None: ...


class InlineSQLiteRecorder(SQLiteApplicationRecorder):
    """The library's SQLite recorder, applying the read models kept inline (``inline``, from
    ``ComputeStore.save``) to the events it inserts, in the same transaction."""

    def _insert_events(self, c: Any, stored_events: Sequence[StoredEvent], **kwargs: Any
                       ) -> Sequence[int] | None:
        ids = super()._insert_events(c, stored_events, **kwargs)
        inline = kwargs.get("inline")
        if inline is not None and ids:
            inline(c, ids)
        return ids


SQLITE_RECORDER_TOPIC = f"{__name__}:InlineSQLiteRecorder"


def _stored(row: Any) -> StoredEvent:
    return StoredEvent(originator_id=row["originator_id"],
                       originator_version=int(row["originator_version"]),
                       topic=str(row["topic"]), state=bytes(row["state"]))


def private_sqlite_files(path: Path) -> None:
    """The data dir 0700 and the store's files 0600, whoever created them.

    The dir is tightened when it exists with looser modes; ``store.sqlite`` is
    created 0600 before SQLite opens it, and SQLite creates its ``-wal`` and
    ``-shm`` files with the database file's mode. Files another user owns are
    left as they are (the open then fails or succeeds on its own).
    """
    folder = path.parent
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    _tighten(folder, 0o700)
    with contextlib.suppress(FileExistsError):
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))
    for name in (path.name, f"{path.name}-wal", f"{path.name}-shm", f"{path.name}-journal",
                 f"{path.name}-writer.lock", f"{path.name}-locks.lock"):
        _tighten(folder / name, 0o600)


def _tighten(path: Path, mode: int) -> None:
    with contextlib.suppress(FileNotFoundError, PermissionError):
        if stat.S_IMODE(path.lstat().st_mode) & ~mode and not path.is_symlink():
            os.chmod(path, mode)


def open_store(config: StoreConfig) -> ComputeStore:
    """The store of ``config``; on PostgreSQL, call it inside ``setup_lock(config)``."""
    if config.backend == "sqlite":
        assert config.sqlite_path is not None
        private_sqlite_files(config.sqlite_path)
    try:
        store = ComputeStore(env=config.library_env())
    except Exception as exc:  # the library raises OperationalError / OSError subclasses
        raise Unavailable(
            f"cannot open the event store ({config.describe()}): "
            f"{redact(str(exc), config.password)}. Check "
            "BETTER_COMPUTE_DATABASE_URL or BETTER_COMPUTE_DATA_DIR"
        ) from None
    # The factories' datastores (pg_factory.py, sqlite_factory.py) guard their connections
    # from now on; the set-up above ran without (its errors are the library's own).
    datastore = store.recorder.datastore  # type: ignore[attr-defined]
    if store.backend == "postgres":
        store.guard = postgres_guard(datastore)
        datastore.watch(store.guard)
    else:
        assert config.sqlite_path is not None
        store.guard = StoreGuard()
        datastore.watch(store.guard, WriterLock(config.sqlite_path, SQLITE_LOCK_TIMEOUT_S))
    store.locks = locks_for(config)
    return store


SETUP_LOCK_TIMEOUT = "60s"


@contextmanager
def setup_lock(config: StoreConfig) -> Iterator[None]:
    """Hold while opening a store and creating its tables: one process at a time.

    On PostgreSQL, processes that start together (replicas, a CLI beside a
    server) would otherwise run the same ``CREATE … IF NOT EXISTS`` and ``CREATE
    OR REPLACE FUNCTION`` statements at once, and some of them fail ("tuple
    concurrently updated"). A session advisory lock per schema serialises them;
    it also creates the schema named in the URL. On SQLite the library's tracking-table
    migration reads, then writes in another transaction, so two processes opening a new store
    together could both insert its row (IntegrityError): a lock file beside the store
    serialises them too.
    """
    if config.backend != "postgres":
        if config.sqlite_path is None:
            yield
        else:
            with _sqlite_setup_lock(config.sqlite_path):
                yield
        return
    assert config.pg is not None
    import psycopg
    from psycopg import sql

    schema = config.pg.get("POSTGRES_SCHEMA")
    try:
        conn = psycopg.connect(**{"connect_timeout": 10, **connect_kwargs(config.pg)},
                               autocommit=True)
    except psycopg.Error as exc:
        raise Unavailable(f"cannot reach PostgreSQL ({config.describe()}): "
                          f"{redact(str(exc), config.password)}") from None
    with conn:
        try:
            conn.execute(f"SET lock_timeout = '{SETUP_LOCK_TIMEOUT}'")
            conn.execute("SELECT pg_advisory_lock(hashtext(%s))",
                         (f"better-compute setup {schema or 'public'}",))
            if schema:
                conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(
                    sql.Identifier(schema)))
        except psycopg.Error as exc:
            raise Unavailable(
                f"cannot set up the event store ({config.describe()}): "
                f"{redact(str(exc), config.password)}. Processes that "
                f"open one store set it up one at a time, each waiting up to "
                f"{SETUP_LOCK_TIMEOUT}: if another one is stuck, stop it and try again"
            ) from None
        yield  # the lock ends with the session


@contextmanager
def _sqlite_setup_lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    lock_fd = os.open(path.with_name(path.name + ".setup-lock"), os.O_WRONLY | os.O_CREAT, 0o600)
    os.fchmod(lock_fd, 0o600)  # one made before store files were kept private
    with os.fdopen(lock_fd, "a") as lock:
        if not flock_within(lock.fileno(), float(SETUP_LOCK_TIMEOUT.rstrip("s")), 0.05):
            raise Unavailable(
                f"cannot set up the event store ({path}): another process has held "
                f"its setup lock for {SETUP_LOCK_TIMEOUT}; if it is stuck, stop it "
                "and try again")
        yield  # the lock ends when the file closes


class SqlRunner:
    """Plain SQL on the store's own connections, for read models beside the events.

    SQL is written once with ``?`` placeholders; on PostgreSQL they become
    ``%s``. Rows come back as mappings on both backends.
    """

    def __init__(self, store: ComputeStore) -> None:
        self.store = store
        self.datastore: Any = store.recorder.datastore  # type: ignore[attr-defined]
        self.postgres = store.backend == "postgres"
        self.schema = getattr(self.datastore, "schema", None) if self.postgres else None

    def q(self, statement: str) -> str:
        return statement.replace("?", "%s") if self.postgres else statement

    @contextmanager
    def transaction(self, *, commit: bool, durable: bool = True) -> Iterator[Any]:
        """A transaction on one of the store's connections. ``durable=False`` is for what is
        derived from the events (the read models, applied again from their tracked position):
        its commit does not wait for the disk. It stays atomic, with its tracking position,
        and the next durable commit (a save of events) flushes it too; a power cut may lose
        it, never the events it came from (docs/architecture.md, "Durability")."""
        if commit and not durable and not self.postgres:
            # SQLite's safety level is per connection and set outside a transaction: every
            # writing connection is handed out at FULL (sqlite_factory.StoreSQLiteDatastore).
            with self.datastore.get_connection(commit=True) as conn:
                conn.cursor().execute("PRAGMA synchronous = NORMAL")
                with conn.transaction(commit=True) as cursor:
                    yield cursor
            return
        with self.datastore.transaction(commit=commit) as cursor:
            if commit and not durable:
                # A read model's transaction is mostly writes whose results nobody reads
                # (rows, counts, the tracking position): in psycopg's pipeline mode they go
                # without waiting for each answer, and only a read waits (its fetch syncs),
                # so a follow of a create is ~5 round trips, not ~15. An error raises from the
                # statement's fetch or the block's end, and the transaction rolls back.
                with cursor.connection.pipeline():
                    cursor.execute("SET LOCAL synchronous_commit TO off")
                    yield PipelineCursor(cursor)
            else:
                yield cursor

    def execute(self, cursor: Any, statement: str, params: Sequence[Any] = ()) -> None:
        cursor.execute(self.q(statement), tuple(params))

    def exclude_saves(self, cursor: Any) -> int:
        """Hold every save off for the rest of this transaction (a read model kept inline is
        rebuilt or read whole meanwhile); the head of the log, read under that hold."""
        recorder: Any = self.store.recorder
        if self.postgres:
            table = f'"{recorder.datastore.schema}"."{recorder.events_table_name}"'
            cursor.execute(f"LOCK TABLE {table} IN SHARE MODE")  # saves take EXCLUSIVE
            cursor.execute(f"SELECT MAX(notification_id) AS head FROM {table}")
        else:
            self.lock(cursor, "saves")  # SQLite: the one writer's lock, taken by a write
            cursor.execute(f"SELECT MAX(rowid) AS head FROM {recorder.events_table_name}")
        return int(cursor.fetchone()["head"] or 0)

    def lock(self, cursor: Any, name: str) -> None:
        """Serialise writers of one read model for the rest of this transaction."""
        if self.postgres:  # per schema: stores sharing one database never wait for each other
            cursor.execute("SELECT pg_advisory_xact_lock(hashtext(%s))",
                           (f"{self.schema or 'public'}/{name}",))
        else:
            # A write as the first statement takes SQLite's write lock (waiting
            # up to the busy timeout) before this transaction reads anything.
            cursor.execute(
                "INSERT INTO bc_locks(name, n) VALUES (?, 1) "
                "ON CONFLICT(name) DO UPDATE SET n = n + 1", (name,)
            )

    def try_lock(self, cursor: Any, name: str) -> bool:
        """``lock`` when no other transaction holds it; False (nothing taken) when one does.
        SQLite has one writer at a time: its transaction holds every lock already."""
        if not self.postgres:
            self.lock(cursor, name)
            return True
        cursor.execute("SELECT pg_try_advisory_xact_lock(hashtext(%s)) AS locked",
                       (f"{self.schema or 'public'}/{name}",))
        return bool(cursor.fetchone()["locked"])  # rows are dicts (api/store/pg_factory.py)

    def probe_write(self) -> None:
        """Commit one tiny write (SQLite: a row of the lock table); raises while the store
        refuses writes (a full disk). Clears the guard's failed write when it succeeds."""
        with self.transaction(commit=True) as cursor:
            self.lock(cursor, "better-compute write probe")

    def tracking_recorder(self) -> TrackingRecorder:
        if self.postgres:
            from eventsourcing.postgres import PostgresTrackingRecorder

            rec: TrackingRecorder = PostgresTrackingRecorder(
                self.datastore, tracking_table_name=f"{APP_NAME}_tracking"
            )
        else:
            from eventsourcing.sqlite import SQLiteTrackingRecorder

            rec = SQLiteTrackingRecorder(self.datastore)
        rec.create_table()  # type: ignore[attr-defined]
        return rec

    def create_tables(self, statements: list[str]) -> None:
        """Run each ``CREATE … IF NOT EXISTS`` statement. On PostgreSQL each is its own
        transaction: a ``CREATE INDEX`` locks its table (SHARE) until its transaction ends, so
        in one transaction a process opening the store would hold one table while it waits
        for a writer holding the next, which may want the first: a deadlock, and the process
        (a replica starting in a rolling restart) did not start. Alone, each statement waits
        for the writers of its table, then lets go; what a failure leaves undone, the next
        opening does."""
        if self.postgres:
            for statement in statements:
                with self.transaction(commit=True) as cursor:
                    cursor.execute(statement)
            return
        with self.transaction(commit=True) as cursor:
            for statement in [
                "CREATE TABLE IF NOT EXISTS bc_locks (name TEXT PRIMARY KEY, n INTEGER)",
                *statements,
            ]:
                cursor.execute(statement)
