"""``store verify``: read the whole store and check it holds together.

1. Every event, in sequence order: sequences strictly increase (on SQLite
   with no gap: a gap means an event was deleted; on PostgreSQL gaps are
   normal, a failed write burns numbers, and are only counted), every event
   decodes and renders as the public log shows it.
2. Every aggregate replays: its versions run 1, 2, 3 … with no gap, and
   applying its events one by one raises nothing.
3. A GPU belongs to one node: no GPU UUID is listed by two adopted nodes, every GPU of an
   adopted node is claimed by it, and every claim is held by an adopted node that lists it
   (domain/gpu_claims.py).
4. Every read model, rebuilt from the log in a scratch SQLite database up to
   the live read model's own position, equals the live one row for row
   (each live read model is read under its projection lock, so its rows and
   its position belong together).

Problems are listed, never repaired; nothing is written to the store.
"""

from __future__ import annotations

import json
import math
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from eventsourcing.persistence import Notification

from better_compute.api.runtime import Projections, Runtime, StoreEvents
from better_compute.api.store.eventlog import render
from better_compute.api.store.store import StoreConfig, open_store
from better_compute.domain.gpu_claims import GpuClaim
from better_compute.domain.node import Node
from better_compute.projections.framework import ReadModels

PAGE = 1000
MAX_PROBLEMS = 100
Progress = Callable[[str, int, int], None]  # (phase, done, total)


class _Upto(StoreEvents):
    """The live log, seen only up to ``stop`` (a read model's position)."""

    def __init__(self, source: StoreEvents, stop: int) -> None:
        super().__init__(source.store)
        self.stop = stop

    def select(self, after: int, limit: int) -> Sequence[Notification]:
        return [n for n in super().select(after, limit) if n.id <= self.stop]


def _norm(value: Any) -> Any:
    """A column's value as compared: numbers as floats rounded to the microsecond (times are
    epoch seconds; a sum kept by adding and taking away, 2015.56 GiB at a time, drifts in its
    last bits, 1e-12 or so, from the same sum made at once: the same figure)."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int | float):
        return round(float(value), 6) + 0.0 if math.isfinite(float(value)) else str(value)
    if isinstance(value, memoryview | bytes):
        return bytes(value).decode()
    return value


def _snapshot(text: Any) -> Any:
    """An aggregate snapshot a row keeps, less the moment the snapshot was taken."""
    try:
        doc = json.loads(text)
    except (TypeError, ValueError):
        return text
    if isinstance(doc, dict):
        doc.pop("timestamp", None)
    return json.dumps(doc, sort_keys=True)


def _comparable(rows: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """Rows as sorted tuples of (column, value), numbers as floats (backends differ in types)."""
    return sorted((tuple(sorted((k, _snapshot(v) if k == "snapshot" else _norm(v))
                                for k, v in r.items())) for r in rows), key=repr)


def _row(row: tuple[Any, ...]) -> str:
    """A compared row as a person reads it (a long value cut short)."""
    return "{" + ", ".join(f"{k}={str(v)[:60]}" for k, v in row) + "}"


class Verifier:
    def __init__(self, runtime: Runtime, progress: Progress | None = None) -> None:
        self.runtime = runtime
        self.store = runtime.store
        self.progress = progress or (lambda phase, done, total: None)
        self.problems: list[str] = []

    def problem(self, text: str) -> None:
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append(text)

    def run(self) -> dict[str, Any]:
        events, aggregates = self.read_log()
        gpus = self.check_gpus(aggregates)
        projections = self.compare_projections()
        return {"ok": not self.problems, "store": self.runtime.config.describe(), **events,
                "gpus": gpus, "projections": projections, "problems": self.problems}

    # ------------------------------------------------------------ the log

    def read_log(self) -> tuple[dict[str, Any], dict[Any, Any]]:
        recorder = self.store.recorder
        decode = self.store.mapper.to_domain_event
        head = int(recorder.max_notification_id() or 0)
        dense = self.store.backend == "sqlite"
        versions: dict[Any, int] = {}
        aggregates: dict[Any, Any] = {}
        position, count, gaps = 0, 0, 0
        self.progress("events", 0, head)
        while True:
            page = recorder.select_notifications(start=position, limit=PAGE,
                                                 inclusive_of_start=False, stop=head)
            if not page:
                break
            for n in page:
                if n.id <= position:
                    self.problem(f"sequence {n.id} follows {position}: sequences must increase")
                elif n.id != position + 1:
                    gaps += 1
                    if dense:
                        self.problem(f"events {position + 1}..{n.id - 1} are missing (SQLite "
                                     "numbers every event: they were deleted)")
                position = max(position, n.id)
                count += 1
                self._check_event(n, decode, versions, aggregates)
            self.progress("events", position, head)
        if position < head:
            self.problem(f"the log ends at {position}, but its head is {head}")
        return ({"head": head, "events": count, "gaps": gaps, "aggregates": len(versions)},
                aggregates)

    def _check_event(self, n: Notification, decode: Any, versions: dict[Any, int],
                     aggregates: dict[Any, Any]) -> None:
        try:
            event = decode(n)
            render(n, decode)
        except Exception as exc:
            self.problem(f"event {n.id} ({n.topic}) does not decode: {exc}")
            return
        key = n.originator_id
        expected = versions.get(key, 0) + 1
        if n.originator_version != expected:
            self.problem(f"aggregate {key}: version {n.originator_version} at sequence {n.id}, "
                         f"expected {expected}")
        versions[key] = n.originator_version
        try:
            aggregates[key] = event.mutate(aggregates.get(key))
        except Exception as exc:
            self.problem(f"aggregate {key} does not replay at version {n.originator_version} "
                         f"(sequence {n.id}): {type(exc).__name__}: {exc}")

    # ------------------------------------------------------------ GPUs

    def check_gpus(self, aggregates: dict[Any, Any]) -> int:
        """The GPUs of adopted nodes, each checked against the claims; how many."""
        listed: dict[str, list[str]] = {}  # GPU UUID -> adopted nodes that list it
        for node in aggregates.values():
            if isinstance(node, Node) and node.adopted:
                for uuid in dict.fromkeys(g.get("uuid") for g in node.gpus):
                    listed.setdefault(str(uuid), []).append(node.public_id)
        holder = {c.uuid: c.node_id for c in aggregates.values()
                  if isinstance(c, GpuClaim) and c.node_id is not None}
        for uuid, nodes in sorted(listed.items()):
            if len(nodes) > 1:
                self.problem(f"GPU {uuid} is listed by {len(nodes)} adopted nodes "
                             f"({', '.join(sorted(nodes))}): a GPU belongs to one node. Drain "
                             "and remove the node that does not have it (`better-compute nodes "
                             "remove NODE`)")
            elif holder.get(uuid) != nodes[0]:
                self.problem(f"GPU {uuid} of adopted node {nodes[0]} is not claimed by it"
                             + (f" but by {holder[uuid]}" if uuid in holder else "")
                             + ": another node could take it. Drain and remove the node, then "
                             "join it again (its adoption claims its GPUs)")
        for uuid, node_id in sorted(holder.items()):
            if node_id not in listed.get(uuid, []):
                self.problem(f"GPU {uuid} is claimed by node {node_id}, which is not an "
                             "adopted node listing it: no other node can take the GPU. "
                             "Accept the holder's current inventory (`better-compute nodes "
                             f"accept-inventory {node_id}`) or remove it")
        return len(listed)

    # ------------------------------------------------------------ read models

    def compare_projections(self) -> dict[str, str]:
        live: Projections = self.runtime.projections
        out: dict[str, str] = {}
        with tempfile.TemporaryDirectory(prefix="bc-verify-") as folder:
            scratch_store = open_store(StoreConfig("sqlite", Path(folder),
                                                   sqlite_path=Path(folder) / "scratch.sqlite"))
            try:
                scratch = Projections(scratch_store)  # the same read models, empty
                for name in live.projections:
                    out[name] = self._compare(name, live, scratch)
            finally:
                scratch_store.close()
        return out

    def _compare(self, name: str, live: Projections, scratch: Projections) -> str:
        position, tables = live.rows_at_position(name)
        self.progress(f"rebuild {name}", 0, position)
        rebuilt = ReadModels(scratch.sql, _Upto(StoreEvents(self.store), position),
                                   [scratch.get(name)])
        rebuilt.catch_up(name, until=position)
        self.progress(f"rebuild {name}", position, position)
        _, again_tables = rebuilt.rows_at_position(name)
        for table, live_rows in tables.items():
            rows, again = _comparable(live_rows), _comparable(again_tables[table])
            if again != rows:
                extra = sorted(set(again) - set(rows), key=repr)
                missing = sorted(set(rows) - set(again), key=repr)
                first = (f"; live {_row(missing[0])}" if missing else "") + \
                    (f"; rebuilt {_row(extra[0])}" if extra else "")
                self.problem(f"read model {name}, table {table}: {len(rows)} live rows at "
                             f"position {position}, the rebuild has {len(again)} "
                             f"({len(missing)} differ or are missing, {len(extra)} differ or "
                             f"are extra{first}): run `better-compute projections rebuild "
                             f"{name}`")
                return f"differs at position {position}"
        return f"equal at position {position}"


def verify(runtime: Runtime, progress: Progress | None = None) -> dict[str, Any]:
    return Verifier(runtime, progress).run()
