"""bcd's side of certificate renewal: when it is due, and what it accepts back."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec, ed25519

from better_compute.agent.errors import BcdError
from better_compute.agent.node.renewal import (
    CertificateWindow,
    check_renewed,
    make_csr,
    read_window,
)
from better_compute.api import pki

NODE = "node_24ipdqbdrzf5hfec54t42tcyhi"
SITE = "site_24ipdqbdrzf5hfec54t42tcyhi"


def test_due_when_less_than_a_third_is_left() -> None:
    start = datetime(2030, 1, 1, tzinfo=UTC)
    window = CertificateWindow(start, start + timedelta(days=6))
    assert not window.due(start)
    assert not window.due(start + timedelta(days=4))  # exactly a third left
    assert window.due(start + timedelta(days=4, seconds=1))
    assert window.due(start + timedelta(days=9))  # past its end


def test_the_csr_carries_the_node_key_and_a_renewed_certificate_is_checked(
        tmp_path: Path) -> None:
    bundle = pki.generate_bundle()
    ca_file = tmp_path / "node-ca.crt"
    ca_file.write_text(pki.pem(bundle.node_ca_cert))
    key = ec.generate_private_key(ec.SECP256R1())
    csr = x509.load_pem_x509_csr(make_csr(key, NODE).encode())
    assert csr.is_signature_valid
    assert pki.spki_pin(csr.public_key()) == pki.spki_pin(key.public_key())
    cert = pki.issue_node_certificate(bundle, csr, NODE, SITE)
    assert check_renewed(pki.pem(cert), key, NODE, ca_file).serial_number == cert.serial_number
    path = tmp_path / "node.crt"
    path.write_text(pki.pem(cert))
    window = read_window(path)
    assert window is not None and window.not_after == cert.not_valid_after_utc
    assert read_window(tmp_path / "missing.crt") is None

    other_key = ec.generate_private_key(ec.SECP256R1())
    with pytest.raises(BcdError, match="not for this machine's node key"):
        check_renewed(pki.pem(cert), other_key, NODE, ca_file)
    with pytest.raises(BcdError, match="does not name"):
        check_renewed(pki.pem(cert), key, "node_other", ca_file)
    forged = pki.issue_node_certificate(pki.generate_bundle(), csr, NODE, SITE)
    with pytest.raises(BcdError, match="not signed by the node CA"):
        check_renewed(pki.pem(forged), key, NODE, ca_file)
    with pytest.raises(BcdError, match="not a PEM certificate"):
        check_renewed("garbage", key, NODE, ca_file)


def test_an_ed25519_node_key_makes_a_csr_too() -> None:
    key = ed25519.Ed25519PrivateKey.generate()
    csr = x509.load_pem_x509_csr(make_csr(key, NODE).encode())
    assert csr.is_signature_valid
