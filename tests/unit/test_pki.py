"""api/pki.py: CAs, sealing under the master key, leaf certificates, join keys."""

from __future__ import annotations

import base64
import hashlib
import ipaddress
import re
from datetime import UTC, datetime, timedelta

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519
from cryptography.hazmat.primitives.asymmetric.types import PublicKeyTypes
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from better_compute.api.pki import (
    PkiBundle,
    generate_bundle,
    issue_node_certificate,
    issue_serving_certificate,
    new_master_key,
    node_id_from_certificate,
    open_sealed,
    parse_master_key,
    pem,
    public_parts,
    seal_bundle,
    seal_to,
    sign_join_response,
    spki_pin,
    unseal_bundle,
    verify_join_response,
)
from better_compute.domain.errors import InvalidInput

NOW = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)
NODE_ID = "node_abcdefghijklmnopqrstuvwxyz"
SITE_ID = "site_abcdefghijklmnopqrstuvwxyz"


@pytest.fixture(scope="module")
def bundle() -> PkiBundle:
    return generate_bundle(NOW)


@pytest.fixture(scope="module")
def master_key() -> bytes:
    return parse_master_key(new_master_key())


def _spki(key: PublicKeyTypes) -> bytes:
    return key.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def _csr(key: ec.EllipticCurvePrivateKey | None = None) -> x509.CertificateSigningRequest:
    key = key or ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "whatever-bcd-asked-for")])
    return x509.CertificateSigningRequestBuilder().subject_name(name).sign(key, hashes.SHA256())


def test_cas_are_self_signed_ten_year_p256_cas(bundle: PkiBundle) -> None:
    for cert, cn in (
        (bundle.serving_ca_cert, "better-compute serving CA"),
        (bundle.node_ca_cert, "better-compute node CA"),
    ):
        cert.verify_directly_issued_by(cert)
        assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == cn
        constraints = cert.extensions.get_extension_for_class(x509.BasicConstraints).value
        assert constraints.ca and constraints.path_length == 0
        usage = cert.extensions.get_extension_for_class(x509.KeyUsage).value
        assert usage.key_cert_sign and usage.crl_sign and not usage.digital_signature
        assert cert.not_valid_after_utc - NOW >= timedelta(days=3650)
        assert isinstance(cert.public_key(), ec.EllipticCurvePublicKey)
        assert cert.public_key().curve.name == "secp256r1"  # type: ignore[union-attr]
    assert bundle.serving_ca_key.public_key() == bundle.serving_ca_cert.public_key()
    assert bundle.node_ca_key.public_key() == bundle.node_ca_cert.public_key()


def test_seal_unseal_round_trip(bundle: PkiBundle, master_key: bytes) -> None:
    sealed = seal_bundle(bundle, master_key)
    assert sealed.startswith("v1.") and sealed.isascii()
    assert "PRIVATE KEY" not in sealed
    assert seal_bundle(bundle, master_key) != sealed  # fresh nonce each time
    back = unseal_bundle(sealed, master_key)
    assert back.serving_ca_cert == bundle.serving_ca_cert
    assert back.node_ca_cert == bundle.node_ca_cert
    for a, b in (
        (back.serving_ca_key, bundle.serving_ca_key),
        (back.node_ca_key, bundle.node_ca_key),
        (back.join_signing_key, bundle.join_signing_key),
        (back.join_encryption_key, bundle.join_encryption_key),
    ):
        assert _spki(a.public_key()) == _spki(b.public_key())
    assert public_parts(back) == public_parts(bundle)


def test_wrong_master_key_is_refused(bundle: PkiBundle, master_key: bytes) -> None:
    sealed = seal_bundle(bundle, master_key)
    other = parse_master_key(new_master_key())
    with pytest.raises(InvalidInput, match="BETTER_COMPUTE_MASTER_KEY_FILE"):
        unseal_bundle(sealed, other)


@pytest.mark.parametrize("position", [3, 10, 40, -5])
def test_tampered_sealed_text_is_refused(
    bundle: PkiBundle, master_key: bytes, position: int
) -> None:
    sealed = seal_bundle(bundle, master_key)
    raw = bytearray(base64.urlsafe_b64decode(sealed[3:]))
    raw[position] ^= 0x01
    tampered = "v1." + base64.urlsafe_b64encode(bytes(raw)).decode()
    with pytest.raises(InvalidInput):
        unseal_bundle(tampered, master_key)


@pytest.mark.parametrize("text", ["", "v1.", "v2.AAAA", "v1.!!!!", "v1.AAAA"])
def test_garbage_sealed_text_is_refused(master_key: bytes, text: str) -> None:
    with pytest.raises(InvalidInput):
        unseal_bundle(text, master_key)


def test_master_key_format_and_parse() -> None:
    text = new_master_key()
    assert re.fullmatch(r"bcmk1_[A-Za-z0-9_-]{43}=", text)
    assert new_master_key() != text
    key = parse_master_key(f"  {text}\n")
    assert len(key) == 32
    assert base64.urlsafe_b64encode(key).decode() == text.removeprefix("bcmk1_")


@pytest.mark.parametrize(
    "text",
    ["", "garbage", "bcmk1_", "bcmk1_" + "A" * 42, "bcmk2_" + "A" * 43 + "=", "bcmk1_" + "+" * 43],
)
def test_parse_master_key_rejects_garbage(text: str) -> None:
    with pytest.raises(InvalidInput, match=r"bcmk1_.*master\.key"):
        parse_master_key(text)


def test_pins_are_sha256_of_spki(bundle: PkiBundle) -> None:
    parts = public_parts(bundle)
    assert set(parts) == {
        "servingCaSpkiPin", "joinSigningKeyPin", "joinEncryptionKeyPin", "servingCaCertificate",
        "nodeCaCertificate", "joinSigningPublicKey", "joinEncryptionPublicKey",
    }
    expected = {
        "servingCaSpkiPin": bundle.serving_ca_cert.public_key(),
        "joinSigningKeyPin": bundle.join_signing_key.public_key(),
        "joinEncryptionKeyPin": bundle.join_encryption_key.public_key(),
    }
    for field, key in expected.items():
        assert re.fullmatch(r"sha256/[A-Za-z0-9+/]{43}=", parts[field])
        digest = hashlib.sha256(_spki(key)).digest()
        assert parts[field] == "sha256/" + base64.b64encode(digest).decode()
        assert spki_pin(key) == parts[field]
    assert x509.load_pem_x509_certificate(parts["servingCaCertificate"].encode()) == (
        bundle.serving_ca_cert
    )
    assert parts["nodeCaCertificate"] == pem(bundle.node_ca_cert)
    loaded = serialization.load_pem_public_key(parts["joinSigningPublicKey"].encode())
    assert _spki(loaded) == _spki(bundle.join_signing_key.public_key())


def test_serving_certificate(bundle: PkiBundle) -> None:
    cert_pem, key_pem = issue_serving_certificate(
        bundle, ["cp.example.com", "10.0.0.7", "::1"], now=NOW, days=30
    )
    cert = x509.load_pem_x509_certificate(cert_pem)
    key = serialization.load_pem_private_key(key_pem, password=None)
    assert key_pem.startswith(b"-----BEGIN PRIVATE KEY-----")
    assert _spki(key.public_key()) == _spki(cert.public_key())
    cert.verify_directly_issued_by(bundle.serving_ca_cert)
    with pytest.raises(ValueError):
        cert.verify_directly_issued_by(bundle.node_ca_cert)
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["cp.example.com"]
    assert san.get_values_for_type(x509.IPAddress) == [
        ipaddress.ip_address("10.0.0.7"),
        ipaddress.ip_address("::1"),
    ]
    assert "localhost" not in san.get_values_for_type(x509.DNSName)
    assert not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.SERVER_AUTH]
    aki = cert.extensions.get_extension_for_class(x509.AuthorityKeyIdentifier).value
    ski = bundle.serving_ca_cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier)
    assert aki.key_identifier == ski.value.digest
    assert cert.not_valid_after_utc - NOW == timedelta(days=30)
    assert cert.not_valid_before_utc <= NOW


def test_serving_certificate_needs_a_name(bundle: PkiBundle) -> None:
    with pytest.raises(InvalidInput):
        issue_serving_certificate(bundle, [], now=NOW)
    with pytest.raises(InvalidInput):
        issue_serving_certificate(bundle, ["bad host"], now=NOW)


def test_node_certificate(bundle: PkiBundle) -> None:
    node_key = ec.generate_private_key(ec.SECP256R1())
    cert = issue_node_certificate(bundle, _csr(node_key), NODE_ID, SITE_ID, now=NOW)
    cert.verify_directly_issued_by(bundle.node_ca_cert)
    with pytest.raises(ValueError):
        cert.verify_directly_issued_by(bundle.serving_ca_cert)
    assert _spki(cert.public_key()) == _spki(node_key.public_key())
    assert node_id_from_certificate(cert) == NODE_ID
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == NODE_ID
    assert cert.subject.get_attributes_for_oid(NameOID.ORGANIZATIONAL_UNIT_NAME)[0].value == (
        SITE_ID
    )
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.UniformResourceIdentifier) == [f"bcd://node/{NODE_ID}"]
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    assert not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert cert.not_valid_after_utc - NOW == timedelta(days=7)


def test_node_certificate_for_ed25519_key(bundle: PkiBundle) -> None:
    node_key = ed25519.Ed25519PrivateKey.generate()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "bcd")])
    csr = x509.CertificateSigningRequestBuilder().subject_name(name).sign(node_key, None)
    cert = issue_node_certificate(bundle, csr, NODE_ID, SITE_ID, now=NOW)
    cert.verify_directly_issued_by(bundle.node_ca_cert)
    assert _spki(cert.public_key()) == _spki(node_key.public_key())


def test_node_certificate_never_outlives_its_ca(bundle: PkiBundle) -> None:
    cert = issue_node_certificate(
        bundle, _csr(), NODE_ID, SITE_ID, now=NOW, lifetime=timedelta(days=365 * 20)
    )
    assert cert.not_valid_after_utc == bundle.node_ca_cert.not_valid_after_utc


def test_csr_with_broken_signature_is_refused(bundle: PkiBundle) -> None:
    der = bytearray(_csr().public_bytes(serialization.Encoding.DER))
    der[-3] ^= 0xFF  # inside the ECDSA signature's integer
    broken = x509.load_der_x509_csr(bytes(der))
    assert not broken.is_signature_valid
    with pytest.raises(InvalidInput, match="signature"):
        issue_node_certificate(bundle, broken, NODE_ID, SITE_ID, now=NOW)


@pytest.mark.parametrize("node_id", ["", "node/../x", "a" * 65, "node id"])
def test_unusable_node_ids_are_refused(bundle: PkiBundle, node_id: str) -> None:
    with pytest.raises(InvalidInput):
        issue_node_certificate(bundle, _csr(), node_id, SITE_ID, now=NOW)


def test_join_signature(bundle: PkiBundle) -> None:
    payload = b'{"nodeId":"node_x","certificate":"..."}'
    signature = sign_join_response(bundle, payload)
    public_pem = public_parts(bundle)["joinSigningPublicKey"].encode()
    assert verify_join_response(public_pem, payload, signature)
    assert verify_join_response(bundle.join_signing_key.public_key(), payload, signature)
    assert not verify_join_response(public_pem, payload + b" ", signature)
    assert not verify_join_response(public_pem, payload, bytes(64))
    other = ed25519.Ed25519PrivateKey.generate().public_key()
    assert not verify_join_response(other, payload, signature)
    with pytest.raises(InvalidInput):
        verify_join_response(public_parts(bundle)["joinEncryptionPublicKey"].encode(), payload,
                             signature)


def test_seal_to_round_trip_and_tamper(bundle: PkiBundle) -> None:
    recipient = bundle.join_encryption_key
    blob = seal_to(recipient.public_key(), b"join token and csr")
    assert len(blob) == 32 + 12 + len(b"join token and csr") + 16
    assert b"join token" not in blob
    assert open_sealed(recipient, blob) == b"join token and csr"
    for position in (0, 33, 50, len(blob) - 1):
        tampered = bytearray(blob)
        tampered[position] ^= 0x01
        with pytest.raises(InvalidInput, match="join encryption key"):
            open_sealed(recipient, bytes(tampered))
    with pytest.raises(InvalidInput):
        open_sealed(recipient, blob, info=b"another purpose")
    with pytest.raises(InvalidInput):
        open_sealed(recipient, blob[:40])
    stranger = generate_bundle(NOW).join_encryption_key
    with pytest.raises(InvalidInput):
        open_sealed(stranger, blob)
