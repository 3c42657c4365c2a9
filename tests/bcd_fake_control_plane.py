"""An in-memory control plane for bcd's join tests, built on the real PKI.

It plays the server's side of api/wire/join.py with api.pki (open the sealed
request, check the token, issue the node certificate, sign the response), and
can misbehave on request: publish other pins, forge or tamper the response,
answer another nonce. ``calls`` counts nodes.join calls, so a test can assert
that bcd spent no token.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field

import msgspec
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ed25519

from better_compute.agent.errors import BcdError
from better_compute.api import pki
from better_compute.api.wire.join import (
    JoinParams,
    JoinRequest,
    JoinResponse,
    SignedJoinResponse,
    WellKnown,
)

NODE_ID = "node_fake0000000000000000001"
SITE_ID = "site_fake0000000000000000001"
POOL_ID = "pool_fake0000000000000000001"
TOKEN = "bcjt_test-secret-0123456789"


def well_known_of(bundle: pki.PkiBundle, gateway_url: str | None = None) -> WellKnown:
    parts = pki.public_parts(bundle)
    return WellKnown(
        api_url=None, gateway_url=gateway_url,
        serving_ca_spki_pin=parts["servingCaSpkiPin"],
        join_signing_key_pin=parts["joinSigningKeyPin"],
        join_encryption_key_pin=parts["joinEncryptionKeyPin"],
        serving_ca_certificate=parts["servingCaCertificate"],
        join_signing_public_key=parts["joinSigningPublicKey"],
        join_encryption_public_key=parts["joinEncryptionPublicKey"],
    )


@dataclass
class FakeControlPlane:
    bundle: pki.PkiBundle = field(default_factory=pki.generate_bundle)
    token: str = TOKEN
    document: WellKnown | None = None  # what well_known() serves; default: the true one
    misbehave: str | None = None  # forge | tamper | nonce | foreign-ca | other-key
    calls: int = 0
    requests: list[JoinRequest] = field(default_factory=list)

    def pins(self) -> dict[str, str]:
        parts = pki.public_parts(self.bundle)
        return {"serving_ca_pin": parts["servingCaSpkiPin"],
                "join_signing_pin": parts["joinSigningKeyPin"],
                "join_encryption_pin": parts["joinEncryptionKeyPin"]}

    def __call__(self, server: str) -> FakeControlPlane:  # the factory bcd's join() takes
        return self

    def well_known(self, serving_ca_pin: str) -> WellKnown:
        document = self.document or well_known_of(self.bundle, "https://gw.example.com:8443")
        if pki.spki_pin(x509.load_pem_x509_certificate(
                document.serving_ca_certificate.encode()).public_key()) != serving_ca_pin:
            raise BcdError("serving CA pin mismatch (as HttpControlPlane refuses it)")
        return document

    def join(self, params: JoinParams) -> SignedJoinResponse:
        self.calls += 1
        blob = base64.b64decode(params.sealed, validate=True)
        request = msgspec.json.decode(pki.open_sealed(self.bundle.join_encryption_key, blob),
                                      type=JoinRequest)
        self.requests.append(request)
        if request.token != self.token:
            raise BcdError("the join token is not valid: mint a new one", code="unauthenticated")
        csr = x509.load_pem_x509_csr(request.csr_pem.encode())
        ca = self.bundle
        if self.misbehave == "foreign-ca":
            ca = pki.generate_bundle()
        cert = pki.issue_node_certificate(ca, csr, NODE_ID, SITE_ID)
        if self.misbehave == "other-key":
            other = pki.generate_bundle().node_ca_key  # any P-256 key that is not the node's
            other_csr = x509.CertificateSigningRequestBuilder().subject_name(csr.subject).sign(
                other, hashes.SHA256())
            cert = pki.issue_node_certificate(self.bundle, other_csr, NODE_ID, SITE_ID)
        response = JoinResponse(
            nonce=base64.b64encode(b"x" * 32).decode() if self.misbehave == "nonce"
            else request.nonce,
            node_id=NODE_ID, site_id=SITE_ID, pool_id=POOL_ID, tenant_id="root", role="node",
            certificate_pem=pki.pem(cert), node_ca_certificate=pki.pem(self.bundle.node_ca_cert),
            not_after=cert.not_valid_after_utc.isoformat(),
            gateway_url="https://gw.example.com:8443",
        )
        payload = msgspec.json.encode(response)
        signature = pki.sign_join_response(self.bundle, payload)
        if self.misbehave == "forge":
            signature = ed25519.Ed25519PrivateKey.generate().sign(payload)
        if self.misbehave == "tamper":
            payload = payload.replace(NODE_ID.encode(), b"node_fake0000000000000000002")
        return SignedJoinResponse(payload=base64.b64encode(payload).decode(),
                                  signature=base64.b64encode(signature).decode())
