"""The control plane's PKI: two CAs, the join keys, and sealing them under the master key.

The serving CA signs the API's TLS certificates (clients pin its SPKI); the node CA signs the
client certificates bcd nodes use for mTLS. The join signing key signs join responses and the
join encryption key receives join requests sealed with :func:`seal_to`.

The private half lives in the event store only as :func:`seal_bundle` output (AES-256-GCM under
the operator's master key, which never enters the store).
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import json
import os
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from cryptography import x509
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, x25519
from cryptography.hazmat.primitives.asymmetric.types import (
    CertificateIssuerPublicKeyTypes,
    PublicKeyTypes,
)
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from better_compute.api.wire import sealing
from better_compute.api.wire.sealing import seal_to as seal_to  # re-exported
from better_compute.api.wire.sealing import spki_pin as spki_pin  # re-exported
from better_compute.domain.errors import InvalidInput

MASTER_KEY_PREFIX = "bcmk1_"
SEALED_PREFIX = "v1."
_SEAL_AD = b"better-compute pki v1"
_CA_LIFETIME = timedelta(days=3652)
# Certificates start a little in the past so a node whose clock lags slightly accepts them.
_BACKDATE = timedelta(minutes=5)
_MASTER_KEY_RE = re.compile(r"^bcmk1_([A-Za-z0-9_-]{43})=?\Z")
_B64URL_RE = re.compile(r"^[A-Za-z0-9_-]*={0,2}\Z")
# Node and site ids go into a URI path and into 64-character-limited name attributes.
_NAME_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._~-]{0,63}\Z")
_WRONG_KEY = (
    "the master key does not open this store's PKI bundle: set BETTER_COMPUTE_MASTER_KEY_FILE "
    "to the key `better-compute init` wrote (DATA_DIR/master.key)"
)
_DAMAGED = "the stored PKI bundle is not v1 sealed text; the store's pki record is damaged"


@dataclass(frozen=True)
class PkiBundle:
    """The whole PKI in memory, unsealed. Never log or persist this as is."""

    serving_ca_key: ec.EllipticCurvePrivateKey
    serving_ca_cert: x509.Certificate
    node_ca_key: ec.EllipticCurvePrivateKey
    node_ca_cert: x509.Certificate
    join_signing_key: ed25519.Ed25519PrivateKey
    join_encryption_key: x25519.X25519PrivateKey


def _utc(now: datetime | None) -> datetime:
    """``now`` as an aware datetime; a naive one is taken to be UTC, as cryptography does."""
    if now is None:
        return datetime.now(UTC)
    return now if now.tzinfo else now.replace(tzinfo=UTC)


def _key_usage(ca: bool) -> x509.KeyUsage:
    """CAs only sign certificates; leaves only make (TLS handshake) signatures."""
    return x509.KeyUsage(
        digital_signature=not ca, content_commitment=False, key_encipherment=False,
        data_encipherment=False, key_agreement=False, key_cert_sign=ca, crl_sign=ca,
        encipher_only=False, decipher_only=False,
    )


def _ca(common_name: str, now: datetime) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _BACKDATE)
        .not_valid_after(now + _CA_LIFETIME)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(ca=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return key, cert


def generate_bundle(now: datetime | None = None) -> PkiBundle:
    moment = _utc(now)
    return PkiBundle(
        *_ca("better-compute serving CA", moment),
        *_ca("better-compute node CA", moment),
        join_signing_key=ed25519.Ed25519PrivateKey.generate(),
        join_encryption_key=x25519.X25519PrivateKey.generate(),
    )


def _spki(public_key: PublicKeyTypes, encoding: serialization.Encoding) -> bytes:
    return public_key.public_bytes(encoding, serialization.PublicFormat.SubjectPublicKeyInfo)


def pem(cert: x509.Certificate) -> str:
    return cert.public_bytes(serialization.Encoding.PEM).decode("ascii")


def public_parts(bundle: PkiBundle) -> dict[str, str]:
    signing_public = bundle.join_signing_key.public_key()
    encryption_public = bundle.join_encryption_key.public_key()
    return {
        "servingCaSpkiPin": spki_pin(bundle.serving_ca_cert.public_key()),
        "joinSigningKeyPin": spki_pin(signing_public),
        "joinEncryptionKeyPin": spki_pin(encryption_public),
        "servingCaCertificate": pem(bundle.serving_ca_cert),
        "nodeCaCertificate": pem(bundle.node_ca_cert),
        "joinSigningPublicKey": _spki(signing_public, serialization.Encoding.PEM).decode(),
        "joinEncryptionPublicKey": _spki(encryption_public, serialization.Encoding.PEM).decode(),
    }


def new_master_key() -> str:
    return MASTER_KEY_PREFIX + base64.urlsafe_b64encode(os.urandom(32)).decode("ascii")


def parse_master_key(text: str) -> bytes:
    match = _MASTER_KEY_RE.match(text.strip())
    if match is None:
        raise InvalidInput(
            "the master key is malformed: expected bcmk1_ followed by 43 URL-safe base64 "
            "characters (32 bytes), as `better-compute init` wrote it to DATA_DIR/master.key; "
            "point BETTER_COMPUTE_MASTER_KEY_FILE at that file"
        )
    return base64.urlsafe_b64decode(match.group(1) + "=")


def _aes(master_key: bytes) -> AESGCM:
    if len(master_key) != 32:
        raise InvalidInput(
            f"the master key must be 32 bytes, not {len(master_key)}: read it with "
            "parse_master_key from the file `better-compute init` wrote (DATA_DIR/master.key)"
        )
    return AESGCM(master_key)


def _private_pem(key: Any) -> str:
    pem: bytes = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return pem.decode("ascii")


def seal_bundle(bundle: PkiBundle, master_key: bytes) -> str:
    document = {
        "servingCaKey": _private_pem(bundle.serving_ca_key),
        "servingCaCert": pem(bundle.serving_ca_cert),
        "nodeCaKey": _private_pem(bundle.node_ca_key),
        "nodeCaCert": pem(bundle.node_ca_cert),
        "joinSigningKey": _private_pem(bundle.join_signing_key),
        "joinEncryptionKey": _private_pem(bundle.join_encryption_key),
    }
    nonce = os.urandom(12)
    ciphertext = _aes(master_key).encrypt(nonce, json.dumps(document).encode(), _SEAL_AD)
    return SEALED_PREFIX + base64.urlsafe_b64encode(nonce + ciphertext).decode("ascii")


def _load_key(text: str, kind: type) -> Any:
    key = serialization.load_pem_private_key(text.encode("ascii"), password=None)
    if not isinstance(key, kind):
        raise TypeError(f"expected {kind.__name__}, found {type(key).__name__}")
    return key


def unseal_bundle(sealed: str, master_key: bytes) -> PkiBundle:
    aes = _aes(master_key)
    body = sealed.strip()
    if not body.startswith(SEALED_PREFIX) or not _B64URL_RE.match(body[len(SEALED_PREFIX) :]):
        raise InvalidInput(_DAMAGED)
    try:
        raw = base64.urlsafe_b64decode(body[len(SEALED_PREFIX) :])
    except (binascii.Error, ValueError):
        raise InvalidInput(_DAMAGED) from None
    if len(raw) < 12 + 16:
        raise InvalidInput(_WRONG_KEY)
    try:
        plaintext = aes.decrypt(raw[:12], raw[12:], _SEAL_AD)
    except InvalidTag:
        raise InvalidInput(_WRONG_KEY) from None
    # Authenticated, so failures past this point mean a bundle written by a buggy sealer.
    try:
        doc = json.loads(plaintext)
        return PkiBundle(
            serving_ca_key=_load_key(doc["servingCaKey"], ec.EllipticCurvePrivateKey),
            serving_ca_cert=x509.load_pem_x509_certificate(doc["servingCaCert"].encode()),
            node_ca_key=_load_key(doc["nodeCaKey"], ec.EllipticCurvePrivateKey),
            node_ca_cert=x509.load_pem_x509_certificate(doc["nodeCaCert"].encode()),
            join_signing_key=_load_key(doc["joinSigningKey"], ed25519.Ed25519PrivateKey),
            join_encryption_key=_load_key(doc["joinEncryptionKey"], x25519.X25519PrivateKey),
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise InvalidInput(f"the PKI bundle opened but its contents are invalid: {exc}") from None


def _general_name(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        pass
    if not host or not host.isascii() or any(c.isspace() for c in host):
        raise InvalidInput(
            f"{host!r} is not a usable hostname for the serving certificate: pass DNS names "
            "in ASCII (punycode for international names) or IP addresses"
        )
    return x509.DNSName(host.lower())


def _leaf(
    ca: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    subject: x509.Name,
    public_key: CertificateIssuerPublicKeyTypes,
    now: datetime,
    lifetime: timedelta,
    names: list[x509.GeneralName],
    usage: x509.ObjectIdentifier,
) -> x509.Certificate:
    """A leaf signed by ``ca``; it never outlives the CA (verifiers would reject it)."""
    ski = ca.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca.subject)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _BACKDATE)
        .not_valid_after(min(now + lifetime, ca.not_valid_after_utc))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(_key_usage(ca=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )


def issue_serving_certificate(
    bundle: PkiBundle, hostnames: list[str], now: datetime | None = None, days: int = 30
) -> tuple[bytes, bytes]:
    """A TLS server certificate for exactly ``hostnames`` (callers add loopback names)."""
    names = list(dict.fromkeys(_general_name(host.strip()) for host in hostnames))
    if not names:
        raise InvalidInput("a serving certificate needs at least one hostname or IP address")
    if days < 1:
        raise InvalidInput(f"a serving certificate must last at least one day, not {days}")
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, str(names[0].value)[:64])])
    cert = _leaf(
        bundle.serving_ca_cert, bundle.serving_ca_key, subject, key.public_key(), _utc(now),
        timedelta(days=days), names, ExtendedKeyUsageOID.SERVER_AUTH,
    )
    return cert.public_bytes(serialization.Encoding.PEM), _private_pem(key).encode("ascii")


def issue_node_certificate(
    bundle: PkiBundle,
    csr: x509.CertificateSigningRequest,
    node_id: str,
    site_id: str,
    now: datetime | None = None,
    lifetime: timedelta = timedelta(days=7),
) -> x509.Certificate:
    """An mTLS client certificate for a node; only the CSR's key is used, never its names."""
    for label, value in (("node id", node_id), ("site id", site_id)):
        if not _NAME_ID_RE.match(value):
            raise InvalidInput(f"{value!r} is not a valid {label} for a node certificate")
    if not csr.is_signature_valid:  # proof that the joining node holds the private key
        raise InvalidInput(
            "the certificate signing request's signature does not verify: bcd must sign the "
            "CSR with the private key whose public key it carries"
        )
    public_key = csr.public_key()
    if not isinstance(public_key, ec.EllipticCurvePublicKey | ed25519.Ed25519PublicKey):
        raise InvalidInput(
            f"node keys must be EC (P-256) or Ed25519, not {type(public_key).__name__}"
        )
    subject = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, site_id),
            x509.NameAttribute(NameOID.COMMON_NAME, node_id),
        ]
    )
    uri = x509.UniformResourceIdentifier(f"bcd://node/{node_id}")
    return _leaf(
        bundle.node_ca_cert, bundle.node_ca_key, subject, public_key, _utc(now), lifetime, [uri],
        ExtendedKeyUsageOID.CLIENT_AUTH,
    )


def node_id_from_certificate(cert: x509.Certificate) -> str:
    names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    if len(names) != 1:
        raise InvalidInput("the client certificate has no single common name holding a node id")
    value = names[0].value
    return value if isinstance(value, str) else value.decode("utf-8")


def sign_join_response(bundle: PkiBundle, payload: bytes) -> bytes:
    return bundle.join_signing_key.sign(payload)


def verify_join_response(
    public_key_pem: bytes | ed25519.Ed25519PublicKey, payload: bytes, signature: bytes
) -> bool:
    """False for a bad signature; InvalidInput when the key itself is not an Ed25519 key."""
    try:
        return sealing.verify_join_response(public_key_pem, payload, signature)
    except sealing.SealingError as exc:
        raise InvalidInput(str(exc)) from None


def open_sealed(
    private_key: x25519.X25519PrivateKey, blob: bytes, info: bytes = sealing.JOIN_INFO
) -> bytes:
    """The plaintext of a :func:`seal_to` blob; InvalidInput when it does not open."""
    try:
        return sealing.open_sealed(private_key, blob, info)
    except sealing.SealingError as exc:
        raise InvalidInput(str(exc)) from None
