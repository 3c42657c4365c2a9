"""Fleet simulator: N agents that behave as bcd does, against one server or a deployment.

    .venv/bin/python -m better_compute.benchmarks.fleet_sim [--nodes 1000,10000]
        [--backend sqlite|postgres] [--pg-url URL] [--seconds 20] [--queries 200]
        [--reservations 50] [--ramp 10] [--addresses 64] [--processes N] [--no-restart]
    .venv/bin/python -m better_compute.benchmarks.fleet_sim --nodes 10000 \\
        --api https://HOST:PORT --gateway HOST:PORT [--restart-command CMD]
        (against a deployment already running: its store named by the environment as for
        ``serve``, BETTER_COMPUTE_DATABASE_URL or BETTER_COMPUTE_DATA_DIR, with its master key)

For each fleet size: a store (by default a fresh one: a throwaway SQLite data dir, or a
throwaway schema of ``--pg-url``), a pool and N nodes made the way a join makes them (each
with its own P-256 key and a node certificate from the node CA, its key pin recorded), a real
``better-compute serve --gateway-listen`` with its defaults (unless ``--api``), and then:

1. the agents, spread over worker processes (one asyncio loop each, about 2,500 agents a
   process: each session is a descriptor on both sides), start over ``--ramp`` seconds from
   ``--addresses`` loopback source addresses (127.0.0.2, 127.0.0.3, …). Each does what bcd
   does: connects over mutual TLS with its own certificate, says Hello, sends a Report at
   once, heartbeats at the interval the Welcome gives (a Report every 6th), answers the
   acceptance section with a signed ``acceptance.result`` (its own GPUs) and reports again;
   a session that ends or a connection that fails is tried again after bcd's own backoff
   (agent/node/backoff.py). ``adoptSeconds``: from the first agent's start until
   ``capacity.get`` shows every node adopted and 8 x N GPUs allocatable;
2. a quiet window of ``--seconds`` while the fleet heartbeats: the heartbeats the agents
   sent per second, the nodes whose heartbeat the server wrote in the last two intervals
   (``bc_node_presence``: what the controller reads), the CPU of the server's processes and,
   apart, of the simulator's (one core = 100 %; per 1,000 nodes too);
3. while the fleet still heartbeats: ``--queries`` sequential ``capacity.get`` calls (p50,
   p99) and ``--reservations`` reservations of one GPU for 1 h, each created (the placement:
   p50, p99) and released at once;
4. the server restarted (SIGTERM, then ``serve`` again on the same store and ports; with
   ``--api``, ``--restart-command`` or nothing): ``reconnectSeconds`` from the new server's
   ready line (and ``reconnectFromStopSeconds`` from the SIGTERM) until every agent has a
   session again, and until the server counts every node connected.

``dropped`` counts sessions that ended after their Welcome before the restart (the server
closed them, or the connection broke): 0 is the goal. ``failedAttempts`` counts connects that
never reached a Welcome (a bound reached, the server away): bcd tries those again, so they
are not losses; ``errors`` shows why, by kind. Every phase has a deadline. One JSON line per
fleet size goes to standard output, with the load average before and after and the share of
the machine's CPU time its hypervisor stole; docs/performance.md records a run.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import math
import multiprocessing
import os
import random
import resource
import shlex
import ssl
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from better_compute.benchmarks import harness
from better_compute.benchmarks.harness import (
    cpu_seconds,
    cpu_ticks,
    free_port,
    load_average,
    steal_percent,
)

GPUS = 8
GPU_NAME = "NVIDIA H100 80GB HBM3"
AGENTS_PER_PROCESS = 2500
REPORT_EVERY = 6  # as bcd (agent/node/agent.py NodeOptions.report_every)
WELCOME_TIMEOUT = 15.0  # as bcd: a connect or Hello unanswered this long is tried again

# The counters each worker process keeps in shared memory, one row per process.
LIVE, WELCOMES, DROPPED, FAILED, REFUSED, HEARTBEATS, REPORTS, ACKED, NACKED, RECONNECTED, \
    STARTED, READY = range(12)
COUNTERS = ("live", "welcomes", "dropped", "failedAttempts", "refused", "heartbeats", "reports",
            "acked", "nacked", "reconnected", "started", "ready")
STOP, MARK, GO = 0, 1, 2  # the control values: stop the agents; the restart mark; start


def raise_open_files() -> int:
    """The soft limit on open descriptors raised to the hard one; the new soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
    return soft


def gpu_uuid(index: int, gpu: int) -> str:
    return f"GPU-SIM-{index:06d}-{gpu}"


# ------------------------------------------------------------------ the fleet in the store


@dataclass
class Fleet:
    """A pool of N joined nodes in a store, and what the agents and the caller need."""

    n: int
    pool: str
    token: str
    ca: str  # the serving CA (PEM): the API's and the gateway's certificates
    nodes_file: Path  # one JSON line per node: id, index, cert and key (PEM)


def _nodes(runtime: Any, bundle: Any, pool: str, n: int, out: Path) -> None:
    """``n`` nodes joined to ``pool`` (saved 200 at a time), their keys and certificates
    written to ``out``."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    from better_compute.api import pki
    from better_compute.domain.access import LOCAL_OPERATOR
    from better_compute.domain.ids import new_uuid, public_id
    from better_compute.domain.node import NODE_ROLE, Node

    site = runtime.service.pool(LOCAL_OPERATOR, pool).site_id
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "bcd")])
    batch: list[Any] = []
    with out.open("w") as lines:
        for i in range(n):
            key = ec.generate_private_key(ec.SECP256R1())
            csr = x509.CertificateSigningRequestBuilder().subject_name(name).sign(
                key, hashes.SHA256())
            uuid = new_uuid()
            node_id = public_id("node", uuid)
            cert = pki.issue_node_certificate(bundle, csr, node_id, site)
            gpus = [{"index": g, "uuid": gpu_uuid(i, g), "name": GPU_NAME, "memoryMiB": 81559,
                     "healthy": True, "healthReasons": []} for g in range(GPUS)]
            batch.append(Node(
                id=uuid, tenant_id="root", pool_id=pool, site_id=site, join_token_id="jt_sim",
                role=NODE_ROLE, hardware_key=f"serial:SIM-{node_id}",
                hardware={"cpus": 224, "memoryGib": 2015.56}, gpus=gpus,
                key_pin=pki.spki_pin(key.public_key()),
                certificate_serial=format(cert.serial_number, "x"),
                certificate_not_after=cert.not_valid_after_utc, bcd_version="sim"))
            pem = key.private_bytes(serialization.Encoding.PEM,
                                    serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption()).decode()
            lines.write(json.dumps({"id": node_id, "index": i, "cert": pki.pem(cert),
                                    "key": pem}) + "\n")
            if len(batch) == 200:
                runtime.store.save(*batch, actor="local")
                batch = []
    if batch:
        runtime.store.save(*batch, actor="local")


def make_fleet(env: dict[str, str], n: int, folder: Path, *, fresh: bool) -> Fleet:
    """A pool of ``n`` joined nodes in the store of ``env``: a new store initialized as
    ``init`` does (``fresh``), or one a deployment already uses (its master key opens the
    PKI; a root admin token is minted for the run)."""
    from better_compute.api import pki
    from better_compute.benchmarks.fleet import make_pool
    from better_compute.benchmarks.harness import initialized
    from better_compute.domain.access import LOCAL_OPERATOR

    if fresh:
        ready = initialized(env)
        runtime, token, bundle = ready.runtime, ready.token, ready.bundle
    else:
        from better_compute.api.runtime import Runtime

        runtime = Runtime.open(env)
        bundle = pki.unseal_bundle(runtime.service.pki().sealed,
                                   pki.parse_master_key(runtime.master_key_text()))
        token = runtime.service.tokens_create(LOCAL_OPERATOR, "root", "root-admin",
                                              "fleet_sim")["secret"]
    try:
        pool = make_pool(runtime.service, key=f"pool-sim-{os.getpid()}-{n}", gpu_count=GPUS)
        nodes_file = folder / "nodes.jsonl"
        _nodes(runtime, bundle, pool, n, nodes_file)
        # The read models take the joins now, as they would have one join at a time: the
        # server starts in step, and the run measures the fleet, not a catch-up of N joins.
        runtime.projections.catch_up()
        return Fleet(n, pool, str(token), pki.pem(bundle.serving_ca_cert), nodes_file)
    finally:
        runtime.close()


# ------------------------------------------------------------------------ the agents


@dataclass
class _Process:
    """What one worker process's agents share: the gateway, the CA, counters, control."""

    host: str
    port: int
    server_name: str
    ca: str
    counts: Any  # this process's row of the shared counters
    control: Any
    folder: Path
    now: str = ""  # RFC 3339, updated each second: every heartbeat carries it
    errors: Counter[str] = field(default_factory=Counter)


class _Agent:
    """One simulated bcd: a session kept up for as long as the run lasts."""

    def __init__(self, node: dict[str, Any], address: str, start: float, shared: _Process
                 ) -> None:
        from better_compute.agent.node.backoff import Backoff

        self.node_id = str(node["id"])
        self.index = int(node["index"])
        self.key_pem = str(node["key"])
        self.cert_pem = str(node["cert"])
        self.address = address
        self.start = start
        self.shared = shared
        self.backoff = Backoff()
        self.context: ssl.SSLContext | None = None
        self.key: Any = None
        self.inventory: Any = None
        self.telemetry: Any = None
        self.answered: set[int] = set()  # acceptance attempts answered
        self.generation = 0
        self.mark = 0
        self.seq = 0

    def prepare(self) -> None:
        """What bcd has before it connects: its TLS context (its certificate and key) and its
        key, read once (a few milliseconds each: made before the start, not in the run)."""
        from cryptography.hazmat.primitives import serialization

        path = self.shared.folder / f"{self.node_id}.pem"
        path.write_text(self.cert_pem + self.key_pem)
        context = ssl.create_default_context(cadata=self.shared.ca)
        context.load_cert_chain(path)
        path.unlink()
        self.context = context
        self.key = serialization.load_pem_private_key(self.key_pem.encode(), password=None)

    async def run(self) -> None:
        from better_compute.api.wire import gateway as wire

        shared = self.shared
        await asyncio.sleep(self.start)
        shared.counts[STARTED] += 1
        while True:
            try:
                await self._session(wire)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                shared.errors[type(exc).__name__ if not isinstance(exc, _Ended)
                              else str(exc)] += 1
            await asyncio.sleep(self.backoff.next_delay())

    async def _session(self, wire: Any) -> None:
        shared = self.shared
        welcomed = False
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(
                shared.host, shared.port, ssl=self.context,
                server_hostname=shared.server_name, local_addr=(self.address, 0),
                limit=1 << 20), WELCOME_TIMEOUT)
        except BaseException:
            shared.counts[FAILED] += 1
            raise
        try:
            writer.write(wire.encode(wire.Hello(node_id=self.node_id, bcd_version="sim",
                                                applied_generation=self.generation,
                                                observed_generation=self.generation)))
            line = await asyncio.wait_for(reader.readline(), WELCOME_TIMEOUT)
            first = wire.decode_to_node(line) if line else None
            if not isinstance(first, wire.Welcome):
                if isinstance(first, wire.Refused):
                    shared.counts[REFUSED] += 1
                    raise _Ended(f"refused: {first.code}")
                raise _Ended("closed before Welcome")
            welcomed = True
            self._welcomed()
            await self._run(wire, reader, writer, first.epoch, first.heartbeat_seconds)
        except asyncio.CancelledError:  # the run stops
            if not welcomed:
                shared.counts[FAILED] += 1
            raise
        except BaseException as exc:
            # After its Welcome, any end of a session is a drop: closed or refused by the
            # server, a broken connection, a write that failed.
            shared.counts[DROPPED if welcomed else FAILED] += 1
            if welcomed:
                shared.errors[f"dropped: {type(exc).__name__}"] += 1
            raise
        finally:
            if welcomed:
                shared.counts[LIVE] -= 1
            writer.transport.abort()

    def _welcomed(self) -> None:
        counts = self.shared.counts
        self.backoff.reset()
        counts[LIVE] += 1
        counts[WELCOMES] += 1
        mark = self.shared.control[MARK]
        if self.mark < mark:
            self.mark = mark
            counts[RECONNECTED] += 1

    async def _run(self, wire: Any, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                   epoch: int, heartbeat: float) -> None:
        writer.write(self._report(wire, epoch))
        self.shared.counts[REPORTS] += 1
        beats = asyncio.create_task(self._beat(wire, writer, epoch, heartbeat))
        try:
            while True:
                line = await reader.readline()
                if not line:
                    raise _Ended("session closed by the server")
                if beats.done():
                    beats.result()  # a heartbeat's write failed: raise why
                message = wire.decode_to_node(line)
                if isinstance(message, wire.DesiredState) and message.epoch == epoch:
                    self._apply(wire, writer, epoch, message)
                elif isinstance(message, wire.Ack):
                    self.shared.counts[ACKED] += 1
                elif isinstance(message, wire.Nack):
                    self.shared.counts[NACKED] += 1
                    self.answered.discard(message.seq)  # answered again on the next desired
                elif isinstance(message, wire.Refused):
                    raise _Ended(f"session ended: {message.code}")
        finally:
            beats.cancel()

    def _apply(self, wire: Any, writer: asyncio.StreamWriter, epoch: int, message: Any) -> None:
        """As bcd: run the acceptance checks asked for (they pass) and journal the verdict,
        signed; then report the generation applied."""
        section = message.sections.get("acceptance")
        if section and section.get("state") == "running" \
                and int(section["attempt"]) not in self.answered:
            attempt = int(section["attempt"])
            self.answered.add(attempt)
            writer.write(wire.encode(wire.Journal(epoch=epoch, seq=attempt,
                                                  entry=self._verdict(wire, epoch, attempt))))
        if message.generation != self.generation:
            self.generation = message.generation
            writer.write(self._report(wire, epoch))
            self.shared.counts[REPORTS] += 1

    def _verdict(self, wire: Any, epoch: int, attempt: int) -> Any:
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric import ec

        doc = {"kind": "acceptance.result", "nodeId": self.node_id, "epoch": epoch,
               "time": self.shared.now, "attempt": attempt, "passed": True,
               "gpus": _gpus(self.index),
               "checks": [{"kind": "diag.nvml", "passed": True, "message": "ok"}]}
        payload = json.dumps(doc).encode()
        signature = self.key.sign(payload, ec.ECDSA(hashes.SHA256()))
        return wire.SignedEntry(payload=base64.b64encode(payload).decode(),
                                signature=base64.b64encode(signature).decode())

    def _report(self, wire: Any, epoch: int) -> bytes:
        from better_compute.api.wire.inventory import HostFacts, Inventory, Telemetry

        if self.inventory is None:  # the fake GPU source reads the same every time
            self.inventory = Inventory(host=HostFacts(serial=f"SIM-{self.node_id}", cpus=224,
                                                      memory_gib=2015.56),
                                       gpus=_inventory_gpus(self.index), source="fake")
            self.telemetry = Telemetry.of(self.inventory, None)
        self.telemetry.time = self.shared.now
        return bytes(wire.encode(wire.Report(
            epoch=epoch, applied_generation=self.generation,
            observed_generation=self.generation, inventory=self.inventory,
            telemetry=self.telemetry)))

    async def _beat(self, wire: Any, writer: asyncio.StreamWriter, epoch: int,
                    heartbeat: float) -> None:
        counts = self.shared.counts
        beats = 0
        while True:
            await asyncio.sleep(heartbeat)
            writer.write(wire.encode(wire.Heartbeat(epoch=epoch, time=self.shared.now)))
            counts[HEARTBEATS] += 1
            beats += 1
            if beats % REPORT_EVERY == 0:
                writer.write(self._report(wire, epoch))
                counts[REPORTS] += 1
            await writer.drain()


class _Ended(Exception):
    """A session or an attempt ended, for the reason given."""


def _gpus(index: int) -> list[dict[str, Any]]:
    return [{"index": g, "uuid": gpu_uuid(index, g), "name": GPU_NAME, "memoryMiB": 81559,
             "healthy": True, "healthReasons": []} for g in range(GPUS)]


def _inventory_gpus(index: int) -> list[Any]:
    from better_compute.api.wire.inventory import Gpu

    return [Gpu(index=g, uuid=gpu_uuid(index, g), name=GPU_NAME, memory_mib=81559,
                utilization_pct=0, temperature_c=35, power_w=70.0, memory_used_mib=0)
            for g in range(GPUS)]


def _worker(nodes: list[dict[str, Any]], addresses: list[str], ramp: float, gateway: str,
            server_name: str, ca: str, row: int, counters: Any, control: Any, out: Any
            ) -> None:
    """One worker process: its agents on one asyncio loop until told to stop; then its
    errors by kind go to ``out``."""
    raise_open_files()
    host, _, port = gateway.rpartition(":")
    width = len(COUNTERS)
    counts = _Row(counters, row * width)

    async def main() -> None:
        with tempfile.TemporaryDirectory() as tmp:
            shared = _Process(host.strip("[]"), int(port), server_name, ca, counts, control,
                              Path(tmp))
            shared.now = datetime.now(UTC).isoformat().replace("+00:00", "Z")
            rng = random.Random(row)
            agents = [_Agent(node, addresses[node["index"] % len(addresses)],
                             rng.uniform(0.0, ramp), shared) for node in nodes]
            for agent in agents:
                agent.prepare()
                counts[READY] += 1
            while not control[GO]:
                if control[STOP]:
                    out.put({})
                    return
                await asyncio.sleep(0.05)
            shared.now = datetime.now(UTC).isoformat().replace("+00:00", "Z")
            tasks = [asyncio.create_task(a.run()) for a in agents]
            while not control[STOP]:
                shared.now = datetime.now(UTC).isoformat().replace("+00:00", "Z")
                await asyncio.sleep(0.5)
                for task in tasks:
                    if task.done() and not task.cancelled() and task.exception() is not None:
                        raise task.exception()  # type: ignore[misc]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            out.put(dict(shared.errors))

    asyncio.run(main())


class _Row:
    """One worker's counters in the shared array."""

    def __init__(self, array: Any, start: int) -> None:
        self.array = array
        self.start = start

    def __getitem__(self, index: int) -> int:
        return int(self.array[self.start + index])

    def __setitem__(self, index: int, value: int) -> None:
        self.array[self.start + index] = value


class Agents:
    """The simulated agents of a fleet, in worker processes; their counters, summed."""

    def __init__(self, fleet: Fleet, gateway: str, *, processes: int | None = None,
                 addresses: int = 64, ramp: float = 10.0, server_name: str = "localhost"
                 ) -> None:
        nodes = [json.loads(line) for line in fleet.nodes_file.read_text().splitlines()]
        self._nodes = range(len(nodes))
        count = processes or max(1, math.ceil(len(nodes) / AGENTS_PER_PROCESS))
        spawn = multiprocessing.get_context("spawn")
        self.counters: Any = spawn.Array("q", count * len(COUNTERS), lock=False)
        self.control: Any = spawn.Array("q", 3, lock=False)
        self.queue: Any = spawn.Queue()
        names = [f"127.0.0.{2 + i}" for i in range(max(1, min(addresses, 250)))]
        self.workers = [spawn.Process(target=_worker, args=(
            nodes[i::count], names, ramp, gateway, server_name, fleet.ca, i, self.counters,
            self.control, self.queue), daemon=True) for i in range(count)]
        self.errors: Counter[str] = Counter()
        self.prepared = False

    def prepare(self, deadline: float = 600.0) -> None:
        """The worker processes started, each agent's TLS context and key made: ready to go."""
        for worker in self.workers:
            worker.start()
        self.prepared = True
        n = sum(1 for _ in self._nodes)
        if _poll(lambda: self.counts()["ready"] == n or self._ended(),
                 time.monotonic() + deadline, 0.2) is None or self._ended():
            raise SystemExit("the agent processes did not get ready")

    def _ended(self) -> bool:
        return any(w.exitcode is not None for w in self.workers)

    def start(self) -> None:
        """Every agent starts within the ramp from now on (``prepare`` first, if not done)."""
        if not self.prepared:
            self.prepare()
        self.control[GO] = 1

    def counts(self) -> dict[str, int]:
        width = len(COUNTERS)
        return {name: sum(int(self.counters[row * width + i]) for row in range(len(self.workers)))
                for i, name in enumerate(COUNTERS)}

    def mark(self) -> None:
        """From now on, ``reconnected`` counts the agents that got a Welcome since."""
        for row in range(len(self.workers)):
            self.counters[row * len(COUNTERS) + RECONNECTED] = 0
        self.control[MARK] += 1

    def cpu_seconds(self) -> float:
        return sum(cpu_seconds(w.pid) for w in self.workers if w.pid is not None)

    def check(self) -> None:
        for worker in self.workers:
            if worker.exitcode not in (None, 0):
                raise SystemExit(f"an agent process ended with status {worker.exitcode}")

    def stop(self) -> dict[str, int]:
        """Stop every agent; their errors by kind."""
        self.control[STOP] = 1
        for _ in self.workers:
            with contextlib.suppress(Exception):
                self.errors.update(self.queue.get(timeout=60))
        for worker in self.workers:
            worker.join(timeout=30)
            if worker.is_alive():
                worker.kill()
        return dict(self.errors)


# ----------------------------------------------------------------------- the server


class _Api:
    """JSON-RPC over HTTPS with the run's root token, on one kept-alive connection."""

    def __init__(self, url: str, token: str, ca: str) -> None:
        import httpx

        self.client = httpx.Client(base_url=url, verify=ssl.create_default_context(cadata=ca),
                                   headers={"authorization": f"Bearer {token}"}, timeout=60)

    def call(self, method: str, **params: Any) -> Any:
        """The call's result; ``unavailable`` and ``rate_limited`` answers (a server busy with
        a fleet) are retried a second later for up to a minute, as docs/api.md tells clients."""
        deadline = time.monotonic() + 60
        while True:
            doc = self.client.post("/api/compute/rpc", json={
                "jsonrpc": "2.0", "id": 1, "method": method, "params": params}).json()
            if "error" not in doc:
                return doc["result"]
            code = (doc["error"].get("data") or {}).get("code")
            if code not in ("unavailable", "rate_limited") or time.monotonic() > deadline:
                raise RuntimeError(f"{method}: {doc['error']}")
            time.sleep(1)

    def close(self) -> None:
        self.client.close()


class _Server:
    """``serve`` on a store, restartable on the same ports (own mode only)."""

    def __init__(self, env: dict[str, str], api_port: int, gateway_port: int) -> None:
        from better_compute.benchmarks.harness import CLI

        self.argv = [CLI, "serve", "--listen", f"127.0.0.1:{api_port}", "--gateway-listen",
                     f"127.0.0.1:{gateway_port}"]
        self.env = {"PATH": os.environ.get("PATH", ""), **env}
        self.log: Any = None
        self.process: subprocess.Popen[str] | None = None

    def __enter__(self) -> _Server:
        self.log = tempfile.TemporaryFile("w+")
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()
        self.log.close()

    def start(self) -> float:
        """Started; the time (monotonic) it printed its ready line."""
        self.process = subprocess.Popen(self.argv, env=self.env, stdout=subprocess.PIPE,
                                        stderr=self.log, text=True)
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if "serving" not in line:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=10)
            self.log.seek(0)
            raise SystemExit(f"serve did not start: {line} {self.log.read()[-3000:]}")
        return time.monotonic()

    def stop(self) -> float:
        """SIGTERM, then SIGKILL after 60 s; how long it took to end."""
        t0 = time.monotonic()
        if self.process is not None and self.process.poll() is None:
            harness.stop(self.process, 60)
        return time.monotonic() - t0

    def tail(self) -> str:
        self.log.seek(0)
        return str(self.log.read())[-3000:]

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid


# -------------------------------------------------------------------------- the run


def _poll(until: Any, deadline: float, every: float = 0.5, say: Any = None
          ) -> float | None:
    """Seconds until ``until()`` is true (None: not by ``deadline``, monotonic); ``say()``
    (a line for standard error) every 10 s meanwhile."""
    t0 = said = time.monotonic()
    while time.monotonic() < deadline:
        if until():
            return time.monotonic() - t0
        if say is not None and time.monotonic() - said >= 10:
            said = time.monotonic()
            print(f"fleet_sim: {said - t0:.0f}s: {say()}", file=sys.stderr, flush=True)
        time.sleep(every)
    return None


def _capacity(api: _Api, pool: str) -> dict[str, Any]:
    result: dict[str, Any] = api.call("capacity.get", poolId=pool)
    return result


def _fleet_adopted(api: _Api, fleet: Fleet) -> bool:
    got = _capacity(api, fleet.pool)
    return bool(got["nodes"]["adopted"] == fleet.n
                and got["resources"]["gpu"]["allocatable"] == GPUS * fleet.n)


def _percentile(values: Sequence[float], share: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(share * (len(ordered) - 1) + 0.5))], 2)


def _fresh_heartbeats(env: dict[str, str], within: float) -> int | None:
    """Nodes whose heartbeat the server wrote in the last ``within`` seconds."""
    from better_compute.api.store.store import StoreConfig, open_store

    try:
        store = open_store(StoreConfig.from_env(env))
    except Exception:
        return None
    try:
        sql = store.sql()
        with sql.transaction(commit=False) as cursor:
            sql.execute(cursor, "SELECT COUNT(*) AS n FROM bc_node_presence WHERE last_seen > ?",
                        (time.time() - within,))
            return int(cursor.fetchone()["n"])
    finally:
        store.close()


@dataclass
class Plan:
    """What a run does: adopt the fleet, then (``hold``) the quiet window and the calls,
    then (``restart``) the reconnect."""

    seconds: float = 20.0
    queries: int = 200
    reservations: int = 50
    ramp: float = 10.0
    addresses: int = 64
    processes: int | None = None
    hold: bool = True
    restart: bool = True
    adopt_deadline: float = 300.0


def adopt(fleet: Fleet, api: _Api, agents: Agents, plan: Plan, server_pids: Sequence[int]
          ) -> dict[str, Any]:
    """Phase 1 of the module's docstring on a started server: the figures."""
    out: dict[str, Any] = {}
    agents.prepare()
    server0, sim0 = sum(map(cpu_seconds, server_pids)), agents.cpu_seconds()
    t0 = time.monotonic()
    agents.start()
    adopted = _poll(lambda: _fleet_adopted(api, fleet), t0 + plan.adopt_deadline,
                    say=lambda: f"adopting: {_capacity(api, fleet.pool)['nodes']} "
                                f"{agents.counts()} load {load_average()}")
    out["adoptSeconds"] = None if adopted is None else round(time.monotonic() - t0, 1)
    if server_pids:  # what it cost, whatever else the machine ran meanwhile
        out["serverCpuSecondsToAdopt"] = round(sum(map(cpu_seconds, server_pids)) - server0, 1)
    out["simCpuSecondsToAdopt"] = round(agents.cpu_seconds() - sim0, 1)
    got = _capacity(api, fleet.pool)
    out["adopted"], out["allocatableGpus"] = got["nodes"]["adopted"], \
        got["resources"]["gpu"]["allocatable"]
    _poll(lambda: agents.counts()["live"] == fleet.n, time.monotonic() + 60)
    agents.check()
    counts = agents.counts()
    out["dropped"], out["failedAttempts"] = counts["dropped"], counts["failedAttempts"]
    out["sessions"], out["live"] = counts["welcomes"], counts["live"]
    return out


def hold(fleet: Fleet, api: _Api, agents: Agents, plan: Plan, env: dict[str, str],
         server_pids: Sequence[int]) -> dict[str, Any]:
    """Phases 2 and 3 of the module's docstring, on an adopted fleet: the figures."""
    out: dict[str, Any] = {}
    heartbeat = 5.0  # the server's default; the Welcome says it to each agent
    before = agents.counts()
    steal0 = cpu_ticks()
    server0, sim0, wall0 = sum(map(cpu_seconds, server_pids)), agents.cpu_seconds(), \
        time.monotonic()
    time.sleep(plan.seconds)
    server1, sim1, wall1 = sum(map(cpu_seconds, server_pids)), agents.cpu_seconds(), \
        time.monotonic()
    after = agents.counts()
    wall = wall1 - wall0
    out["heartbeatsPerSecond"] = round((after["heartbeats"] - before["heartbeats"]) / wall, 1)
    out["heartbeatsExpectedPerSecond"] = round(fleet.n / heartbeat, 1)
    out["nodesHeardRecently"] = _fresh_heartbeats(env, 2 * heartbeat + 1)
    if server_pids:
        out["serverCpuPercent"] = round(100 * (server1 - server0) / wall, 1)
        out["serverCpuPercentPer1000Nodes"] = round(
            100 * (server1 - server0) / wall / fleet.n * 1000, 2)
    out["simCpuPercent"] = round(100 * (sim1 - sim0) / wall, 1)
    out["stealPercent"] = round(steal_percent(steal0, cpu_ticks()), 1)
    out["loadDuringWindow"] = load_average()
    capacity: list[float] = []
    placements: list[float] = []
    releases: list[float] = []
    for i in range(max(plan.queries, plan.reservations)):
        if i < plan.queries:
            q0 = time.perf_counter()
            _capacity(api, fleet.pool)
            capacity.append((time.perf_counter() - q0) * 1000)
        if i < plan.reservations:
            q0 = time.perf_counter()
            rsv = api.call("reservations.create", poolId=fleet.pool, gpus=1, duration="1h")
            placements.append((time.perf_counter() - q0) * 1000)
            q0 = time.perf_counter()
            api.call("reservations.release", reservationId=rsv["id"])
            releases.append((time.perf_counter() - q0) * 1000)
    out["capacityP50ms"], out["capacityP99ms"] = _percentile(capacity, 0.5), \
        _percentile(capacity, 0.99)
    out["placementP50ms"], out["placementP99ms"] = _percentile(placements, 0.5), \
        _percentile(placements, 0.99)
    out["releaseP50ms"] = _percentile(releases, 0.5)
    counts = agents.counts()
    out["dropped"] = counts["dropped"]  # before the restart: each one a loss
    out["failedAttempts"] = counts["failedAttempts"]
    return out


def reconnect(fleet: Fleet, api: _Api, agents: Agents, stop: Any, start: Any,
              deadline: float = 300.0) -> dict[str, Any]:
    """Phase 4: the server stopped (``stop()``: seconds it took) and started again
    (``start()``: its ready time, monotonic); the figures."""
    out: dict[str, Any] = {}
    agents.mark()
    t0 = time.monotonic()
    out["stopSeconds"] = round(stop(), 1)
    ready = start()
    every = _poll(lambda: agents.counts()["reconnected"] == fleet.n, ready + deadline, 0.2,
                  say=lambda: f"reconnecting: {agents.counts()} load {load_average()}")
    out["reconnectSeconds"] = None if every is None else round(time.monotonic() - ready, 1)
    out["reconnectFromStopSeconds"] = None if every is None else round(time.monotonic() - t0, 1)
    counted = _poll(lambda: _capacity(api, fleet.pool)["nodes"]["connected"] == fleet.n,
                    ready + deadline)
    out["serverCountsConnectedSeconds"] = None if counted is None \
        else round(time.monotonic() - ready, 1)
    counts = agents.counts()
    out["reconnected"] = counts["reconnected"]
    out["failedAttemptsAfterRestart"] = counts["failedAttempts"]
    return out


def run_one(n: int, plan: Plan, backend: str, pg_url: str | None) -> dict[str, Any]:
    """One fleet size against a server of ours on a fresh store."""
    from better_compute.benchmarks.harness import drop_schema, store_env

    with tempfile.TemporaryDirectory() as tmp:
        env = store_env(backend, pg_url, Path(tmp))
        try:
            return run_served(env, n, Path(tmp), plan, backend)
        finally:
            drop_schema(env)


def run_served(env: dict[str, str], n: int, folder: Path, plan: Plan, backend: str
               ) -> dict[str, Any]:
    """A fresh store of ``env`` made ready (``init``, a pool, ``n`` nodes joined), a
    ``serve`` with its defaults on it, and the agents: the phases ``plan`` asks for, their
    figures and the agents' counts."""
    result: dict[str, Any] = {"nodes": n, "backend": backend, "loadBefore": load_average()}
    t0 = time.monotonic()
    fleet = make_fleet(env, n, folder, fresh=True)
    result["setupSeconds"] = round(time.monotonic() - t0, 1)
    api_port, gateway_port = free_port(), free_port()
    with _Server(env, api_port, gateway_port) as server:
        server.start()
        agents = Agents(fleet, f"127.0.0.1:{gateway_port}", processes=plan.processes,
                        addresses=plan.addresses, ramp=plan.ramp)
        result["agentProcesses"] = len(agents.workers)
        api = _Api(f"https://127.0.0.1:{api_port}", fleet.token, fleet.ca)
        try:
            result.update(adopt(fleet, api, agents, plan, [server.pid]))
            if plan.hold:
                result.update(hold(fleet, api, agents, plan, env, [server.pid]))
            if plan.restart:
                result.update(reconnect(fleet, api, agents, server.stop, server.start))
        except BaseException:
            print(server.tail(), file=sys.stderr)
            raise
        finally:
            api.close()
            result["errors"] = agents.stop()
            result["counts"] = agents.counts()
    result["loadAfter"] = load_average()
    return result


def run_external(n: int, plan: Plan, api_url: str, gateway: str, server_name: str,
                 restart_command: str | None, server_pids: Sequence[int]) -> dict[str, Any]:
    """One fleet size against a deployment already running, on its store (the environment's
    settings, as ``serve`` reads them)."""
    from better_compute.api.http.server_config import with_file

    env = dict(with_file(os.environ))
    result: dict[str, Any] = {"nodes": n, "api": api_url, "gateway": gateway,
                              "loadBefore": load_average()}
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.monotonic()
        fleet = make_fleet(env, n, Path(tmp), fresh=False)
        result["setupSeconds"] = round(time.monotonic() - t0, 1)
        ca = os.environ.get("BETTER_COMPUTE_CA_FILE")
        api = _Api(api_url, fleet.token, Path(ca).read_text() if ca else fleet.ca)
        agents = Agents(fleet, gateway, processes=plan.processes, addresses=plan.addresses,
                        ramp=plan.ramp, server_name=server_name)
        result["agentProcesses"] = len(agents.workers)
        try:
            result.update(adopt(fleet, api, agents, plan, server_pids))
            if plan.hold:
                result.update(hold(fleet, api, agents, plan, env, server_pids))
            if restart_command:
                def stop() -> float:
                    t = time.monotonic()
                    subprocess.run(shlex.split(restart_command), check=True)
                    return time.monotonic() - t

                result.update(reconnect(fleet, api, agents, stop, time.monotonic))
        finally:
            api.close()
            result["errors"] = agents.stop()
    result["loadAfter"] = load_average()
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="1000,10000")
    parser.add_argument("--backend", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--pg-url", default=os.environ.get("BC_TEST_PG_URL"))
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--reservations", type=int, default=50)
    parser.add_argument("--ramp", type=float, default=10.0)
    parser.add_argument("--addresses", type=int, default=64)
    parser.add_argument("--processes", type=int, default=None)
    parser.add_argument("--no-restart", action="store_true")
    parser.add_argument("--api", help="a deployment's API URL (https://HOST:PORT)")
    parser.add_argument("--gateway", help="a deployment's gateway HOST:PORT")
    parser.add_argument("--gateway-name", default="localhost",
                        help="the name the gateway's certificate has (default localhost)")
    parser.add_argument("--restart-command", help="with --api: restarts the deployment")
    parser.add_argument("--server-pids", default="",
                        help="with --api: the server processes to read the CPU of (a,b,c)")
    args = parser.parse_args(argv)
    if bool(args.api) != bool(args.gateway):
        parser.error("--api and --gateway go together")
    raise_open_files()
    plan = Plan(seconds=args.seconds, queries=args.queries, reservations=args.reservations,
                ramp=args.ramp, addresses=args.addresses, processes=args.processes,
                restart=not args.no_restart)
    for n in (int(x) for x in args.nodes.split(",")):
        if args.api:
            pids = [int(p) for p in args.server_pids.split(",") if p]
            result = run_external(n, plan, args.api, args.gateway, args.gateway_name,
                                  args.restart_command, pids)
        else:
            result = run_one(n, plan, args.backend, args.pg_url)
        print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
