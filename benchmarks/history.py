"""History checker: random clients and watchers against real servers while faults strike; every
call and every stream recorded; then the whole history checked against the invariants.

    .venv/bin/python -m better_compute.benchmarks.history [--backend sqlite|postgres]
        [--replicas 2] [--workers 2] [--clients 8] [--minutes 1] [--fault-every 20]
        [--seed N] [--keep DIR] [--pg-url URL]
    .venv/bin/python -m better_compute.benchmarks.history --check HISTORY.jsonl

The installation is made fresh (``Installation``): a store (SQLite in a data dir; PostgreSQL in a
cluster of its own, started with scripts/pg so that it can be restarted, or in a new schema of
``--pg-url``, which no fault restarts), a pool of simulated adopted nodes plus one GPU server run
by a real ``bcd node``, two tenants with quotas, and ``--replicas`` ``serve`` processes of
``--workers`` workers each over the one store, started again when they die, as a service manager
does. Then, for ``--minutes``:

- clients (``Client``), each with its own token, do random operations with random keys: create
  now, later, at the earliest start or queued; extend, release, cancel; send an acknowledged
  create again with its key; and an operator cordons, drains and uncordons nodes and revokes
  tokens. A call that times out or fails in transit is sent again with the same key;
- watchers (``Watcher``) follow /watch as each tenant, and reconnect from their position after
  any failure, to any replica;
- a fault every ``--fault-every`` seconds (``Installation.faults``): SIGKILL of a worker,
  SIGKILL of a replica, a PostgreSQL restart, the store paused for seconds, SIGKILL of bcd.

Every call is recorded with its request, its answer (or how it failed) and when it was sent and
answered; every line of every watcher too. Then the event log, what each watcher's tenant sees
of it, usage and ``store verify`` are recorded, and benchmarks/history_check.py checks the
invariants on the records alone. The history is one JSON line per record, kept in ``--keep``
(else a new temporary folder, named on standard output); a broken invariant is printed with the
smallest slice of the history that shows it, and the command exits 1.

``Workload`` runs clients, watchers and faults against any list of URLs, so tests, and an
installation behind HAProxy, run the same clients and checks against other targets.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import socket
import sqlite3
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from better_compute.benchmarks.harness import (
    CLI,
    drop_schema,
    free_port,
    initialized,
    load_average,
    store_env,
)

BCD = str(Path(sys.executable).parent / "bcd")
PG_SCRIPT = str(Path(__file__).resolve().parent.parent / "scripts" / "pg")
# Answers that say for certain the call changed nothing; any other failure (a timeout, a
# connection lost, ``unavailable`` or ``internal`` while the store or a process went away) may
# have committed, so its outcome is unknown.
REFUSALS = frozenset({"invalid_input", "not_found", "conflict", "quota_exceeded",
                      "no_capacity", "permission_denied", "unauthenticated", "expired",
                      "kubernetes_not_enabled", "rate_limited"})
QUOTAS = {"acme": 6, "beta": 4}  # the tenants' gpu quotas on the pool; root is unlimited
CALL_TIMEOUT = 20.0  # seconds a client waits for an answer
CUT_S = 10  # usage is compared up to this many seconds before it is asked for (``collect``)
RETRIES = 4  # sends of one call whose outcome stays unknown (the same key each time)
# Fast timers: a killed bcd is noticed, bindings time out and watchers hear heartbeats within
# the seconds a short schedule lasts.
SERVE_ENV = {"BETTER_COMPUTE_WATCH_HEARTBEAT": "0.5", "BETTER_COMPUTE_NODE_HEARTBEAT": "1",
             "BETTER_COMPUTE_NODE_UNREACHABLE_AFTER": "5", "BETTER_COMPUTE_CONTROLLER_TICK": "0.5",
             "BETTER_COMPUTE_SHUTDOWN_GRACE": "2"}


# ------------------------------------------------------------------ the record


class History:
    """Records, in the order they happened, kept in memory and appended to a JSON-lines file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.records: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._file = path.open("a")

    def add(self, record: dict[str, Any]) -> None:
        line = json.dumps(record, separators=(",", ":"))
        with self._lock:
            self.records.append(record)
            self._file.write(line + "\n")

    def close(self) -> None:
        with self._lock:
            self._file.close()

    @staticmethod
    def load(path: Path) -> list[dict[str, Any]]:
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@dataclass
class Answer:
    outcome: str  # "ack", "refused" (certainly changed nothing) or "unknown"
    result: Any = None
    code: str | None = None
    message: str = ""


def _trim(result: Any) -> Any:
    """What the history keeps of an answer: a reservation's or a token's identity and times."""
    if not isinstance(result, dict):
        return None
    keep = ("id", "state", "start", "end", "endedAt", "gpus", "gpuCount", "key", "nodeId",
            "allocationId", "tenantId", "provisionState", "cordoned", "draining", "head")
    return {k: result[k] for k in keep if k in result}


class Api:
    """JSON-RPC 2.0 over HTTPS to the installation's ``targets`` (https://host:port each)."""

    def __init__(self, targets: Sequence[str], ca_file: Path, timeout: float = CALL_TIMEOUT
                 ) -> None:
        self.targets = list(targets)
        self.context = ssl.create_default_context(cafile=str(ca_file))
        self.timeout = timeout

    def session(self, timeout: float | None = None) -> httpx.Client:
        return httpx.Client(verify=self.context, timeout=timeout or self.timeout)

    def call(self, http: httpx.Client, target: str, token: str, method: str,
             params: Mapping[str, Any]) -> Answer:
        try:
            response = http.post(f"{target}/api/compute/rpc",
                                 json={"jsonrpc": "2.0", "id": 1, "method": method,
                                       "params": dict(params)},
                                 headers={"authorization": f"Bearer {token}"})
            body = response.json()
        except (httpx.HTTPError, ValueError) as exc:
            return Answer("unknown", code="transport", message=f"{type(exc).__name__}: {exc}")
        if "result" in body:
            return Answer("ack", body["result"])
        error = body.get("error") or {}
        code = str((error.get("data") or {}).get("code") or error.get("code"))
        return Answer("refused" if code in REFUSALS else "unknown", code=code,
                      message=str(error.get("message", ""))[:300])

    def root_call(self, token: str, method: str, params: Mapping[str, Any]) -> Any:
        """A call the harness itself makes (setting up, collecting): any target that answers,
        within a minute; its result."""
        deadline = time.monotonic() + 60
        with self.session() as http:
            while True:
                for target in self.targets:
                    answer = self.call(http, target, token, method, params)
                    if answer.outcome == "ack":
                        return answer.result
                    if answer.outcome == "refused" or time.monotonic() > deadline:
                        raise RuntimeError(f"{method}: {answer.code}: {answer.message}")
                time.sleep(0.5)


# ------------------------------------------------------------------ who calls


@dataclass(frozen=True)
class Actor:
    name: str
    tenant: str
    token: str


@dataclass
class Setup:
    """What the clients act on: the pool, its simulated nodes, the quotas and the tokens."""

    pool: str
    nodes: list[str]
    quotas: dict[str, int]
    clients: list[Actor]
    watchers: list[Actor]
    operator: Actor

    def record(self) -> dict[str, Any]:
        return {"kind": "setup", "pool": self.pool, "nodes": self.nodes, "quotas": self.quotas,
                "clients": {a.name: a.tenant for a in self.clients},
                "watchers": {a.name: a.tenant for a in self.watchers}}


def prepare(runtime: Any, root_token: str, *, clients: int, nodes: int) -> Setup:
    """The pool (simulated adopted nodes), the tenants with their quotas, and a token per client
    and watcher, made in the store directly (before any server runs)."""
    from better_compute.benchmarks.fleet import add_nodes, make_pool
    from better_compute.domain.access import LOCAL_OPERATOR as OP

    service = runtime.service
    pool = make_pool(service, key="pool-history")
    node_ids = add_nodes(service, pool, nodes) if nodes else []
    for tenant, quota in QUOTAS.items():
        service.tenants_create(OP, tenant, None)
        service.pools_offer(OP, pool, tenant, {"gpu": quota})
    tenants = [*QUOTAS, "root"]  # every third client is the pool's owner, with small demand

    def token(tenant: str, name: str) -> str:
        return str(service.tokens_create(OP, tenant, "member", name)["token"])

    actors = [Actor(f"c{n}", tenants[n % 3], token(tenants[n % 3], f"client-{n}"))
              for n in range(clients)]
    watchers = [Actor(f"w-{t}", t, token(t, f"watch-{t}")) for t in tenants]
    return Setup(pool, node_ids, dict(QUOTAS), actors, watchers,
                 Actor("operator", "root", root_token))


# ------------------------------------------------------------------ clients


class Client(threading.Thread):
    """One client's loop of random operations until ``stop`` is set; every call recorded."""

    def __init__(self, actor: Actor, setup: Setup, api: Api, history: History, seed: int,
                 stop: threading.Event) -> None:
        super().__init__(name=f"client-{actor.name}", daemon=True)
        self.actor, self.setup, self.api, self.history = actor, setup, api, history
        self.rng = random.Random(seed)
        self.stop = stop
        self.turn = self.rng.randrange(len(api.targets))
        self.mine: dict[str, dict[str, Any]] = {}  # reservation id -> its last answer
        self.acked: list[dict[str, Any]] = []  # params of acknowledged creates
        self.count = 0
        self.http: httpx.Client | None = None
        owner = actor.tenant == "root"
        self.ops: list[tuple[Callable[[], None], int]] = [
            (self.create_now, 6 if owner else 30), (self.create_later, 2 if owner else 6),
            (self.create_earliest, 2 if owner else 6), (self.create_queued, 2 if owner else 8),
            (self.extend, 8), (self.release, 20), (self.cancel, 8), (self.again, 4),
            (self.look, 4)]

    def run(self) -> None:
        with self.api.session() as self.http:
            while not self.stop.is_set():
                operations, weights = zip(*self.ops, strict=True)
                self.rng.choices(operations, weights)[0]()
                self.stop.wait(self.rng.uniform(0.0, 0.05))

    def rpc(self, method: str, params: dict[str, Any], *, token: str | None = None,
            note: str | None = None) -> Answer:
        assert self.http is not None
        target = self.api.targets[self.turn % len(self.api.targets)]
        sent = time.time()
        answer = self.api.call(self.http, target, token or self.actor.token, method, params)
        record = {"kind": "call", "client": self.actor.name, "tenant": self.actor.tenant,
                  "method": method, "params": params, "sent": sent, "done": time.time(),
                  "outcome": answer.outcome, "code": answer.code, "result": _trim(answer.result),
                  "target": target}
        if answer.outcome != "ack":
            record["message"] = answer.message
        if note:
            record["note"] = note
        self.history.add(record)
        if answer.outcome == "unknown":
            self.turn += 1  # the next call tries another replica
        return answer

    def settled(self, method: str, params: dict[str, Any], note: str | None = None) -> Answer:
        """``method`` sent again while its outcome is unknown (a retry-safe call: a create with
        its key, a release, a cancel), at most ``RETRIES`` times."""
        answer = self.rpc(method, params, note=note)
        for _ in range(RETRIES - 1):
            if answer.outcome != "unknown" or self.stop.wait(0.3):
                break
            answer = self.rpc(method, params, note="retry")
        return answer

    # --------------------------------------------------------------- creates

    def _create(self, gpus: int, duration: str, **extra: Any) -> None:
        self.count += 1
        params = {"poolId": self.setup.pool, "gpus": gpus, "duration": duration,
                  "key": f"{self.actor.name}-{self.count}", **extra}
        answer = self.settled("reservations.create", params)
        if answer.outcome == "ack":
            self.mine[answer.result["id"]] = answer.result
            self.acked.append(params)

    def _gpus(self) -> int:
        return self.rng.randint(1, 2) if self.actor.tenant == "root" else self.rng.randint(1, 4)

    def create_now(self) -> None:
        self._create(self._gpus(), self.rng.choice(["1m", "2m", "5m"]))

    def create_later(self) -> None:
        self._create(self._gpus(), "10m", start=f"+{self.rng.randint(2, 30)}m")

    def create_earliest(self) -> None:
        self._create(self._gpus(), self.rng.choice(["1m", "3m"]), start="earliest")

    def create_queued(self) -> None:
        self._create(self._gpus(), self.rng.choice(["1m", "2m"]), queue=True,
                     queueTimeout=self.rng.choice(["1m", "2m"]))

    def again(self) -> None:
        """An acknowledged create sent again with its key: the same reservation, booked once."""
        if self.acked:
            self.settled("reservations.create", dict(self.rng.choice(self.acked)), note="again")

    # --------------------------------------------------------------- changes

    def _pick(self, states: tuple[str, ...], started: bool | None = None) -> str | None:
        now = time.time()
        ids = [i for i, doc in self.mine.items() if doc.get("state") in states and (
            started is None or ((_epoch(doc.get("start")) <= now) == started))]
        return self.rng.choice(ids) if ids else None

    def extend(self) -> None:
        rsv = self._pick(("placed", "binding", "active"))
        if rsv is not None:  # not sent again: a second extend that lands extends twice
            answer = self.rpc("reservations.extend", {"reservationId": rsv, "by": "1m"})
            if answer.outcome == "ack":
                self.mine[rsv] = answer.result

    def release(self) -> None:
        rsv = self._pick(("placed", "binding", "active"), started=True)
        if rsv is not None:
            answer = self.settled("reservations.release", {"reservationId": rsv})
            if answer.outcome == "ack":
                self.mine[rsv] = answer.result

    def cancel(self) -> None:
        rsv = self._pick(("queued",)) or self._pick(("placed",), started=False)
        if rsv is not None:
            answer = self.settled("reservations.cancel", {"reservationId": rsv})
            if answer.outcome == "ack":
                self.mine[rsv] = answer.result

    def look(self) -> None:
        rsv = self._pick(("placed", "binding", "active", "queued"))
        if rsv is not None:
            answer = self.rpc("reservations.get", {"reservationId": rsv})
            if answer.outcome == "ack":
                self.mine[rsv] = answer.result


class Operator(Client):
    """The platform operator: reserves a little, cordons, drains and uncordons the simulated
    nodes, and mints tokens it revokes (a revoked token must be refused at once)."""

    def __init__(self, actor: Actor, setup: Setup, api: Api, history: History, seed: int,
                 stop: threading.Event) -> None:
        super().__init__(actor, setup, api, history, seed, stop)
        self.ops = [(self.create_now, 2), (self.release, 2), (self.maintain, 3),
                    (self.revoke, 2), (self.look, 1)]

    def maintain(self) -> None:
        if not self.setup.nodes:
            return
        node = self.rng.choice(self.setup.nodes)
        method = self.rng.choice(["nodes.cordon", "nodes.drain", "nodes.uncordon",
                                  "nodes.uncordon"])
        self.rpc(method, {"nodeId": node} | ({} if method == "nodes.uncordon"
                                             else {"reason": "history check"}))
        self.stop.wait(0.5)

    def revoke(self) -> None:
        tenant = self.rng.choice(list(self.setup.quotas))
        made = self.settled("tokens.create", {"tenantId": tenant, "role": "member",
                                              "name": f"revoked-{self.count}"})
        self.count += 1
        if made.outcome != "ack":
            return
        secret, token_id = made.result["token"], made.result["id"]
        self.rpc("system.whoami", {}, token=secret, note=f"token {token_id} before its revoke")
        if self.settled("tokens.revoke", {"tokenId": token_id}).outcome == "ack":
            self.rpc("system.whoami", {}, token=secret, note=f"token {token_id} revoked")


def _epoch(text: Any) -> float:
    if not text:
        return 0.0
    from datetime import datetime

    return datetime.fromisoformat(str(text).replace("Z", "+00:00")).timestamp()


# ------------------------------------------------------------------ watchers


class Watcher(threading.Thread):
    """One tenant's /watch stream from sequence 0, reconnected from its position (to the next
    target) whenever it ends; every event line, heartbeat and reconnect recorded."""

    def __init__(self, actor: Actor, api: Api, history: History, stop: threading.Event,
                 first: int = 0) -> None:
        super().__init__(name=f"watch-{actor.name}", daemon=True)
        self.actor, self.api, self.history, self.stop = actor, api, history, stop
        self.turn = first
        self.position = 0  # every visible event up to here was received
        self._socket: socket.socket | None = None

    def run(self) -> None:
        with self.api.session(timeout=15.0) as http:
            while not self.stop.is_set():
                target = self.api.targets[self.turn % len(self.api.targets)]
                self.note("connect", since=self.position, target=target)
                try:
                    reason = self._follow(http, target)
                except Exception as exc:  # the replica died, the stream broke: reconnect
                    reason = f"{type(exc).__name__}: {exc}"[:200]
                self.note("end", reason=reason)
                self.turn += 1
                self.stop.wait(0.2)

    def _follow(self, http: httpx.Client, target: str) -> str:
        with http.stream("GET", f"{target}/api/compute/events/watch",
                         params={"since": self.position},
                         headers={"authorization": f"Bearer {self.actor.token}"}) as response:
            if response.status_code != 200:
                return f"status {response.status_code}"
            self._socket = response.extensions["network_stream"].get_extra_info("socket")
            for line in response.iter_lines():
                if not line.strip():
                    continue
                doc = json.loads(line)
                if "sequence" in doc:
                    self.history.add({"kind": "watch", "watcher": self.actor.name,
                                      "what": "event", "sequence": doc["sequence"],
                                      "type": doc["type"], "tenantId": doc["tenantId"],
                                      "subject": doc["subject"]})
                    self.position = max(self.position, int(doc["sequence"]))
                elif doc.get("heartbeat"):
                    if int(doc["head"]) > self.position:
                        self.note("heartbeat", head=int(doc["head"]))
                        self.position = int(doc["head"])
                elif "error" in doc:
                    return f"error {doc['error'].get('code')}"
        return "closed"

    def note(self, what: str, **fields: Any) -> None:
        self.history.add({"kind": "watch", "watcher": self.actor.name, "what": what,
                          "at": time.time(), **fields})

    def close(self) -> None:
        """Stop: the stream's socket is shut down (a read in OpenSSL wakes), then joined."""
        self.stop.set()
        if self._socket is not None:
            with contextlib.suppress(OSError):
                self._socket.shutdown(socket.SHUT_RDWR)
        self.join(30)


# ------------------------------------------------------------------ faults


@dataclass(frozen=True)
class Fault:
    name: str
    strike: Callable[[random.Random], str]  # does it; says what it struck


class FaultSchedule(threading.Thread):
    """A fault every ``every`` seconds (the first after ``every``), cycling through ``faults``
    in a shuffled order; each recorded with what it struck and when it was over."""

    def __init__(self, faults: Sequence[Fault], every: float, history: History, seed: int,
                 stop: threading.Event) -> None:
        super().__init__(name="faults", daemon=True)
        self.faults, self.every, self.history, self.stop = list(faults), every, history, stop
        self.rng = random.Random(seed)
        self.count = 0

    def run(self) -> None:
        order: list[Fault] = []
        while self.faults and not self.stop.wait(self.every):
            if not order:
                order = self.rng.sample(self.faults, len(self.faults))
            fault = order.pop()
            began = time.time()
            try:
                struck, error = fault.strike(self.rng), None
            except Exception as exc:
                struck, error = "", f"{type(exc).__name__}: {exc}"
            self.count += 1
            self.history.add({"kind": "fault", "name": fault.name, "struck": struck,
                              "at": began, "done": time.time(), "error": error})


# ------------------------------------------------------------------ the run


@dataclass
class Workload:
    """Clients, watchers and a fault schedule against ``api``'s targets, then the record of
    what the installation holds (``collect``)."""

    api: Api
    setup: Setup
    history: History
    faults: Sequence[Fault] = ()
    fault_every: float = 20.0
    seed: int = 0
    stop: threading.Event = field(default_factory=threading.Event)
    fault_count: int = 0

    def run(self, seconds: float, ready: Callable[[], None] = lambda: None) -> None:
        """Run for ``seconds``; then the faults stop, ``ready`` waits for the installation to be
        whole again, the clients finish, and the watchers read up to the log's head."""
        self.history.add(self.setup.record() | {"seed": self.seed, "at": time.time()})
        watch_stop, fault_stop = threading.Event(), threading.Event()
        watchers = [Watcher(a, self.api, self.history, watch_stop, first=n)
                    for n, a in enumerate(self.setup.watchers)]
        clients: list[Client] = [Client(a, self.setup, self.api, self.history,
                                        self.seed * 1000 + n, self.stop)
                                 for n, a in enumerate(self.setup.clients)]
        clients.append(Operator(self.setup.operator, self.setup, self.api, self.history,
                                self.seed * 1000 + 999, self.stop))
        schedule = FaultSchedule(self.faults, self.fault_every, self.history, self.seed,
                                 fault_stop)
        for thread in [*watchers, *clients, schedule]:
            thread.start()
        try:
            fault_stop.wait(seconds)
        finally:
            fault_stop.set()
            schedule.join()
            self.fault_count = schedule.count
            ready()
            self.stop.set()
            for client in clients:
                client.join(CALL_TIMEOUT * RETRIES + 30)
            head = self.head()
            deadline = time.monotonic() + 60
            while any(w.position < head for w in watchers) and time.monotonic() < deadline:
                time.sleep(0.2)
            for watcher in watchers:
                watcher.close()
            self.history.add({"kind": "quiet", "head": head, "at": time.time(),
                              "reached": {w.actor.name: w.position for w in watchers}})

    def head(self) -> int:
        return int(self.api.root_call(self.setup.operator.token, "events.list",
                                      {"since": 0, "limit": 1})["head"])

    def collect(self) -> None:
        """Usage, then the event log as root sees it and what each watcher's tenant sees.

        The controllers still write (a reservation's end, the queue): usage is reported up to
        an instant ``CUT_S`` before it is asked for, and the log read after it, so every event
        that changed a booked interval before that instant is in the log."""
        root = self.setup.operator.token
        cut = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(time.time() - CUT_S)) + "Z"
        since_day = time.strftime("%Y-%m-%dT00:00:00Z", time.gmtime(time.time() - 86400))
        report = self.api.root_call(root, "usage.report", {"from": since_day, "to": cut,
                                                           "by": ["tenant"]})
        self.history.add({"kind": "usage", "report": report})
        since, head = 0, self.head()
        while since < head:
            page = self.api.root_call(root, "events.list", {"since": since, "limit": 1000})
            self.history.add({"kind": "log", "events": page["events"]})
            since = int(page["next"])
        for actor in self.setup.watchers:
            seen: list[int] = []
            since = 0
            while since < head:
                page = self.api.root_call(actor.token, "events.list",
                                          {"since": since, "limit": 1000})
                seen += [int(e["sequence"]) for e in page["events"]]
                since = int(page["next"])
            self.history.add({"kind": "visible", "watcher": actor.name, "tenant": actor.tenant,
                              "head": head, "sequences": seen})


# ------------------------------------------------------------------ a local installation


def _wait_for(path: Path, needle: str, process: subprocess.Popen[bytes], what: str,
              timeout: float = 120.0) -> None:
    """Until ``needle`` is in the file ``path`` (a process's output), or fail with its tail."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and needle in path.read_text(errors="replace"):
            return
        if process.poll() is not None:
            break
        time.sleep(0.1)
    tail = path.read_text(errors="replace")[-3000:] if path.exists() else ""
    raise RuntimeError(f"{what} did not say {needle!r}: {tail}")


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


class _Process:
    """A process of the installation that a fault may kill (SIGKILL)."""

    process: subprocess.Popen[bytes] | None = None

    @property
    def label(self) -> str:
        raise NotImplementedError

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> str:
        assert self.process is not None
        self.process.kill()
        self.process.wait()
        return f"{self.label} (pid {self.process.pid})"


class Replica(_Process):
    """One ``serve`` process (and its workers) on fixed ports, so a restart comes back where
    the clients look for it."""

    def __init__(self, name: str, env: Mapping[str, str], folder: Path, workers: int,
                 port: Callable[[], int]) -> None:
        self.name, self.env, self.folder, self.workers = name, dict(env), folder, workers
        self.port, self.gateway_port = port(), port()
        self.url = f"https://127.0.0.1:{self.port}"
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> None:
        self.starts += 1
        out = self.folder / f"{self.name}.{self.starts}.out"
        with out.open("wb") as stdout, (self.folder / f"{self.name}.log").open("ab") as log:
            self.process = subprocess.Popen(
                [CLI, "serve", "--listen", f"127.0.0.1:{self.port}", "--gateway-listen",
                 f"127.0.0.1:{self.gateway_port}", "--workers", str(self.workers)],
                env=self.env, stdout=stdout, stderr=log)
        _wait_for(out, "serving ", self.process, f"replica {self.name}")

    @property
    def label(self) -> str:
        return f"replica {self.name}"

    def kill_worker(self, rng: random.Random) -> str:
        assert self.process is not None
        workers = _children(self.process.pid)
        if not workers:
            return self.kill()
        victim = rng.choice(workers)
        os.kill(victim, signal.SIGKILL)
        return f"worker {victim} of replica {self.name}"

    def stop(self) -> None:
        if self.alive:
            assert self.process is not None
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


class Agent(_Process):
    """A GPU server with the fake GPU source, joined with ``bcd join``, run by ``bcd node``."""

    def __init__(self, folder: Path, serial: str) -> None:
        from better_compute.agent.gpu import write_fake_fleet_file

        self.folder, self.serial = folder, serial
        (folder / "root").mkdir(parents=True)
        gpu_file = folder / "gpus.json"
        write_fake_fleet_file(gpu_file, serial=serial)
        self.env = {"PATH": os.environ.get("PATH", ""), "HOME": str(folder),
                    "BCD_ROOT": str(folder / "root"), "BCD_GPU_SOURCE": f"fake:{gpu_file}"}
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def join(self, api: Api, token: str, pool: str) -> None:
        made = api.root_call(token, "joinTokens.create",
                             {"poolId": pool, "ttl": "1h", "expectSerial": self.serial})
        path = self.folder / "join-token"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(made["token"])
        pins = api.root_call(token, "pki.show", {})
        done = subprocess.run(
            [BCD, "join", "--server", f"{api.targets[0]}/api/compute",
             "--serving-ca-pin", pins["servingCaSpkiPin"],
             "--join-signing-pin", pins["joinSigningKeyPin"],
             "--join-encryption-pin", pins["joinEncryptionKeyPin"],
             "--token-file", str(path)], env=self.env, cwd=self.folder, capture_output=True,
            text=True, timeout=120, input="")
        if done.returncode != 0:
            raise RuntimeError(f"bcd join: {done.stderr[-2000:]}")

    def start(self) -> None:
        self.starts += 1
        out = self.folder / f"bcd.{self.starts}.out"
        with out.open("wb") as stdout, (self.folder / "bcd.log").open("ab") as log:
            self.process = subprocess.Popen([BCD, "node", "--config", "/etc/bcd/config.toml"],
                                            env=self.env, cwd=self.folder, stdout=stdout,
                                            stderr=log)
        _wait_for(out, "session connected", self.process, f"bcd {self.serial}")

    @property
    def label(self) -> str:
        return f"bcd {self.serial}"


class Supervisor(threading.Thread):
    """Starts again every replica and agent that ended, as a service manager does."""

    def __init__(self, parts: Sequence[Replica | Agent], history: History) -> None:
        super().__init__(name="supervisor", daemon=True)
        self.parts, self.history = list(parts), history
        self.stop = threading.Event()
        self.lock = threading.Lock()  # held while a part starts again

    def run(self) -> None:
        while not self.stop.wait(0.2):
            for part in self.parts:
                if part.alive or self.stop.is_set():
                    continue
                with self.lock:
                    began = time.time()
                    try:
                        part.start()
                        error = None
                    except Exception as exc:
                        error = f"{type(exc).__name__}: {exc}"[:500]
                self.history.add({"kind": "restart", "part": getattr(part, "name", None) or
                                  f"bcd {getattr(part, 'serial', '')}", "at": began,
                                  "done": time.time(), "error": error})

    def whole(self, timeout: float = 120.0) -> None:
        """Until every part runs (each restart done)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                if all(p.alive for p in self.parts):
                    return
            time.sleep(0.2)
        raise RuntimeError("the installation did not come back whole within "
                           f"{timeout:.0f} s")


class Store:
    """The store's faults: restart PostgreSQL (a cluster of our own), pause it; SQLite: a
    writer holding the database's write lock."""

    def __init__(self, env: Mapping[str, str], pg_folder: Path | None) -> None:
        self.env, self.pg_folder = env, pg_folder

    def restart(self, rng: random.Random) -> str:
        assert self.pg_folder is not None
        subprocess.run([PG_SCRIPT, "pause", str(self.pg_folder)], check=True,
                       capture_output=True)
        time.sleep(rng.uniform(0.5, 2.0))
        subprocess.run([PG_SCRIPT, "resume", str(self.pg_folder)], check=True,
                       capture_output=True)
        return "postgresql restarted"

    def pause(self, rng: random.Random) -> str:
        seconds = rng.uniform(1.0, 3.0)
        if self.pg_folder is not None:
            head = int((self.pg_folder / "data" / "postmaster.pid").read_text().split()[0])
            pids = [head, *_children(head)]
            for pid in pids:
                os.kill(pid, signal.SIGSTOP)
            try:
                time.sleep(seconds)
            finally:
                for pid in pids:
                    os.kill(pid, signal.SIGCONT)
            return f"postgresql stopped (SIGSTOP) for {seconds:.1f} s"
        path = Path(self.env["BETTER_COMPUTE_DATA_DIR"]) / "store.sqlite"
        db = sqlite3.connect(path, timeout=30, isolation_level=None)
        try:
            db.execute("BEGIN EXCLUSIVE")
            time.sleep(seconds)
            db.execute("ROLLBACK")
        finally:
            db.close()
        return f"sqlite write lock held for {seconds:.1f} s"


class Installation:
    """A fresh store, pool, tenants and tokens; ``replicas`` supervised ``serve`` processes;
    ``agents`` GPU servers with a real bcd. ``pythonpath``: run every process on that copy of
    the code (the tests' mutated copies)."""

    def __init__(self, folder: Path, *, backend: str = "sqlite", replicas: int = 1,
                 workers: int = 2, clients: int = 6, nodes: int = 2, agents: int = 1,
                 pg_url: str | None = None, pythonpath: str | None = None,
                 port: Callable[[], int] = free_port, history: History) -> None:
        self.folder, self.backend, self.history = folder, backend, history
        self.replica_count, self.workers, self.clients = replicas, workers, clients
        self.node_count, self.agent_count = nodes, agents
        self.pg_url, self.pythonpath, self.port = pg_url, pythonpath, port
        self.pg_folder: Path | None = None
        self.replicas: list[Replica] = []
        self.agents: list[Agent] = []
        self.env: dict[str, str] = {}
        self.setup: Setup | None = None
        self.supervisor: Supervisor | None = None
        self.api: Api | None = None

    def __enter__(self) -> Installation:
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _start(self) -> None:
        url = self.pg_url
        if self.backend == "postgres" and url is None:
            self.pg_folder = Path(tempfile.mkdtemp(prefix="bc-pg-history."))
            started = subprocess.run([PG_SCRIPT, "start", str(self.pg_folder), str(self.port())],
                                     capture_output=True, text=True)
            if started.returncode != 0:
                raise RuntimeError(f"scripts/pg start: {started.stderr}")
            url = started.stdout.strip()
        data = self.folder / "data"
        self.env = store_env(self.backend, url, data)
        ready = initialized(self.env)
        try:
            self.setup = prepare(ready.runtime, ready.token, clients=self.clients,
                                 nodes=self.node_count)
        finally:
            ready.runtime.close()
        self.env |= {"PATH": os.environ.get("PATH", ""), **SERVE_ENV}
        if self.pythonpath:
            self.env["PYTHONPATH"] = self.pythonpath
        for n in range(self.replica_count):
            self.replicas.append(Replica(f"r{n}", self.env, self.folder, self.workers,
                                         self.port))
            self.replicas[-1].start()
        self.api = Api([r.url for r in self.replicas], data / "serving-ca.pem")
        for n in range(self.agent_count):
            agent = Agent(self.folder / f"gpu-server-{n}", f"SN-HIST-{n}")
            agent.join(self.api, self.setup.operator.token, self.setup.pool)
            agent.start()
            self.agents.append(agent)
        self.supervisor = Supervisor([*self.replicas, *self.agents], self.history)
        self.supervisor.start()

    def faults(self) -> list[Fault]:
        store = Store(self.env, self.pg_folder)
        out = [Fault("kill-worker", lambda rng: rng.choice(self.live()).kill_worker(rng)),
               Fault("kill-replica", lambda rng: rng.choice(self.live()).kill()),
               Fault("pause-store", store.pause)]
        if self.pg_folder is not None:
            out.append(Fault("restart-postgresql", store.restart))
        if self.agents:
            out.append(Fault("kill-bcd", lambda rng: rng.choice(self.agents).kill()))
        return out

    def live(self) -> list[Replica]:
        alive = [r for r in self.replicas if r.alive]
        if not alive:
            raise RuntimeError("no replica is running")
        return alive

    def whole(self) -> None:
        assert self.supervisor is not None
        self.supervisor.whole()

    def verify(self) -> None:
        """``store verify`` on the store, recorded (the read models compared with a rebuild)."""
        done = subprocess.run([CLI, "store", "verify", "--output", "json"], env=self.env,
                              capture_output=True, text=True, timeout=600)
        try:
            report = json.loads(done.stdout)
        except ValueError:
            report = {"ok": False, "problems": [done.stdout[-2000:], done.stderr[-2000:]]}
        self.history.add({"kind": "verify", "code": done.returncode, "report": report})

    def close(self) -> None:
        if self.supervisor is not None:
            self.supervisor.stop.set()
            self.supervisor.join(150)
        for agent in self.agents:
            if agent.alive:
                agent.kill()
        for replica in self.replicas:
            replica.stop()
        if self.pg_folder is not None:
            subprocess.run([PG_SCRIPT, "stop", str(self.pg_folder)], capture_output=True)
        elif self.env and self.pg_url:
            drop_schema(self.env)


@dataclass
class Outcome:
    history: Path
    violations: list[Any]
    calls: int
    faults: int
    invariants: int
    seconds: float


def run_schedule(folder: Path, *, seconds: float, backend: str = "sqlite", replicas: int = 1,
                 workers: int = 2, clients: int = 6, nodes: int = 2, agents: int = 1,
                 fault_every: float = 20.0, seed: int = 0, pg_url: str | None = None,
                 pythonpath: str | None = None, port: Callable[[], int] = free_port,
                 faults: Callable[[Installation], list[Fault]] | None = None,
                 verify: bool = True) -> Outcome:
    """One schedule on a fresh installation in ``folder``; the history checked.
    ``faults``: which of the installation's faults strike (default: all of them);
    ``verify``: run ``store verify`` too (a test of another invariant may skip it)."""
    from better_compute.benchmarks.history_check import check

    began = time.monotonic()
    folder.mkdir(parents=True, exist_ok=True)
    history = History(folder / "history.jsonl")
    try:
        with Installation(folder, backend=backend, replicas=replicas, workers=workers,
                          clients=clients, nodes=nodes, agents=agents, pg_url=pg_url,
                          pythonpath=pythonpath, port=port, history=history) as inst:
            assert inst.api is not None and inst.setup is not None
            work = Workload(inst.api, inst.setup, history,
                            faults(inst) if faults else inst.faults(), fault_every, seed)
            work.run(seconds, ready=inst.whole)
            work.collect()
            if verify:
                inst.verify()
    finally:
        history.close()
    records = History.load(history.path)
    violations, invariants = check(records)
    return Outcome(history.path, violations, sum(1 for r in records if r["kind"] == "call"),
                   work.fault_count, invariants, time.monotonic() - began)


def main(argv: list[str] | None = None) -> int:
    from better_compute.benchmarks.history_check import check, describe

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=["sqlite", "postgres"], default="postgres")
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--nodes", type=int, default=2, help="simulated nodes besides bcd's")
    parser.add_argument("--minutes", type=float, default=1.0)
    parser.add_argument("--fault-every", type=float, default=20.0)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--keep", type=Path, default=None, help="the folder for the history")
    parser.add_argument("--pg-url", default=None,
                        help="a PostgreSQL to use (a new schema; not restarted) instead of a "
                             "cluster of its own")
    parser.add_argument("--check", type=Path, default=None,
                        help="check a kept history.jsonl again, run nothing")
    args = parser.parse_args(argv)
    if args.check is not None:
        violations, invariants = check(History.load(args.check))
        print(describe(violations, args.check, invariants))
        return 1 if violations else 0
    if args.backend == "sqlite" and args.replicas > 1:
        parser.error("two replicas share one store on PostgreSQL: use --backend postgres")
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    folder = args.keep or Path(tempfile.mkdtemp(prefix="bc-history."))
    folder.mkdir(parents=True, exist_ok=True)
    load_before = load_average()
    outcome = run_schedule(folder, seconds=args.minutes * 60, backend=args.backend,
                           replicas=args.replicas, workers=args.workers, clients=args.clients,
                           nodes=args.nodes, fault_every=args.fault_every, seed=seed,
                           pg_url=args.pg_url)
    print(json.dumps({"backend": args.backend, "replicas": args.replicas,
                      "workers": args.workers, "clients": args.clients, "seed": seed,
                      "minutes": args.minutes, "faultEvery": args.fault_every,
                      "calls": outcome.calls, "faults": outcome.faults,
                      "invariantsChecked": outcome.invariants,
                      "violations": len(outcome.violations),
                      "seconds": round(outcome.seconds, 1),
                      "loadAverage": f"{load_before} -> {load_average()}",
                      "history": str(outcome.history)}), flush=True)
    print(describe(outcome.violations, outcome.history, outcome.invariants))
    return 1 if outcome.violations else 0


if __name__ == "__main__":
    sys.exit(main())
