"""Prometheus metrics of ``serve``: /metrics on the API, and a loopback listener (docs/metrics.md).

Two kinds of metric:

* counted as things happen in this process: RPC requests and their latency by method
  and error code (``observe``, called once per request from the event loop, with the
  label children cached), store errors, open /watch streams;
* read at scrape time by a custom collector (:class:`_Collector`) from the same read
  models the API answers from: capacity by pool and state, nodes, reservations, the
  event log head and each projection's lag, and the process's gateway sessions and
  controller leadership. Every projection is caught up first (after its lag is read), as
  ``capacity.get`` and ``reservations.list`` do, so a scrape equals their answers and a
  projection's lag is what accumulated since the last scrape or query: it stays small
  unless the projection cannot keep up or cannot apply an event.
  A scrape is a handful of queries (pools, nodes by pool and state, the nodes that are
  not ready, the reservation counts the projection keeps): its output grows with pools
  and with the nodes that need attention, never with the fleet, the events or the
  reservations (one series per node cost about 0.1 ms each to write: too much at 10,000).

Under ``serve --workers N`` (api/http/workers.py) the parent gives its workers a directory
of its own in ``PROMETHEUS_MULTIPROC_DIR`` (created empty, removed when the server ends):
the counted instruments are prometheus-client's multiprocess values there, and a scrape on
any worker sums every worker's files (``MultiProcessCollector``), so it shows the server's
totals. The gauges of a process's state are set where they change (open /watch streams) or
published each second by every worker (gateway sessions, controller leadership: worker 0's,
read where they live) and summed over the live workers. The collector of the read models
runs in the scraping worker only, once per scrape, and ``process_*`` describe the whole
server: the parent and its workers, summed (``_ServerProcesses``).
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
)
from prometheus_client.core import GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.process_collector import ProcessCollector

from better_compute.api.http.request_log import RequestRecord
from better_compute.projections.capacity import (
    capacity_resources,
    nodes_not_ready,
    read_all_capacity,
)
from better_compute.projections.reservations import count_reservations

log = logging.getLogger("better_compute.metrics")
disable_created_metrics()  # type: ignore[no-untyped-call]  # no *_created series: a counter's start is not worth a series each
NS = "better_compute"
MULTIPROCESS_DIR = "PROMETHEUS_MULTIPROC_DIR"  # set by serve --workers' parent only
PUBLISH_EVERY = 1.0  # seconds between a worker's writes of its state gauges (--workers)
_WORKER_OF: dict[str, int] = {}  # {"parent": pid} in a worker of --workers (as_worker_of)

RPC_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_RESOURCE_METRICS = {"gpu": ("pool_gpus", "GPUs of a pool by capacity state"),
                     "cpu": ("pool_cpus", "CPUs of a pool by capacity state"),
                     "memory": ("pool_memory_gibibytes", "memory of a pool (GiB) by capacity "
                                "state")}


def as_worker_of(parent: int) -> None:
    """This process is a worker of ``serve --workers`` whose parent is ``parent``: its
    metrics go to the run's ``PROMETHEUS_MULTIPROC_DIR`` (api/http/workers.py)."""
    _WORKER_OF["parent"] = parent


class ServerMetrics:
    """The instruments of one server process and the registry its /metrics renders."""

    def __init__(self) -> None:
        # A worker's only: elsewhere the variable is not ours to follow (docs/metrics.md).
        shared = os.environ.get(MULTIPROCESS_DIR) if _WORKER_OF else None
        self.registry = CollectorRegistry(auto_describe=False)
        # First: a scrape that fails counts in store_errors, collected after it.
        self.registry.register(_Collector(self))
        # Counted here, or (--workers) in this worker's files, which the scrape sums.
        own = None if shared else self.registry
        if shared:
            MultiProcessCollector(self.registry, path=shared)  # type: ignore[no-untyped-call]
        self.requests = Counter(f"{NS}_rpc_requests", "JSON-RPC requests answered, by method "
                                "and error code (ok for a result)", ["method", "code"],
                                registry=own)
        self.latency = Histogram(f"{NS}_rpc_duration_seconds", "time to answer a JSON-RPC "
                                 "request, by method and error code", ["method", "code"],
                                 buckets=RPC_BUCKETS, registry=own)
        self.store_errors = Counter(f"{NS}_store_errors", "errors of the event store seen by "
                                    "API requests (rpc) and by scrapes (scrape)", ["where"],
                                    registry=own)
        self.watch_streams = Gauge(f"{NS}_watch_streams", "open /watch streams of the server",
                                   multiprocess_mode="livesum", registry=own)
        self.gateway_sessions = Gauge(f"{NS}_gateway_sessions", "agent sessions open on the "
                                      "server's gateway", multiprocess_mode="livesum",
                                      registry=own)
        self.connections = Gauge(f"{NS}_http_connections", "HTTP connections open on the "
                                 "server's API listener", multiprocess_mode="livesum",
                                 registry=own)
        self.connections_refused = Counter(
            f"{NS}_http_connections_refused", "HTTP connections refused at their start: past "
            "the bound per client address (address) or per server process (server); before "
            "their TLS handshake, past the bound of handshakes under way per client address "
            "(handshake_address), or the oldest under way dropped at the bound per server "
            "process (handshake_server)",
            ["per"], registry=own)
        self.leader = Gauge(f"{NS}_controllers_leader", "1 while the server runs the "
                            "controllers", multiprocess_mode="livemax", registry=own)
        if shared:
            self.registry.register(_ServerProcesses(_WORKER_OF["parent"]))
        else:
            ProcessCollector(registry=self.registry)
        self.state: Any = None
        self._children: dict[tuple[str, str], tuple[Any, Any]] = {}

    def bind(self, state: Any) -> None:
        """The server's state (runtime, watch hub, gateway), once the lifespan starts."""
        self.state = state

    def publish(self) -> None:
        """Set the gauges of this process's state: its gateway's sessions, leadership."""
        extra: dict[str, Any] = self.state.extra if self.state is not None else {}
        gateway = extra.get("gateway")
        self.gateway_sessions.set(len(gateway.sessions) if gateway is not None else 0)
        self.leader.set(1 if extra.get("controllers_leader") else 0)

    def connection_refused(self, per: str) -> None:
        self.connections_refused.labels(per).inc()

    def observe(self, record: RequestRecord, seconds: float) -> None:
        key = (record.method, record.code)
        children = self._children.get(key)
        if children is None:
            children = self._children[key] = (self.requests.labels(*key),
                                              self.latency.labels(*key))
        children[0].inc()
        children[1].observe(seconds)
        if record.store_error:
            self.store_errors.labels("rpc").inc()

    async def stream(self, lines: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        """A /watch stream, counted while it is open."""
        self.watch_streams.inc()
        try:
            async for chunk in lines:
                yield chunk
        finally:
            self.watch_streams.dec()

    def render(self) -> bytes:
        """The exposition text (runs queries: call it in a worker thread)."""
        return generate_latest(self.registry)


async def publish_state(state: Any, *,
                        task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
                        ) -> None:
    """A worker's lifespan task under --workers: its state gauges, written each second, so
    a scrape answered by another worker sums them (a scrape refreshes its own first)."""
    metrics: ServerMetrics = state.extra["metrics"]
    task_status.started()
    while True:
        metrics.publish()
        await anyio.sleep(PUBLISH_EVERY)


class _ServerProcesses:
    """``process_*`` of the whole server under --workers: the parent and each worker read
    by prometheus-client's ProcessCollector; CPU time, memory and open files summed, the
    start time and the descriptor limit the parent's."""

    SUMMED = frozenset({"process_cpu_seconds", "process_resident_memory_bytes",
                        "process_virtual_memory_bytes", "process_open_fds"})

    def __init__(self, parent: int) -> None:
        self.parent = parent
        self._pid = parent
        self._process = ProcessCollector(pid=lambda: self._pid, registry=None)

    def _pids(self) -> list[int]:
        try:
            path = Path(f"/proc/{self.parent}/task/{self.parent}/children")
            return [self.parent, *(int(pid) for pid in path.read_text().split())]
        except (OSError, ValueError):  # no /proc (ProcessCollector reads nothing either)
            return [os.getpid()]

    def collect(self) -> Iterator[Metric]:
        merged: dict[str, Metric] = {}
        for pid in self._pids():
            self._pid = pid
            for family in self._process.collect():
                seen = merged.get(family.name)
                if seen is None:
                    merged[family.name] = family
                elif family.name in self.SUMMED and family.samples and seen.samples:
                    first = seen.samples[0]
                    seen.samples[0] = first._replace(value=first.value + family.samples[0].value)
        yield from merged.values()


def _gauge(name: str, documentation: str, labels: list[str] | None = None) -> GaugeMetricFamily:
    return GaugeMetricFamily(f"{NS}_{name}", documentation, labels=labels)


class _Collector:
    """What is read at scrape time: this process's state, then the read models."""

    def __init__(self, metrics: ServerMetrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        state = self.metrics.state
        self.metrics.publish()  # this process's state gauges, fresh for its own scrape
        if state is not None:
            yield from self._read_models(state.runtime)

    def _read_models(self, runtime: Any) -> Iterator[Metric]:
        started = time.perf_counter()
        up = _gauge("store_up", "1 when this scrape could read the store's read models")
        try:
            families = list(_read(runtime))
        except Exception as exc:
            self.metrics.store_errors.labels("scrape").inc()
            log.warning("metrics: cannot read the store: %s", exc)
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        took = _gauge("read_models_scrape_seconds", "time this scrape spent reading the store")
        took.add_metric([], time.perf_counter() - started)
        yield from (up, took, *families)


def _read(runtime: Any) -> Iterator[Metric]:
    projections = runtime.projections
    status = projections.status()  # before catching up: how far behind the readers were
    head = _gauge("event_log_head", "sequence of the last event in the log")
    head.add_metric([], status[0].head if status else projections.source.head())
    position = _gauge("projection_position", "last sequence a read model has applied",
                      ["projection"])
    lag = _gauge("projection_lag_events", "events a read model had not applied yet when "
                 "scraped", ["projection"])
    for each in status:
        position.add_metric([each.name], each.position)
        lag.add_metric([each.name], each.lag)
    yield from (head, position, lag)
    for each in status:  # as queries do; one that cannot apply shows as a growing lag
        try:
            projections.catch_up(each.name)
        except Exception as exc:
            log.warning("metrics: projection %s cannot catch up: %s", each.name, exc)
    yield from _pools(projections.sql)
    yield from _nodes(projections.sql)
    reservations = _gauge("reservations", "reservations by tenant, pool and state",
                          ["tenant", "pool", "state"])
    for tenant, pool, state, n in count_reservations(projections.sql):
        reservations.add_metric([tenant, pool, state], n)
    yield reservations


def _pool_docs(sql: Any) -> list[dict[str, Any]]:
    with sql.transaction(commit=False) as cursor:
        sql.execute(cursor, "SELECT doc FROM bc_listing WHERE kind = 'pool' ORDER BY created_seq")
        return [json.loads(row["doc"]) for row in cursor.fetchall()]


def _pools(sql: Any) -> Iterator[Metric]:
    docs = _pool_docs(sql)
    info = InfoMetricFamily(f"{NS}_pool", "a pool's site, GPU model and owner",
                            labels=["pool"])
    for doc in docs:
        info.add_metric([doc["id"]], {"site": doc["siteId"], "gpu_model": doc["gpuModel"],
                                      "tenant": doc["tenantId"]})
    sums, nodes = read_all_capacity(sql, [doc["id"] for doc in docs])
    families = {r: _gauge(name, text, ["pool", "state"])
                for r, (name, text) in _RESOURCE_METRICS.items()}
    for pool, rows in sums.items():
        for resource, fields in capacity_resources(rows).items():
            for field, value in fields.items():
                if field != "unit":
                    families[resource].add_metric([pool, field], value)
    counts = _gauge("pool_nodes", "nodes of a pool (removed ones left it): total, by "
                    "provision state, connected, unreachable", ["pool", "state"])
    for pool, by_state in nodes.items():
        for name, n in by_state.items():
            counts.add_metric([pool, name], n)
    yield from (info, *families.values(), counts)


def _nodes(sql: Any) -> Iterator[Metric]:
    family = _gauge("node_not_ready", "1 for each reason a node of a pool cannot take work: "
                    "adopting, never/disconnected/unreachable, cordoned",
                    ["node", "pool", "reason"])
    for node, pool, reason in nodes_not_ready(sql):
        family.add_metric([node, pool, reason], 1)
    yield family
