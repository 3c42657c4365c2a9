"""The SQLite application recorder: a save's transaction can carry the read models too.

``steps`` run inside each save's transaction, after its events are inserted and before it
commits, with the cursor and the save's notifications. The read models a create follows
(the free-GPU index and the reservations) are applied there
(projections/framework.py ``ReadModels.apply_in_save``): a create is one write transaction,
where it was a save and then, at the next create, the read models' own transaction (its
``BEGIN``, two ``PRAGMA synchronous``, two lock rows, the writers' lock taken again, its
commit). A step that fails undoes its own part (a savepoint) and the save goes on; the
read models then catch up from the log as before. PostgreSQL saves through one function
call (api/store/pg_recorder.py) and keeps the read models' own transactions.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from eventsourcing.persistence import Notification, StoredEvent
from eventsourcing.sqlite import SQLiteApplicationRecorder, SQLiteCursor

TOPIC = f"{__name__}:SteppedSQLiteApplicationRecorder"

Step = Callable[[Any, Sequence[Notification]], None]


class SteppedSQLiteApplicationRecorder(SQLiteApplicationRecorder):
    """The library's recorder, calling ``steps`` in each save's transaction."""

    steps: tuple[Step, ...] = ()

    def _insert_events(self, c: SQLiteCursor, stored_events: Sequence[StoredEvent],
                       **kwargs: Any) -> Sequence[int] | None:
        ids = super()._insert_events(c, stored_events, **kwargs)
        if ids and self.steps:
            batch = [Notification(id=i, originator_id=s.originator_id,
                                  originator_version=s.originator_version, topic=s.topic,
                                  state=s.state)
                     for i, s in zip(ids, stored_events, strict=True)]
            for step in self.steps:
                step(c, batch)
        return ids
