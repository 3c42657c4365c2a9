"""A control plane with a running gateway, and a node that speaks the session protocol.

Built in the test process: a real store (real ``init``, so the PKI opens),
a site and a pool, a node joined through ``nodes.join`` with a key made
here, the gateway and the event hub in one anyio task group, and a
``FakeClock`` the service, the gateway and the controller all read. The
node client is what bcd does on the wire (api/wire/gateway.py), no more.
"""

from __future__ import annotations

import base64
import contextlib
import json
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
from anyio.streams.buffered import BufferedByteReceiveStream
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from better_compute.api import pki
from better_compute.api.controllers.node_lifecycle import UNREACHABLE_AFTER, NodeLifecycle
from better_compute.api.gateway.server import Gateway
from better_compute.api.gateway.tls import server_context
from better_compute.api.http.follower import WatchHub
from better_compute.api.net import Handshakes
from better_compute.api.runtime import Runtime
from better_compute.api.services.nodes import NodeService
from better_compute.api.store.node_presence import Presence
from better_compute.api.wire import gateway as wire
from better_compute.api.wire.join import HardwareFacts
from better_compute.domain.access import LOCAL_OPERATOR
from tests.join_client import JoinAttempt, gpu_uuid, hardware, open_response
from tests.support import POLICY, initialize, open_runtime


class FakeClock:
    def __init__(self) -> None:
        self.now = datetime.now(UTC)  # node certificates are issued by this clock too

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


def gpus(count: int = 8, healthy: int | None = None, name: str = "NVIDIA H100 80GB HBM3",
         serial: str = "SN-7701") -> list[dict[str, Any]]:
    """The GPUs of the machine ``serial`` as bcd reports them (the UUIDs it joined with)."""
    healthy = count if healthy is None else healthy
    return [{"index": i, "uuid": gpu_uuid(serial, i), "name": name,
             "memoryMiB": 81559, "healthy": i < healthy,
             "healthReasons": [] if i < healthy else ["xid-79"]} for i in range(count)]


@dataclass
class JoinedNode:
    node_id: str
    key: ec.EllipticCurvePrivateKey
    cert_pem: str
    key_path: Path
    cert_path: Path


def write_identity(tmp: Path, node_id: str, key: ec.EllipticCurvePrivateKey, cert_pem: str
                   ) -> JoinedNode:
    """The node key and certificate as bcd keeps them, in a folder of their own."""
    folder = tmp / f"node-{node_id}-{id(key)}"
    folder.mkdir(parents=True, exist_ok=True)
    key_path, cert_path = folder / "node.key", folder / "node.crt"
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    cert_path.write_text(cert_pem)
    return JoinedNode(node_id, key, cert_pem, key_path, cert_path)


@dataclass
class Plane:
    runtime: Runtime
    clock: FakeClock
    bundle: pki.PkiBundle
    pool: str
    site: str
    tmp: Path
    gateway: Gateway | None = None
    nodes: NodeService = field(init=False)
    lifecycle: NodeLifecycle = field(init=False)

    unreachable_after: timedelta = UNREACHABLE_AFTER

    def __post_init__(self) -> None:
        self.nodes = self.runtime.services.nodes
        self.lifecycle = NodeLifecycle(self.nodes, Presence(self.runtime.store.sql()),
                                       unreachable_after=self.unreachable_after)

    def join(self, serial: str = "SN-7701", n_gpus: int = 8,
             facts: HardwareFacts | None = None) -> JoinedNode:
        """A node joined through nodes.join: ``facts``, or the machine ``serial`` with
        ``n_gpus`` GPUs."""
        service = self.runtime.service
        joins = self.runtime.services.join
        token = joins.create(LOCAL_OPERATOR, self.pool, "2h", 1, None, None, None, None)["token"]
        attempt = JoinAttempt(token, facts or hardware(serial=serial, gpus=n_gpus))
        public = service.pki().public
        response = open_response(joins.join(attempt.params(public)["sealed"]), public)
        return self.write_identity(response.node_id, attempt.key, response.certificate_pem)

    def write_identity(self, node_id: str, key: ec.EllipticCurvePrivateKey, cert_pem: str
                       ) -> JoinedNode:
        return write_identity(self.tmp, node_id, key, cert_pem)

    def event_types(self, node_id: str) -> list[str]:
        return [e["type"] for e in self.nodes.events(LOCAL_OPERATOR, node_id)]

    def node(self, node_id: str) -> dict[str, Any]:
        return self.nodes.get(LOCAL_OPERATOR, node_id)

    def capacity(self) -> dict[str, Any]:
        gpu: dict[str, Any] = self.nodes.capacity(LOCAL_OPERATOR, self.pool)["resources"]["gpu"]
        return gpu

    async def reconcile(self) -> Any:
        return await anyio.to_thread.run_sync(self.lifecycle.reconcile)


def make_plane(env: dict[str, str], tmp: Path,
               unreachable_after: timedelta = UNREACHABLE_AFTER) -> Plane:
    initialize(env)  # the real init: the master key file opens the PKI bundle
    runtime = open_runtime(env)
    clock = FakeClock()
    runtime.service.clock = clock
    service = runtime.service
    site = service.sites_create(LOCAL_OPERATOR, "shared", "eu-1", None, "site-eu-1")["id"]
    pool = service.pools_create(LOCAL_OPERATOR, site, "metal-host", "H100", POLICY, None,
                                "pool-eu-1-h100")["id"]
    bundle = pki.unseal_bundle(service.pki().sealed,
                               pki.parse_master_key(runtime.master_key_text()))
    return Plane(runtime, clock, bundle, pool, site, tmp, unreachable_after=unreachable_after)


# The node client below sends no heartbeats of its own (tests send them when they mean to,
# and time moves on the fake clock), while the gateway closes a session that hears nothing
# for max(3 heartbeats, min_idle) of real time. On a loaded machine a test's steps between two
# messages can take longer than 15 s, so the tests' gateway waits 10 minutes unless a test
# is about that close (test_a_silent_session_is_closed_and_says_why).
QUIET_IDLE = 600.0


@contextlib.asynccontextmanager
async def running_gateway(plane: Plane, *, heartbeat_seconds: float = 5.0,
                          min_idle: float = QUIET_IDLE, hello_timeout: float = 10.0,
                          handshakes: Handshakes | None = None) -> AsyncIterator[Gateway]:
    """The hub and the gateway on a free loopback port, for the life of the block."""
    runtime = plane.runtime
    hub = WatchHub.for_runtime(runtime)
    context = server_context(plane.bundle, ["localhost", "127.0.0.1"], plane.tmp / "run")
    gateway = Gateway(runtime.services, context, heartbeat_seconds=heartbeat_seconds, hub=hub,
                      flush_interval=3600, min_idle=min_idle, hello_timeout=hello_timeout,
                      handshakes=handshakes)
    plane.gateway = gateway
    async with anyio.create_task_group() as tg:
        await tg.start(hub.run)
        await tg.start(gateway.serve, "127.0.0.1", 0)
        try:
            yield gateway
        finally:
            hub.stop()
            tg.cancel_scope.cancel()


def client_context(plane: Plane, node: JoinedNode | None) -> ssl.SSLContext:
    context = ssl.create_default_context(cadata=pki.pem(plane.bundle.serving_ca_cert))
    if node is not None:
        context.load_cert_chain(node.cert_path, node.key_path)
    return context


def sign(key: Any, doc: dict[str, Any]) -> wire.SignedEntry:
    payload = json.dumps(doc).encode()
    signature = key.sign(payload, ec.ECDSA(hashes.SHA256()))
    return wire.SignedEntry(payload=base64.b64encode(payload).decode(),
                            signature=base64.b64encode(signature).decode())


class NodeClient:
    """One session as bcd opens it: TLS with the node certificate, Hello, then messages."""

    def __init__(self, plane: Plane | None, node: JoinedNode, *, hello_id: str | None = None,
                 context: ssl.SSLContext | None = None, port: int | None = None) -> None:
        """``plane``: the control plane in this process; or None, with ``port`` and
        ``context``, for the gateway of a real ``serve`` (tests/e2e)."""
        self.plane = plane
        self.node = node
        self.hello_id = hello_id or node.node_id
        assert plane is not None or (port and context), "a remote gateway needs both"
        self.context = context or client_context(plane, node)  # type: ignore[arg-type]
        self.port = port
        self.stream: Any = None
        self.reader: BufferedByteReceiveStream | None = None
        self.epoch = 0
        self.seq = 0

    async def connect(self, bcd_version: str = "0.1.0") -> wire.ToNode:
        port = self.port
        if port is None:
            assert self.plane is not None and self.plane.gateway is not None
            port = self.plane.gateway.port
        self.stream = await anyio.connect_tcp("127.0.0.1", port,
                                              ssl_context=self.context, tls_hostname="localhost",
                                              tls_standard_compatible=False)
        self.reader = BufferedByteReceiveStream(self.stream)
        await self.send(wire.Hello(node_id=self.hello_id, bcd_version=bcd_version))
        first = await self.receive()
        if isinstance(first, wire.Welcome):
            self.epoch = first.epoch
        return first

    async def send(self, message: wire.Msg) -> None:
        await self.stream.send(wire.encode(message))

    async def receive(self, timeout: float = 45.0) -> wire.ToNode:
        assert self.reader is not None
        with anyio.fail_after(timeout):
            return wire.decode_to_node(await self.reader.receive_until(b"\n", 1 << 20))

    async def receive_desired(self, predicate: Any = None, timeout: float = 45.0
                              ) -> wire.DesiredState:
        with anyio.fail_after(timeout):
            while True:
                message = await self.receive(timeout)
                if isinstance(message, wire.DesiredState) and (predicate is None
                                                               or predicate(message)):
                    return message

    async def start_acceptance(self) -> wire.DesiredState:
        """Connect, let the controller start attempt 1, and read the checks it asks for."""
        await self.connect()
        assert self.plane is not None
        await self.plane.reconcile()
        return await self.receive_desired(lambda d: "acceptance" in d.sections)

    async def journal(self, doc: dict[str, Any], key: Any = None) -> wire.ToNode:
        self.seq += 1
        entry = sign(key or self.node.key, {"nodeId": self.node.node_id, "epoch": self.epoch,
                                            "time": "2030-01-01T00:00:00Z", **doc})
        await self.send(wire.Journal(epoch=self.epoch, seq=self.seq, entry=entry))
        with anyio.fail_after(10):
            while True:
                message = await self.receive()
                if isinstance(message, wire.Ack | wire.Nack) and message.seq == self.seq:
                    return message

    async def acceptance(self, attempt: int, gpu_list: list[dict[str, Any]], *,
                         key: Any = None) -> wire.ToNode:
        healthy = sum(1 for g in gpu_list if g["healthy"])
        return await self.journal({
            "kind": "acceptance.result", "attempt": attempt, "passed": healthy >= 8,
            "checks": [{"kind": "diag.nvml", "passed": healthy >= 8,
                        "message": f"{healthy} healthy GPUs"}],
            "gpus": gpu_list,
        }, key=key)

    async def report(self, gpu_list: list[dict[str, Any]], applied: int = 0) -> None:
        # The inventory as a raw JSON document (not wire.Inventory), encoded as it is.
        await self.send(wire.Report(epoch=self.epoch, applied_generation=applied,
                                    observed_generation=applied,
                                    inventory={"gpus": gpu_list, "host": {},  # type: ignore[arg-type]
                                               "source": "fake"}))

    async def close(self) -> None:
        if self.stream is not None:
            await self.stream.aclose()
            self.stream = None

    async def closed_by_peer(self, timeout: float = 45.0) -> bool:
        """True once the gateway closed this connection (reads hit the end)."""
        assert self.reader is not None
        with anyio.fail_after(timeout):
            while True:
                try:
                    await self.reader.receive_until(b"\n", 1 << 20)
                except (anyio.EndOfStream, anyio.IncompleteRead, anyio.BrokenResourceError,
                        ssl.SSLError, OSError):
                    return True


async def wait_for(condition: Any, timeout: float = 45.0) -> None:
    """Poll a store condition (in a thread) until it holds, with a deadline."""
    with anyio.fail_after(timeout):
        while not await anyio.to_thread.run_sync(condition):
            await anyio.sleep(0.02)


def run_with_gateway(env: dict[str, str], tmp_path: Path, body: Callable[[Plane], Awaitable[None]],
                     *, unreachable_after: timedelta = UNREACHABLE_AFTER,
                     heartbeat_seconds: float = 5.0, min_idle: float = QUIET_IDLE,
                     hello_timeout: float = 10.0, handshakes: Handshakes | None = None) -> None:
    """Run ``body`` against a fresh control plane with its gateway up, then close it."""
    plane = make_plane(env, tmp_path, unreachable_after)

    async def main() -> None:
        async with running_gateway(plane, heartbeat_seconds=heartbeat_seconds,
                                   min_idle=min_idle, hello_timeout=hello_timeout,
                                   handshakes=handshakes):
            await body(plane)

    try:
        anyio.run(main)
    finally:
        plane.runtime.close()
