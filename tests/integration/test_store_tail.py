"""The event store's order guarantee: a reader tailing the log never passes over an event.

/watch, `events list` and every projection read the notification log after
the last sequence they have read. That is only safe if no save can commit an
event with a lower sequence after a reader has read a higher one: on
PostgreSQL, every save takes the events table's lock from the insert to the
commit (api/store/pg_recorder.py); SQLite has one writer at a time.
"""

from __future__ import annotations

import copy
import threading
from typing import Any

import pytest
from eventsourcing.persistence import IntegrityError

from better_compute.api.store.eventlog import EventLog
from better_compute.domain.site import Site
from tests.conftest import BACKENDS
from tests.watching import log_sequences

WRITERS = 8
SAVES_PER_WRITER = 40


def _site(name: str) -> Site:
    return Site(tenant_id="root", kind="shared", region="eu-1", name=name, key=None,
                fingerprint="-")


def test_a_tailing_reader_sees_every_event_once_in_order_under_concurrent_saves(
        runtime: Any) -> None:
    log = EventLog(runtime.store)
    start = log.head()
    failures: list[BaseException] = []
    done = threading.Event()

    def writer(w: int) -> None:
        try:
            for i in range(SAVES_PER_WRITER):
                runtime.store.save(*[_site(f"w{w}-{i}-{k}") for k in range(1 + i % 3)], actor="local")
        except BaseException as exc:  # reported by the assertion below
            failures.append(exc)

    seen: list[int] = []

    def reader() -> None:
        position = start
        while True:
            finished = done.is_set()  # read once more after the writers are done
            entries = log.read(position, 50)
            seen.extend(e.sequence for e in entries)
            if entries:
                position = entries[-1].sequence
            elif finished:
                return

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(WRITERS)]
    tail = threading.Thread(target=reader)
    tail.start()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    done.set()
    tail.join(timeout=60)
    assert not tail.is_alive()
    assert failures == []
    committed = log_sequences(runtime, start)
    assert len(committed) == WRITERS * sum(1 + i % 3 for i in range(SAVES_PER_WRITER))
    assert seen == committed  # nothing passed over, nothing twice, in sequence order


def test_a_save_at_a_stale_version_is_refused_and_writes_nothing(runtime: Any) -> None:
    log = EventLog(runtime.store)
    site = _site("one")
    twin = copy.deepcopy(site)  # the same aggregate, version 1, not yet saved
    runtime.store.save(site, actor="local")
    head = log.head()
    with pytest.raises(IntegrityError):
        runtime.store.save(twin, _site("two"), actor="local")
    assert log_sequences(runtime, head) == []  # neither event of the refused save


@pytest.mark.parametrize("backend", [b for b in BACKENDS if b == "sqlite"])
def test_sqlite_saves_go_through_the_librarys_recorder(runtime: Any) -> None:
    recorder = runtime.store.recorder  # the library's, applying the inline read models
    assert type(recorder).__name__ == "InlineSQLiteRecorder"
    assert type(recorder).__mro__[1].__name__ == "SQLiteApplicationRecorder"


@pytest.mark.parametrize("backend", [b for b in BACKENDS if b == "postgres"])
def test_postgres_saves_go_through_the_locking_function(runtime: Any) -> None:
    recorder = runtime.store.recorder
    from better_compute.api.store.pg_recorder import LockingFunctionApplicationRecorder

    assert isinstance(recorder, LockingFunctionApplicationRecorder)
    with recorder.datastore.get_connection() as conn:
        body = conn.execute(
            "SELECT prosrc FROM pg_proc WHERE proname = %s", (recorder.insert_function,)
        ).fetchone()
    assert body is not None
    assert "LOCK TABLE" in body["prosrc"] and "EXCLUSIVE MODE" in body["prosrc"]
