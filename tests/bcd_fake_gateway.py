"""An in-test gateway for `bcd node`, and a joined BCD_ROOT to run it from.

FakeGateway plays the server's side of api/wire/gateway.py over real mutual TLS built
from the real PKI (api/pki.py): it checks the client certificate names the node of the
Hello, counts epochs, sends a desired state after Welcome, verifies each journal entry
with the node's public key (api.wire.sealing.verify_entry) and acks it, and can be told
to hold its acks, drop the connection, or change the desired state. Tests await its
conditions (:meth:`FakeGateway.wait_for`), never a fixed sleep.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import anyio
import msgspec
from anyio.abc import ByteStream, SocketListener, TaskStatus
from anyio.streams.buffered import BufferedByteReceiveStream
from anyio.streams.tls import TLSAttribute, TLSStream
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from better_compute.agent.config import AgentConfig, FilesSection, NodeSection, ServerSection
from better_compute.agent.config import save as save_config
from better_compute.agent.gpu import write_fake_fleet_file
from better_compute.agent.paths import Paths
from better_compute.api import pki
from better_compute.api.wire.gateway import (
    Ack,
    DesiredState,
    Heartbeat,
    Hello,
    Journal,
    Nack,
    Refused,
    Report,
    Welcome,
    decode_to_gateway,
    encode,
)
from better_compute.api.wire.inventory import Inventory
from better_compute.api.wire.sealing import verify_entry

NODE_ID = "node_gw00000000000000000000001"
SITE_ID = "site_gw00000000000000000000001"
POOL_ID = "pool_gw00000000000000000000001"

ACCEPTANCE = {"attempt": 1, "checks": [{"kind": "diag.nvml",
                                        "expect": {"gpuCount": 8, "gpuModel": "H100"}}]}


@dataclass
class NodeRoot:
    """A BCD_ROOT as `bcd join` leaves it, plus the fake GPU file."""

    paths: Paths
    gpu_file: Path
    key: ec.EllipticCurvePrivateKey

    @property
    def env(self) -> dict[str, str]:
        return {"BCD_ROOT": str(self.paths.root), "BCD_GPU_SOURCE": f"fake:{self.gpu_file}"}


def make_node_root(root: Path, bundle: pki.PkiBundle, gateway_url: str, *, gpus: int = 8,
                   node_id: str = NODE_ID) -> NodeRoot:
    paths = Paths(root)
    key = ec.generate_private_key(ec.SECP256R1())
    csr = x509.CertificateSigningRequestBuilder().subject_name(
        x509.Name([x509.NameAttribute(x509.NameOID.COMMON_NAME, "bcd")])).sign(key, hashes.SHA256())
    cert = pki.issue_node_certificate(bundle, csr, node_id, SITE_ID)
    paths.etc.mkdir(parents=True)
    paths.node_key.write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))
    paths.node_key.chmod(0o600)
    paths.node_certificate.write_text(pki.pem(cert))
    paths.node_ca_certificate.write_text(pki.pem(bundle.node_ca_cert))
    paths.serving_ca_certificate.write_text(pki.pem(bundle.serving_ca_cert))
    paths.join_encryption_jwk.write_text("{}\n")
    parts = pki.public_parts(bundle)
    save_config(paths.config, AgentConfig(
        server=ServerSection(url="https://127.0.0.1:1/api/compute", gateway_url=gateway_url,
                             serving_ca_pin=parts["servingCaSpkiPin"]),
        node=NodeSection(id=node_id, site_id=SITE_ID, pool_id=POOL_ID, tenant_id="root"),
        files=FilesSection(key=str(paths.node_key), certificate=str(paths.node_certificate),
                           node_ca=str(paths.node_ca_certificate),
                           serving_ca=str(paths.serving_ca_certificate),
                           join_encryption_key=str(paths.join_encryption_jwk)),
    ))
    gpu_file = root / "gpus.json"
    write_fake_fleet_file(gpu_file, gpus=gpus)
    return NodeRoot(paths, gpu_file, key)


def server_context(bundle: pki.PkiBundle, folder: Path) -> ssl.SSLContext:
    cert, key = pki.issue_serving_certificate(bundle, ["127.0.0.1", "localhost"])
    (folder / "gw.crt").write_bytes(cert)
    (folder / "gw.key").write_bytes(key)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(folder / "gw.crt", folder / "gw.key")
    context.verify_mode = ssl.CERT_REQUIRED
    context.load_verify_locations(cadata=pki.pem(bundle.node_ca_cert))
    return context


@dataclass
class FakeGateway:
    bundle: pki.PkiBundle
    node_key: ec.EllipticCurvePublicKey
    folder: Path
    port: int = 0
    heartbeat_seconds: float = 0.2
    generation: int = 1
    sections: dict[str, Any] = field(default_factory=lambda: {"acceptance": ACCEPTANCE})
    hold_acks: bool = False  # True: verify journal entries but answer nothing
    nack_unavailable: int = 0  # nack this many journal entries `unavailable` (a store outage)
    epoch: int = 0
    hellos: list[Hello] = field(default_factory=list)
    heartbeats: list[Heartbeat] = field(default_factory=list)
    reports: list[Report] = field(default_factory=list)
    received: list[tuple[int, int]] = field(default_factory=list)  # (epoch, seq) of Journal
    accepted: dict[int, dict[str, Any]] = field(default_factory=dict)  # seq -> verified payload
    refused: list[int] = field(default_factory=list)
    refuse_node: str | None = None  # answer Hello with Refused(code=this)
    handshake_failures: int = 0

    def __post_init__(self) -> None:
        self._changed = anyio.Event()
        self._streams: list[ByteStream] = []
        self._scope: anyio.CancelScope | None = None

    def _fire(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    async def wait_for(self, predicate: Any, timeout: float = 15.0) -> None:
        """Wait until ``predicate()`` holds, re-checked on every message the gateway gets."""
        with anyio.fail_after(timeout):
            while not predicate():
                await self._changed.wait()

    @property
    def last_report(self) -> Report | None:
        return self.reports[-1] if self.reports else None

    @property
    def report(self) -> Report:
        """The newest report, where the caller knows one came (AssertionError if none)."""
        assert self.reports, "the gateway has no report yet"
        return self.reports[-1]

    @property
    def inventory(self) -> Inventory:
        """The newest report's inventory, where the caller knows there is one."""
        inventory = self.report.inventory
        assert inventory is not None, "the newest report has no inventory"
        return inventory

    # -- serving ---------------------------------------------------------------

    async def serve(self, *, task_status: TaskStatus[int]) -> None:
        context = server_context(self.bundle, self.folder)
        multi = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=self.port)
        # one address: 127.0.0.1; a TCP listener (MultiListener types it as any Listener)
        listener = cast(SocketListener, multi.listeners[0])
        self.port = listener.extra(anyio.abc.SocketAttribute.local_port)
        with anyio.CancelScope() as scope:
            self._scope = scope
            async with listener, anyio.create_task_group() as group:
                task_status.started(self.port)
                while True:
                    raw = await listener.accept()
                    group.start_soon(self._handshake, raw, context)

    def stop(self) -> None:
        """Close the listener and every session, as a gateway that died."""
        if self._scope is not None:
            self._scope.cancel()

    async def drop(self) -> None:
        """Close the open sessions (a network drop); the listener stays."""
        for stream in list(self._streams):
            await stream.aclose()

    async def push(self, generation: int, sections: dict[str, Any]) -> None:
        self.generation, self.sections = generation, sections
        for stream in list(self._streams):
            await stream.send(encode(DesiredState(epoch=self.epoch, generation=generation,
                                                  sections=sections)))

    async def _handshake(self, raw: ByteStream, context: ssl.SSLContext) -> None:
        try:
            stream = await TLSStream.wrap(raw, server_side=True, ssl_context=context,
                                          standard_compatible=False)
        except (ssl.SSLError, OSError, anyio.BrokenResourceError, anyio.EndOfStream):
            self.handshake_failures += 1
            await raw.aclose()
            self._fire()
            return
        await self._session(stream)

    async def _session(self, stream: ByteStream) -> None:
        reader = BufferedByteReceiveStream(stream)
        try:
            async with stream:
                der = stream.extra(TLSAttribute.peer_certificate_binary)
                assert der is not None, "CERT_REQUIRED: the node presents its certificate"
                cert_node = pki.node_id_from_certificate(x509.load_der_x509_certificate(der))
                hello = decode_to_gateway(await reader.receive_until(b"\n", 1 << 20))
                if not isinstance(hello, Hello) or hello.node_id != cert_node:
                    await stream.send(encode(Refused(code="identity", message="not you")))
                    return
                self.hellos.append(hello)
                if self.refuse_node:
                    await stream.send(encode(Refused(code=self.refuse_node, message="refused")))
                    self._fire()
                    return
                self.epoch += 1
                epoch = self.epoch
                await stream.send(encode(Welcome(epoch=epoch,
                                                 heartbeat_seconds=self.heartbeat_seconds)))
                await stream.send(encode(DesiredState(epoch=epoch, generation=self.generation,
                                                      sections=self.sections)))
                self._streams.append(stream)
                self._fire()
                while True:
                    line = await reader.receive_until(b"\n", 1 << 24)
                    await self._on(stream, decode_to_gateway(line), epoch)
        except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError,
                anyio.IncompleteRead, ssl.SSLError, OSError):
            pass
        finally:
            if stream in self._streams:
                self._streams.remove(stream)
            self._fire()

    async def _on(self, stream: ByteStream, message: Any, epoch: int) -> None:
        if isinstance(message, Heartbeat):
            self.heartbeats.append(message)
        elif isinstance(message, Report):
            self.reports.append(message)
        elif isinstance(message, Journal):
            self.received.append((message.epoch, message.seq))
            payload = verify_entry(self.node_key, message.entry.payload, message.entry.signature)
            if payload is None:
                self.refused.append(message.seq)
                await stream.send(encode(Nack(seq=message.seq, code="bad-signature",
                                              message="the signature does not verify")))
            elif self.nack_unavailable > 0:
                self.nack_unavailable -= 1
                await stream.send(encode(Nack(seq=message.seq, code="unavailable",
                                              message="the event store is unavailable")))
            else:
                self.accepted[message.seq] = msgspec.json.decode(payload)
                if not self.hold_acks:
                    await stream.send(encode(Ack(seq=message.seq)))
        self._fire()
