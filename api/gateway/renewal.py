"""Renewing a node certificate over the node's session, for the SAME node key.

bcd sends ``Renew`` with a CSR made with the key it joined with (the key
never leaves the machine). The gateway issues a fresh certificate from the
node CA only when:

* the CSR parses and its self-signature verifies (bcd holds the key);
* the CSR's key has the pin the node recorded at join (also the key of the
  certificate this session was admitted with): renewal never moves a node
  to another key; a machine with a new key joins afresh;
* the node's recorded certificate has at most half its lifetime left
  (bcd asks at a third), so a confused or hostile agent cannot mint
  certificates (and events) in a loop.

It records ``node.certificate.renewed`` (serial, notAfter) and answers
``Renewed``. A refusal is ``Refused`` with a ``renew_*`` code, records
nothing, and leaves the session up.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from uuid import UUID

from cryptography import x509

from better_compute.api import pki
from better_compute.api.services.join import NODE_CERTIFICATE_LIFETIME
from better_compute.api.services.nodes import NodeService
from better_compute.domain.base import iso
from better_compute.domain.errors import BetterComputeError, Conflict


class RenewRefused(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class Renewal:
    """Issues renewed node certificates; ``bundle`` opens the PKI on first use."""

    def __init__(self, nodes: NodeService, bundle: Callable[[], pki.PkiBundle],
                 lifetime: timedelta = NODE_CERTIFICATE_LIFETIME) -> None:
        self.nodes = nodes
        self._bundle_loader = bundle
        self._bundle: pki.PkiBundle | None = None
        self.lifetime = lifetime

    def bundle(self) -> pki.PkiBundle:
        if self._bundle is None:
            try:
                self._bundle = self._bundle_loader()
            except BetterComputeError as exc:
                raise RenewRefused("renew_unavailable", f"the gateway cannot open its PKI "
                                   f"bundle to issue certificates: {exc.message}") from None
        return self._bundle

    def renew(self, uuid: UUID, epoch: int, csr_pem: str) -> tuple[str, str]:
        """(certificate PEM, notAfter RFC 3339) for the node of ``uuid``'s session ``epoch``."""
        try:
            csr = x509.load_pem_x509_csr(csr_pem.encode("ascii"))
        except (ValueError, UnicodeEncodeError):
            raise RenewRefused("renew_bad_csr", "csrPem is not a PEM certificate signing "
                               "request: bcd makes it with its node key") from None
        if not csr.is_signature_valid:
            raise RenewRefused("renew_bad_csr", "the CSR's signature does not verify: it must "
                               "be signed by the key it carries")
        node = self.nodes.load(uuid)
        if node is None:
            raise RenewRefused("renew_unknown_node", "the node is gone: join again")
        if node.session_epoch != epoch:
            raise RenewRefused("stale_epoch", f"epoch {epoch} is not node {node.public_id}'s "
                               f"current session ({node.session_epoch}): say Hello again")
        if pki.spki_pin(csr.public_key()) != node.key_pin:
            raise RenewRefused(
                "renew_wrong_key", f"the CSR's key is not the key node {node.public_id} joined "
                f"with ({node.key_pin}): renewal keeps the node key; a machine with a new key "
                "must join afresh with a new join token")
        now = self.nodes.clock()
        left = node.certificate_not_after - now
        if left > self.lifetime / 2:
            raise RenewRefused(
                "renew_too_soon", f"node {node.public_id}'s certificate is valid until "
                f"{iso(node.certificate_not_after)}: renew when less than half of its "
                f"{_lifetime(self.lifetime)} lifetime is left")
        cert = pki.issue_node_certificate(self.bundle(), csr, node.public_id, node.site_id,
                                          now=now, lifetime=self.lifetime)
        not_after = cert.not_valid_after_utc
        try:
            self.nodes.certificate_renewed(uuid, epoch, format(cert.serial_number, "x"),
                                           not_after, actor=node.public_id)  # the node asked
        except Conflict as exc:
            raise RenewRefused("stale_epoch", exc.message) from None
        return pki.pem(cert), iso(not_after) or ""


def _lifetime(lifetime: timedelta) -> str:
    seconds = int(lifetime.total_seconds())
    return f"{seconds // 86400}-day" if seconds % 86400 == 0 else f"{seconds}-second"
