"""The join protocol between `bcd join` and the control plane.

1. bcd fetches ``GET <server>/.well-known/better-compute`` (a WellKnown) over
   TLS, trusting only a serving CA whose SPKI pin equals --serving-ca-pin, and
   refuses it when any published pin differs from the one it was given.
2. bcd generates its node key, builds a JoinRequest (the token, the hardware
   facts, a CSR, a fresh nonce), seals it to the join encryption key
   (``api.pki.seal_to``: X25519 + HKDF-SHA256 + ChaCha20-Poly1305) and calls the
   public JSON-RPC method ``nodes.join`` with ``{"sealed": <base64>}``.
3. The control plane opens it, checks the token (hash, TTL, uses, binding),
   creates the Node in ``adopting`` in the same atomic save that spends the
   token, issues the node certificate, and answers a SignedJoinResponse: the
   JoinResponse JSON (base64) and its Ed25519 signature by the join signing key.
4. bcd verifies the signature against the key whose pin is --join-signing-pin,
   checks the nonce is its own, and only then writes its config and keys.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from .bounds import MAX_GPUS, Id, Macs, Name, NonEmptyId, Pem, Version


class Wire(msgspec.Struct, rename="camel", kw_only=True):
    """Base of messages between agent and server: unknown fields are ignored."""


class WellKnown(Wire, kw_only=True):
    api_url: str | None = None  # the API root (…/api/compute) as the server knows it
    gateway_url: str | None = None
    serving_ca_spki_pin: str
    join_signing_key_pin: str
    join_encryption_key_pin: str
    serving_ca_certificate: str  # PEM; bcd checks its pin before trusting it
    join_signing_public_key: str  # PEM SPKI
    join_encryption_public_key: str  # PEM SPKI


class HardwareGpu(Wire, kw_only=True):
    uuid: NonEmptyId
    name: Name
    serial: Id | None = None
    pci_bus_id: Id | None = None
    memory_mib: int | None = msgspec.field(default=None, name="memoryMiB")
    nvlink_domain: Name | None = None
    healthy: bool = True
    # What bcd before 0.1.1 sent (camel-casing made it memoryMib): read, never written.
    legacy_memory_mib: int | None = msgspec.field(default=None, name="memoryMib")

    def __post_init__(self) -> None:
        if self.memory_mib is None:
            self.memory_mib = self.legacy_memory_mib
        self.legacy_memory_mib = None


class HardwareFacts(Wire, kw_only=True):
    serial: Id | None = None
    product_uuid: Id | None = None
    macs: Macs = []
    hostname: Name | None = None
    cpus: int | None = None
    memory_gib: float | None = msgspec.field(default=None, name="memoryGiB")
    gpus: Annotated[list[HardwareGpu], msgspec.Meta(max_length=MAX_GPUS)] = []
    legacy_memory_gib: float | None = msgspec.field(default=None, name="memoryGib")  # as above

    def __post_init__(self) -> None:
        if self.memory_gib is None:
            self.memory_gib = self.legacy_memory_gib
        self.legacy_memory_gib = None


class JoinRequest(Wire, kw_only=True):
    token: Name  # the join token's secret; only ever travels sealed
    nonce: Name  # 32 random bytes, base64; echoed in the signed response
    csr_pem: Pem  # the CSR of the node key, generated on the machine
    hardware: HardwareFacts
    bcd_version: Version | None = None


class JoinParams(Wire, kw_only=True):
    """Params of the public JSON-RPC method ``nodes.join``."""

    sealed: str  # base64 of seal_to(join encryption key, JSON(JoinRequest))


class JoinResponse(Wire, kw_only=True):
    nonce: str
    node_id: str
    site_id: str
    pool_id: str
    tenant_id: str
    role: str  # "node"
    certificate_pem: str  # the node certificate, issued by the node CA
    node_ca_certificate: str  # PEM, to verify the gateway's client-auth chain
    not_after: str  # RFC 3339, the certificate's end
    gateway_url: str | None = None
    serving_ca_spki_pin: str | None = None


class SignedJoinResponse(Wire, kw_only=True):
    payload: str  # base64 of the JoinResponse JSON, exactly as signed
    signature: str  # base64 Ed25519 signature over the decoded payload bytes
