"""The store's aggregate cache: loads that read only what is new.

Creates, bindings and releases load the same reservations, nodes and bookings again and
again; each load used to read the latest snapshot and replay up to 100 events after it.
Here each aggregate is kept per process as the bytes of its pickled state at a version
(LRU, ``size`` aggregates). A load unpickles a private copy, reads only the events stored
after that version (so what another process or replica saved is seen: the store stays the
truth) and applies them. A successful save of this process puts what it saved.

Kept as bytes, never as a shared object: a load that applies new events mutates its own
copy, so no thread can copy an aggregate while another is changing it, and a command that
changes what it loaded and then fails leaves nothing behind. (The eventsourcing library's
own cache fast-forwards the shared cached object in place and deep-copies it outside that
lock: a copy could be torn between two versions.)

An aggregate class that declares ``COPY_ON_WRITE`` (every event of it gives an attribute a
new value, never changes the value it had in place) is kept as an object instead: a load
hands out a shallow copy (its own attributes, sharing their values, and no pending
events), which its events cannot change under another copy. A tenant's quota use lists each
of its live reservations: pickled, it cost every create of that tenant time in proportion
to what the tenant holds (docs/performance.md, eighth round).
"""

from __future__ import annotations

import pickle
import threading
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any
from uuid import UUID

from eventsourcing.application import AggregateNotFoundError
from eventsourcing.domain import Aggregate

SIZE = 4096  # aggregates kept per process


def project(aggregate: Any, events: Iterable[Any]) -> Any:
    """The store's events applied in order: the library's projector without its
    ``isinstance`` check against a runtime Protocol per event (typing's slow path: 5 to 8 %
    of a reservation create's samples). Every event of this store is one of ours."""
    for event in events:
        aggregate = event.mutate(aggregate)
    return aggregate


def _keep(aggregate: Any) -> Any:
    """What the cache keeps of ``aggregate``: its pickle, or a shallow copy."""
    if getattr(aggregate, "COPY_ON_WRITE", False):
        return shallow_copy(aggregate)
    return pickle.dumps(aggregate, protocol=pickle.HIGHEST_PROTOCOL)


def _copy(kept: Any) -> Any:
    """A private copy of what the cache kept (bytes: a pickle; else a kept aggregate)."""
    return pickle.loads(kept) if isinstance(kept, bytes) else shallow_copy(kept)


def shallow_copy(aggregate: Any) -> Any:
    """A copy of a ``COPY_ON_WRITE`` aggregate with attributes of its own that share their
    values, and no pending events: its events give its attributes new values, so another
    copy never sees them."""
    copy = object.__new__(type(aggregate))
    state = dict(vars(aggregate))
    state["_pending_events"] = []
    copy.__dict__.update(state)
    return copy


class AggregateCache:
    def __init__(self, size: int = SIZE) -> None:
        self.size = size
        self._lock = threading.Lock()
        self._entries: OrderedDict[UUID, tuple[int, Any]] = OrderedDict()  # pickle or object

    def load(self, uuid: UUID, repository: Any) -> Any:
        """The aggregate as stored now: a private copy. AggregateNotFoundError if none."""
        with self._lock:
            entry = self._entries.get(uuid)
            if entry is not None:
                self._entries.move_to_end(uuid)
        if entry is None:
            aggregate = repository.get(uuid, projector_func=project)
            self.put(aggregate)
            return aggregate
        aggregate = _copy(entry[1])
        newer = list(repository.event_store.get(originator_id=uuid, gt=entry[0]))
        if newer:
            aggregate = project(aggregate, newer)
            if aggregate is None:
                raise AggregateNotFoundError(uuid)
            self.put(aggregate)
        return aggregate

    def put(self, aggregate: Any) -> None:
        """Keep ``aggregate`` as it is now, unless a newer version is kept already."""
        data = _keep(aggregate)
        version = int(aggregate.version)
        with self._lock:
            kept = self._entries.get(aggregate.id)
            if kept is not None and kept[0] >= version:
                return
            self._entries[aggregate.id] = (version, data)
            self._entries.move_to_end(aggregate.id)
            while len(self._entries) > self.size:
                self._entries.popitem(last=False)

    def saved(self, objs: Iterable[Any]) -> None:
        """What a save of this process committed (its pending events are collected)."""
        for obj in objs:
            if isinstance(obj, Aggregate) and not obj.pending_events:
                self.put(obj)

    def __len__(self) -> int:
        return len(self._entries)
