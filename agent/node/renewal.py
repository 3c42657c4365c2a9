"""Renewing the node certificate over the session, for the SAME node key.

The node certificate is short-lived (7 days from the join). When less than a
third of its lifetime is left, checked when a session starts and then every
``renew_check_seconds``, bcd sends ``Renew`` with a CSR made with the key it
joined with (the key never leaves the machine). The gateway answers
``Renewed``; bcd checks that the new certificate carries its own key, names
its node id and is signed by the node CA it trusts, then writes ``node.crt``
atomically (and ``certificate_not_after`` in config.toml). The next
connection presents it. A refusal (``Refused`` with a ``renew_*`` code) or no
answer is retried after ``renew_retry_seconds``; the session stays up.

An expired certificate cannot open a session at all (the gateway's TLS
refuses it), so a node that stayed down past its certificate's end joins
afresh.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import msgspec
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.x509.oid import NameOID

from .. import config as config_file
from ..errors import BcdError
from ..files import write_atomic
from .settings import NodeKey, NodeSettings

RENEW_FRACTION = 3  # renew when less than 1/3 of the lifetime is left


@dataclass(frozen=True)
class CertificateWindow:
    not_before: datetime
    not_after: datetime

    def due(self, now: datetime) -> bool:
        """Less than a third of the lifetime left (or already past its end)."""
        lifetime = self.not_after - self.not_before
        return self.not_after - now < lifetime / RENEW_FRACTION


def read_window(path: Path) -> CertificateWindow | None:
    """The validity of the certificate at ``path``; None when it cannot be read."""
    try:
        cert = x509.load_pem_x509_certificate(path.read_bytes())
    except (OSError, ValueError):
        return None
    return CertificateWindow(cert.not_valid_before_utc, cert.not_valid_after_utc)


def _spki(key: typing.Any) -> bytes:
    der: bytes = key.public_bytes(serialization.Encoding.DER,
                                  serialization.PublicFormat.SubjectPublicKeyInfo)
    return der


def make_csr(key: NodeKey, node_id: str) -> str:
    """A CSR for the node key; the control plane uses only its key, never its names."""
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, node_id[:64])])
    algorithm = None if not hasattr(key, "curve") else hashes.SHA256()
    csr = x509.CertificateSigningRequestBuilder().subject_name(name).sign(key, algorithm)
    return csr.public_bytes(serialization.Encoding.PEM).decode("ascii")


def check_renewed(pem: str, key: NodeKey, node_id: str, node_ca: Path | None
                  ) -> x509.Certificate:
    """The renewed certificate, once it is for our key, our node id and from the node CA."""
    try:
        cert = x509.load_pem_x509_certificate(pem.encode("ascii"))
    except (ValueError, UnicodeEncodeError):
        raise BcdError("the renewed certificate is not a PEM certificate") from None
    if _spki(cert.public_key()) != _spki(key.public_key()):
        raise BcdError("the renewed certificate is not for this machine's node key: kept the "
                       "current one")
    names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    if [n.value for n in names] != [node_id]:
        raise BcdError(f"the renewed certificate does not name {node_id}: kept the current one")
    if node_ca is not None:
        try:
            ca = x509.load_pem_x509_certificate(node_ca.read_bytes())
            cert.verify_directly_issued_by(ca)
        except OSError as exc:
            raise BcdError(f"cannot read the node CA {node_ca}: {exc.strerror}") from None
        except (ValueError, TypeError, InvalidSignature):
            raise BcdError(f"the renewed certificate is not signed by the node CA in {node_ca}: "
                           "kept the current one") from None
    return cert


def install(settings: NodeSettings, cert: x509.Certificate, not_after: str) -> None:
    """Write node.crt atomically, then config.toml's ``certificate_not_after``."""
    write_atomic(settings.certificate_path,
                 cert.public_bytes(serialization.Encoding.PEM), mode=0o644)
    config = config_file.load(settings.config_path)
    if config is not None and config.node is not None:
        node = msgspec.structs.replace(config.node, certificate_not_after=not_after)
        config_file.save(settings.config_path, msgspec.structs.replace(config, node=node))
