"""The gateway's writes to nodes, a batch at a time: a fleet's sessions share each save.

Every session's change to its node (its opening, its end, an acceptance verdict) is queued
here; one task takes everything queued and gives it to ``NodeService.change_each`` in one
worker thread: one save for the whole batch. While that save runs, the next changes queue
up, so batches grow with the load and nothing waits for a timer (group commit): one node
alone is written at once, 10,000 nodes reconnecting after a restart share a few hundred
saves instead of making 10,000 (docs/performance.md, "A fleet on one server").

Each change still behaves as alone: it runs on its node as stored, its events carry its own
actor (the node, given with the change), its result or error goes back to its own session,
and a batch that meets another writer's save is run again one change at a time.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

import anyio
import anyio.abc

from better_compute.api.services.nodes import BATCH, NodeService
from better_compute.domain.errors import Unavailable
from better_compute.domain.node import Node


@dataclass
class _Change:
    uuid: UUID
    change: Callable[[Node], Any]
    actor: str
    done: anyio.Event = field(default_factory=anyio.Event)
    result: Any = None


class NodeWrites:
    """Sessions' node changes queued, saved a batch at a time (``run`` is the writer task)."""

    def __init__(self, nodes: NodeService,
                 call: Callable[..., Awaitable[Any]], max_batch: int = BATCH) -> None:
        self.nodes = nodes
        self.call = call  # a worker thread, a store outage raised as Unavailable
        self.max_batch = max_batch
        self._queue: list[_Change] = []
        self._wake = anyio.Event()
        self._stopped = False
        self.batches = 0
        self.changes = 0

    async def change(self, uuid: UUID, change: Callable[[Node], Any], *, actor: str) -> Any:
        """``change`` applied to node ``uuid`` and saved, its events ``actor``'s: what it
        returned (or raised). Not cancelled half-way: once queued, the caller waits for its
        save, as for a worker thread's."""
        if self._stopped:
            raise Unavailable("the server is stopping: connect again")
        item = _Change(uuid, change, actor)
        self._queue.append(item)
        self._wake.set()
        with anyio.CancelScope(shield=True):
            await item.done.wait()
        if isinstance(item.result, BaseException):
            raise item.result
        return item.result

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
                  ) -> None:
        """Write what is queued, batch after batch, until cancelled; whatever is queued
        then is answered ``Unavailable`` (the server stops), so no session waits forever."""
        task_status.started()
        try:
            while True:
                await self._wake.wait()
                self._wake = anyio.Event()
                while self._queue:
                    batch = self._queue[:self.max_batch]
                    del self._queue[:len(batch)]
                    await self._write(batch)
        finally:
            self._stopped = True
            stopping = Unavailable("the server is stopping: connect again")
            for item in self._queue:
                item.result = stopping
                item.done.set()
            self._queue.clear()

    async def _write(self, batch: list[_Change]) -> None:
        try:
            with anyio.CancelScope(shield=True):  # a save under way ends, and says so
                results = await self.call(self.nodes.change_each,
                                          [(item.uuid, item.change, item.actor)
                                           for item in batch])
        except Exception as exc:  # the store away: every change of the batch gets it
            results = [exc] * len(batch)
        self.batches += 1
        self.changes += len(batch)
        for item, result in zip(batch, results, strict=True):
            item.result = result
            item.done.set()
