"""The store's aggregate cache: loads that read only what is new.

Creates, bindings and releases load the same reservations, nodes and bookings again and
again, and a load from the store reads the latest snapshot and replays up to 100 events after
it. Here each aggregate is kept per process as the bytes of its pickled state at a version
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
of its live reservations: pickled, it would cost every create of that tenant time in
proportion to what the tenant holds; pickling and unpickling the node, its bookings, the pool
and the reservation would be 8-15 % of a create's CPU. Their values are shared between copies, so nothing may change one in
place, inside an event or outside (a caller editing ``node.hardware``): ``CHECK_IN_PLACE``
(the test suite turns it on) keeps each kept object's pickle beside it and fails a load
or a put whose kept object changed since it was kept.
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
# Check that no kept ``COPY_ON_WRITE`` object changed in place (its values are shared with the
# copies handed out): on in the test suite (tests/conftest.py), off in production (a pickle
# per put and per load is the cost those aggregates avoid).
CHECK_IN_PLACE = False


class ChangedInPlace(AssertionError):
    """A kept ``COPY_ON_WRITE`` aggregate's state changed after it was kept: some code changed
    a value it shares with its copies in place instead of giving the attribute a new value."""


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


def _print(aggregate: Any) -> bytes:
    """A kept object's state as bytes (``CHECK_IN_PLACE``)."""
    return pickle.dumps({k: v for k, v in vars(aggregate).items() if k != "_pending_events"},
                        protocol=pickle.HIGHEST_PROTOCOL)


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
        self._prints: dict[UUID, bytes] = {}  # ``CHECK_IN_PLACE``: kept objects' pickles

    def load(self, uuid: UUID, repository: Any, *, snapshots: bool = True,
             fresh: bool = True) -> Any:
        """The aggregate as stored now: a private copy. AggregateNotFoundError if none.
        ``snapshots=False``: a class never snapshotted is read from its events alone when
        not kept (the repository's snapshot read would be a round trip for nothing).
        ``fresh=False``: as kept here, without reading what is newer (for an aggregate the
        caller saves: another writer's newer version makes that save fail, ``forget``)."""
        with self._lock:
            entry = self._entries.get(uuid)
            if entry is not None:
                self._entries.move_to_end(uuid)
                if CHECK_IN_PLACE:
                    self._check(uuid, entry[1])
        if entry is None:
            if snapshots:
                aggregate = repository.get(uuid, projector_func=project)
            else:
                aggregate = project(None, repository.event_store.get(originator_id=uuid))
                if aggregate is None:
                    raise AggregateNotFoundError(uuid)
            self.put(aggregate)
            return aggregate
        aggregate = _copy(entry[1])
        if not fresh:
            return aggregate
        newer = list(repository.event_store.get(originator_id=uuid, gt=entry[0]))
        if newer:
            aggregate = project(aggregate, newer)
            if aggregate is None:
                raise AggregateNotFoundError(uuid)
            self.put(aggregate)
        return aggregate

    def kept(self, uuid: UUID) -> tuple[int, Any] | None:
        """The version of ``uuid`` kept and a private copy of it; None when none is kept."""
        with self._lock:
            entry = self._entries.get(uuid)
            if entry is None:
                return None
            self._entries.move_to_end(uuid)
            if CHECK_IN_PLACE:
                self._check(uuid, entry[1])
        return entry[0], _copy(entry[1])

    def put(self, aggregate: Any) -> None:
        """Keep ``aggregate`` as it is now, unless a newer version is kept already."""
        data = _keep(aggregate)
        version = int(aggregate.version)
        with self._lock:
            kept = self._entries.get(aggregate.id)
            if CHECK_IN_PLACE and kept is not None:
                self._check(aggregate.id, kept[1])
            if kept is not None and kept[0] >= version:
                return
            self._entries[aggregate.id] = (version, data)
            self._entries.move_to_end(aggregate.id)
            if CHECK_IN_PLACE and not isinstance(data, bytes):
                self._prints[aggregate.id] = _print(data)
            while len(self._entries) > self.size:
                gone, _ = self._entries.popitem(last=False)
                self._prints.pop(gone, None)

    def _check(self, uuid: UUID, kept: Any) -> None:
        """``CHECK_IN_PLACE``: fail when the kept object of ``uuid`` changed since kept."""
        expected = self._prints.get(uuid)
        if expected is not None and _print(kept) != expected:
            raise ChangedInPlace(
                f"the cached {type(kept).__name__} {uuid} changed in place after it was kept: "
                f"its class is COPY_ON_WRITE, so its events and every caller must give an "
                f"attribute a new value (dict(...), [*...]) instead of changing the one it "
                f"shares with other copies"
            )

    def forget(self, uuids: Iterable[UUID]) -> None:
        """A save of these was refused (another writer's version): the next load reads."""
        with self._lock:
            for uuid in uuids:
                self._entries.pop(uuid, None)
                self._prints.pop(uuid, None)

    def saved(self, objs: Iterable[Any]) -> None:
        """What a save of this process committed (its pending events are collected)."""
        for obj in objs:
            if isinstance(obj, Aggregate) and not obj.pending_events:
                self.put(obj)

    def __len__(self) -> int:
        return len(self._entries)
