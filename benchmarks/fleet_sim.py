"""Fleet simulator: N fake agents in a few processes against one gateway, and capacity latency.

    .venv/bin/python -m better_compute.benchmarks.fleet_sim [--nodes 10,100,1000]
        [--processes 4] [--heartbeat 1] [--seconds 10] [--queries 200]

For each fleet size it makes a fresh SQLite store (a throwaway data dir),
creates a pool and N nodes the way a join does (each with its own P-256 key
and a node certificate from the node CA, the key pin recorded), starts a real
``better-compute serve --gateway-listen`` and then:

1. the agents (split over ``--processes`` worker processes, asyncio, one TLS
   session each with its own node certificate) connect, answer the
   acceptance section with a signed ``acceptance.result`` and so get adopted;
2. for ``--seconds`` every agent sends a Heartbeat every ``--heartbeat``
   seconds; we count what was sent, sessions that dropped, and the serve
   process's CPU time over the window (one core = 100 %);
3. ``capacity.get`` is called ``--queries`` times over HTTPS (one client,
   sequential): p50 / p99 latency, and the answer must show 8 x N allocatable.

Every phase has a deadline. The figures go to standard output as JSON lines;
docs/performance.md records a run.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import multiprocessing
import ssl
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from better_compute.benchmarks.harness import cpu_seconds, free_port, initialized, serving

GPUS = 8


def _setup(data: Path, n: int) -> tuple[str, str, list[dict[str, str]], str]:
    """Store, PKI, root token, pool, and n joined nodes; returns (token, pool, nodes, ca pem)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    from better_compute.api import pki
    from better_compute.benchmarks.fleet import make_pool
    from better_compute.domain.access import LOCAL_OPERATOR
    from better_compute.domain.ids import new_uuid, public_id
    from better_compute.domain.node import NODE_ROLE, Node

    ready = initialized({"BETTER_COMPUTE_DATA_DIR": str(data)})
    runtime, token, bundle = ready.runtime, ready.token, ready.bundle
    try:
        pool = make_pool(runtime.service, key="pool-sim", gpu_count=GPUS)
        site = runtime.service.pool(LOCAL_OPERATOR, pool).site_id
        nodes: list[dict[str, str]] = []
        batch: list[Node] = []
        for i in range(n):
            key = ec.generate_private_key(ec.SECP256R1())
            csr = (x509.CertificateSigningRequestBuilder()
                   .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "bcd")]))
                   .sign(key, hashes.SHA256()))
            uuid = new_uuid()
            node_id = public_id("node", uuid)
            cert = pki.issue_node_certificate(bundle, csr, node_id, site)
            gpus = [{"index": g, "uuid": f"GPU-{i:05d}-{g}", "name": "NVIDIA H100 80GB HBM3",
                     "healthy": True} for g in range(GPUS)]
            batch.append(Node(
                id=uuid, tenant_id="root", pool_id=pool, site_id=site, join_token_id="jt_sim",
                role=NODE_ROLE, hardware_key=f"serial:SIM-{i}",
                hardware={"cpus": 224, "memoryGib": 2015.56}, gpus=gpus,
                key_pin=pki.spki_pin(key.public_key()),
                certificate_serial=format(cert.serial_number, "x"),
                certificate_not_after=cert.not_valid_after_utc, bcd_version="sim"))
            nodes.append({
                "id": node_id, "cert": pki.pem(cert), "gpus": json.dumps(gpus),
                "key": key.private_bytes(serialization.Encoding.PEM,
                                         serialization.PrivateFormat.PKCS8,
                                         serialization.NoEncryption()).decode()})
            if len(batch) == 100:
                runtime.store.save(*batch)
                batch = []
        if batch:
            runtime.store.save(*batch)
        return token, pool, nodes, pki.pem(bundle.serving_ca_cert)
    finally:
        runtime.close()


# ------------------------------------------------------------------ the agents


async def _agent(node: dict[str, str], port: int, ca: str, folder: Path, heartbeat: float,
                 start_beats: float, stop_at: float, counts: dict[str, int]) -> None:
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    from better_compute.api.wire import gateway as wire

    cert, key = folder / f"{node['id']}.crt", folder / f"{node['id']}.key"
    cert.write_text(node["cert"])
    key.write_text(node["key"])
    context = ssl.create_default_context(cadata=ca)
    context.load_cert_chain(cert, key)
    private = serialization.load_pem_private_key(node["key"].encode(), password=None)
    assert isinstance(private, ec.EllipticCurvePrivateKey)
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context,
                                                   server_hostname="localhost", limit=1 << 20)
    writer.write(wire.encode(wire.Hello(node_id=node["id"], bcd_version="sim")))
    welcome = wire.decode_to_node(await reader.readline())
    if not isinstance(welcome, wire.Welcome):
        counts["refused"] += 1
        return
    epoch = welcome.epoch
    counts["connected"] += 1

    async def receive() -> None:
        while True:
            line = await reader.readline()
            if not line:
                counts["dropped"] += 1
                return
            message = wire.decode_to_node(line)
            if isinstance(message, wire.DesiredState):
                section = message.sections.get("acceptance")
                if section and section.get("state") == "running":
                    gpus = json.loads(node["gpus"])  # its own: the ones it joined with
                    doc = {"kind": "acceptance.result", "nodeId": node["id"], "epoch": epoch,
                           "attempt": section["attempt"], "passed": True, "gpus": gpus,
                           "checks": [{"kind": "diag.nvml", "passed": True, "message": "ok"}]}
                    payload = json.dumps(doc).encode()
                    signature = private.sign(payload, ec.ECDSA(hashes.SHA256()))
                    entry = wire.SignedEntry(payload=base64.b64encode(payload).decode(),
                                             signature=base64.b64encode(signature).decode())
                    writer.write(wire.encode(wire.Journal(epoch=epoch, seq=section["attempt"],
                                                          entry=entry)))
                if message.generation == 1:
                    counts["adopted"] += 1
            elif isinstance(message, wire.Nack | wire.Refused):
                counts["nacked"] += 1

    receiver = asyncio.create_task(receive())
    while time.time() < stop_at:  # as bcd does: from the Welcome on
        writer.write(wire.encode(wire.Heartbeat(epoch=epoch, time="1970-01-01T00:00:00Z")))
        if time.time() >= start_beats:
            counts["heartbeats"] += 1  # only those of the measured window count
        await writer.drain()
        await asyncio.sleep(heartbeat)
    receiver.cancel()
    writer.close()


def _worker(nodes: list[dict[str, str]], port: int, ca: str, heartbeat: float,
            start_beats: float, stop_at: float, out: Any) -> None:
    counts = dict.fromkeys(("connected", "adopted", "heartbeats", "dropped", "nacked",
                            "refused", "errors"), 0)

    async def main() -> None:
        with tempfile.TemporaryDirectory() as tmp:
            results = await asyncio.gather(*[
                _agent(n, port, ca, Path(tmp), heartbeat, start_beats, stop_at, counts)
                for n in nodes], return_exceptions=True)
            counts["errors"] += sum(1 for r in results if isinstance(r, BaseException))

    asyncio.run(main())
    out.put(counts)


# --------------------------------------------------------------------- the run


def _start_agents(nodes: list[dict[str, str]], processes: int, gw_port: int, ca: str,
                  heartbeat: float, start_beats: float, stop_at: float
                  ) -> tuple[list[Any], Any]:
    """The agents, split over ``processes`` worker processes; (the processes, their queue)."""
    spawn = multiprocessing.get_context("spawn")
    queue: Any = spawn.Queue()
    chunks = [nodes[i::processes] for i in range(processes)]
    workers = [spawn.Process(target=_worker, args=(c, gw_port, ca, heartbeat, start_beats,
                                                    stop_at, queue))
               for c in chunks if c]
    for w in workers:
        w.start()
    return workers, queue


def _adopted_after(client: Any, body: dict[str, Any], n: int, start_beats: float
                   ) -> float | None:
    """Seconds until capacity shows every node's GPUs (None: not before the window)."""
    a0 = time.monotonic()
    while time.time() < start_beats:
        got = client.post("/api/compute/rpc", json=body).json()
        if got["result"]["resources"]["gpu"]["allocatable"] == GPUS * n:
            return time.monotonic() - a0
        time.sleep(0.25)
    return None


def _totals(workers: list[Any], queue: Any, n: int) -> dict[str, int]:
    """The workers' counts, summed, once each has reported and ended."""
    totals: dict[str, int] = {}
    for _ in workers:
        for k, v in queue.get(timeout=60 + n / 10).items():
            totals[k] = totals.get(k, 0) + v
    for w in workers:
        w.join(timeout=30)
    return totals


def _capacity_latencies(client: Any, body: dict[str, Any], queries: int
                        ) -> tuple[list[float], Any]:
    """``queries`` sequential capacity.get calls: their latencies (ms, sorted), the last answer."""
    latencies: list[float] = []
    answer: Any = None
    for _ in range(queries):
        q0 = time.perf_counter()
        answer = client.post("/api/compute/rpc", json=body).json()
        latencies.append((time.perf_counter() - q0) * 1000)
    latencies.sort()
    return latencies, answer


def run_one(n: int, processes: int, heartbeat: float, seconds: float, queries: int) -> dict[str, Any]:
    import httpx

    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp)
        t0 = time.monotonic()
        token, pool, nodes, ca = _setup(data, n)
        setup_s = time.monotonic() - t0
        api_port, gw_port = free_port(), free_port()
        env = {"BETTER_COMPUTE_DATA_DIR": str(data),
               "BETTER_COMPUTE_NODE_HEARTBEAT": str(heartbeat)}
        with serving(env, api_port, "--gateway-listen", f"127.0.0.1:{gw_port}") as server:
            connect_window = 5.0 + n * 0.05  # time to connect and adopt before the window
            start_beats = time.time() + connect_window
            stop_at = start_beats + seconds
            workers, queue = _start_agents(nodes, processes, gw_port, ca, heartbeat,
                                           start_beats, stop_at)
            client = httpx.Client(base_url=f"https://127.0.0.1:{api_port}",
                                  verify=ssl.create_default_context(cadata=ca),
                                  headers={"authorization": f"Bearer {token}"})
            body = {"jsonrpc": "2.0", "id": 1, "method": "capacity.get",
                    "params": {"poolId": pool}}
            try:
                adopt_s = _adopted_after(client, body, n, start_beats)
                time.sleep(max(0.0, start_beats - time.time()))
                cpu0, wall0 = cpu_seconds(server.pid), time.monotonic()
                time.sleep(max(0.0, stop_at - time.time()))
                cpu1, wall1 = cpu_seconds(server.pid), time.monotonic()
                totals = _totals(workers, queue, n)
                latencies, answer = _capacity_latencies(client, body, queries)
            finally:
                client.close()
    gpu = answer["result"]["resources"]["gpu"]
    return {
        "nodes": n, "processes": len(workers), "heartbeatSeconds": heartbeat,
        "setupSeconds": round(setup_s, 1),
        "adoptAllSeconds": None if adopt_s is None else round(adopt_s, 1), **totals,
        "heartbeatsPerSecond": round(totals.get("heartbeats", 0) / seconds, 1),
        "serveCpuPercent": round(100 * (cpu1 - cpu0) / (wall1 - wall0), 1),
        "allocatableGpus": gpu["allocatable"],
        "capacityP50ms": round(statistics.median(latencies), 2),
        "capacityP99ms": round(latencies[int(0.99 * (len(latencies) - 1))], 2),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="10,100,1000")
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--heartbeat", type=float, default=1.0)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--queries", type=int, default=200)
    args = parser.parse_args(argv)
    for n in (int(x) for x in args.nodes.split(",")):
        result = run_one(n, args.processes, args.heartbeat, args.seconds, args.queries)
        print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
