"""What bcd join sends, built in the test process: a node key, a CSR, a sealed JoinRequest.

The server side's tests use it to call ``nodes.join`` without the agent.
"""

from __future__ import annotations

import base64
import json
import os
from dataclasses import dataclass, field
from typing import Any

import msgspec
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, x25519
from cryptography.x509.oid import NameOID

from better_compute.agent.gpu.fake import fake_gpu_uuid
from better_compute.api import pki
from better_compute.api.wire.join import (
    HardwareFacts,
    HardwareGpu,
    JoinRequest,
    JoinResponse,
    SignedJoinResponse,
)


def gpu_uuid(serial: str | None, index: int) -> str:
    """GPU ``index`` of the machine ``serial``, as bcd's fake GPU source reports it: machines
    never share a GPU (a GPU UUID belongs to one node, docs/nodes.md)."""
    return fake_gpu_uuid(serial or "", index)


def hardware(serial: str | None = "SN-7701", product_uuid: str | None = None,
             macs: tuple[str, ...] = ("52:54:00:12:34:56",), gpus: int = 2) -> HardwareFacts:
    return HardwareFacts(
        serial=serial, product_uuid=product_uuid, macs=list(macs), hostname="gpu-1", cpus=64,
        memory_gib=512.0,
        gpus=[HardwareGpu(uuid=gpu_uuid(serial, i),
                          name="NVIDIA H100 80GB HBM3", memory_mib=81559,
                          pci_bus_id=f"00000000:{i + 10:02X}:00.0") for i in range(gpus)],
    )


@dataclass
class JoinAttempt:
    """One join as bcd makes it: the key stays here; only the sealed request leaves."""

    token: str
    facts: HardwareFacts = field(default_factory=hardware)
    key: ec.EllipticCurvePrivateKey = field(default_factory=lambda: ec.generate_private_key(
        ec.SECP256R1()))
    nonce: str = field(default_factory=lambda: base64.b64encode(os.urandom(32)).decode())

    def csr_pem(self) -> str:
        csr = (x509.CertificateSigningRequestBuilder()
               .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "bcd")]))
               .sign(self.key, hashes.SHA256()))
        return csr.public_bytes(serialization.Encoding.PEM).decode()

    def params(self, public: dict[str, str]) -> dict[str, str]:
        """nodes.join params: the JoinRequest sealed to the published join encryption key."""
        request = JoinRequest(token=self.token, nonce=self.nonce, csr_pem=self.csr_pem(),
                              hardware=self.facts, bcd_version="0.1.0")
        recipient = serialization.load_pem_public_key(public["joinEncryptionPublicKey"].encode())
        assert isinstance(recipient, x25519.X25519PublicKey)
        sealed = pki.seal_to(recipient, msgspec.json.encode(request))
        return {"sealed": base64.b64encode(sealed).decode()}


def open_response(answer: dict[str, Any], public: dict[str, str]) -> JoinResponse:
    """Verify the signature with the published join signing key, as bcd does, and decode."""
    signed = msgspec.convert(answer, SignedJoinResponse)
    payload = base64.b64decode(signed.payload)
    ok = pki.verify_join_response(public["joinSigningPublicKey"].encode(), payload,
                                  base64.b64decode(signed.signature))
    assert ok, "the JoinResponse signature does not verify with the join signing key"
    return msgspec.json.decode(payload, type=JoinResponse)


def stored_text(runtime: Any) -> str:
    """Everything the store holds: every stored event and every read-model row."""
    parts: list[str] = []
    for n in runtime.store.recorder.select_notifications(start=0, limit=100_000):
        parts.append(n.state.decode(errors="replace"))
    sql = runtime.projections.sql
    runtime.projections.catch_up()
    with sql.transaction(commit=False) as cursor:
        sql.execute(cursor, "SELECT * FROM bc_listing")
        parts.extend(json.dumps(dict(row), default=str) for row in cursor.fetchall())
    return "\n".join(parts)
