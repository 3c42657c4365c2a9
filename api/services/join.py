"""Join tokens and joining a node: the control plane's side of `bcd join`.

``nodes.join`` is public (the join token is the credential). It opens the
sealed JoinRequest with the join encryption key, checks the token (hash, TTL,
uses, binding), issues the node certificate for the CSR's key, then saves the
spent token and the new Node (``adopting``) in ONE atomic save, and answers a
JoinResponse signed by the join signing key. A machine is one node: the
node's id derives from its hardware key, so the same machine joining again
is refused while its node exists, and gets its node back (``node.rejoined``)
once that node was removed. Any refusal saves nothing, except
that the first join attempted after a token's end records ``joinToken.expired``.
The token's secret is never stored, logged or put into an event.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import secrets
from datetime import timedelta
from typing import Any
from uuid import UUID, uuid5

import msgspec
from cryptography import x509
from eventsourcing.persistence import IntegrityError

from better_compute.api import pki
from better_compute.api.services.compute import ComputeService
from better_compute.api.services.tokens import revoke_token
from better_compute.api.services.unit import RETRY_ATTEMPTS
from better_compute.api.wire.join import HardwareFacts, HardwareGpu, JoinRequest, JoinResponse
from better_compute.domain.access import Principal
from better_compute.domain.base import fingerprint, iso
from better_compute.domain.errors import (
    Conflict,
    InvalidInput,
    NotFound,
    PermissionDenied,
    Unauthenticated,
    Unavailable,
)
from better_compute.domain.ids import check_key, parse_id, public_id
from better_compute.domain.join_token import (
    UNKNOWN_TOKEN,
    JoinToken,
    check_binding,
    effective_state,
    make_secret,
    parse_expect,
    parse_max_uses,
    parse_ttl,
    token_uuid_of_secret,
)
from better_compute.domain.node import NODE_ROLE, Node
from better_compute.domain.pool import Pool

# Node certificates are short-lived; the node renews its certificate over its session.
NODE_CERTIFICATE_LIFETIME = timedelta(days=7)

_REQUEST = msgspec.json.Decoder(JoinRequest)
_ENCODER = msgspec.json.Encoder()


class JoinService:
    """joinTokens.* and nodes.join, on top of the ComputeService's store and clock."""

    def __init__(self, service: ComputeService) -> None:
        self.service = service

    # ------------------------------------------------------------- join tokens

    def create(
        self, principal: Principal, pool_id: str, ttl: str, max_uses: int,
        expect_serial: str | None, expect_mac: str | None, expect_uuid: str | None,
        key: str | None,
    ) -> dict[str, Any]:
        """Mint a token; the answer carries the secret once (``token``), never again."""
        pool = self.service.pool(principal, pool_id)
        principal.require_admin_of(pool.tenant_id, "mint join tokens")
        lifetime = parse_ttl(ttl)
        uses = parse_max_uses(max_uses)
        expect = parse_expect(expect_serial, expect_mac, expect_uuid)
        if key:
            check_key(key)
        fp = fingerprint({"pool": pool.public_id, "ttl": int(lifetime.total_seconds()),
                          "maxUses": uses, "expect": expect})
        token_uuid = self.service.new_id(pool.tenant_id, "jointoken", key)
        if key:
            existing = self.service.aggregates.get(JoinToken, token_uuid)
            if existing is not None:
                return self._replayed(existing, fp, key)
        secret = make_secret(token_uuid, secrets.token_urlsafe(32))
        now = self.service.clock()
        token = JoinToken.mint(
            token_uuid=token_uuid, secret=secret, tenant_id=pool.tenant_id,
            pool_id=pool.public_id, site_id=pool.site_id, ttl=lifetime, now=now, max_uses=uses,
            expect=expect, key=key, fingerprint=fp, created_by=principal.token_id,
        )
        try:
            self.service.store.save(token, actor=principal.actor)
        except IntegrityError:
            existing = self.service.aggregates.get(JoinToken, token_uuid)
            if existing is None or not key:
                raise
            return self._replayed(existing, fp, key)
        return {**token.to_doc(now), "token": secret}

    def _replayed(self, token: JoinToken, fp: str, key: str) -> dict[str, Any]:
        token.check_retry(fp, "join token", key)
        return {**token.to_doc(self.service.clock()), "replayed": True}

    def _token(self, principal: Principal, token_id: str) -> JoinToken:
        token = self.service.aggregates.get(JoinToken, parse_id("jt", token_id))
        if token is None or not principal.can_see_tenant(token.tenant_id):
            raise NotFound(
                f"no join token {token_id!r}: `better-compute join-tokens list` shows yours"
            )
        return token

    def get(self, principal: Principal, token_id: str) -> dict[str, Any]:
        return self._token(principal, token_id).to_doc(self.service.clock())

    def list(self, principal: Principal, tenant_id: str | None, pool_id: str | None,
             all_tenants: bool = False) -> list[dict[str, Any]]:
        tenant = self.service.aggregates.listed_tenant(principal, tenant_id, all_tenants,
                                                       "join tokens")
        docs = self.service.listing("jointoken", tenant_id=tenant,
                                    where={"poolId": pool_id} if pool_id else None)
        now = self.service.clock()
        for doc in docs:
            doc["state"] = effective_state(doc["state"], doc["expiresAt"], now)
        return docs

    def revoke(self, principal: Principal, token_id: str) -> dict[str, Any]:
        return revoke_token(self.service, principal, self._token(principal, token_id),
                            "join tokens")

    # -------------------------------------------------------------------- join

    def join(self, sealed: str) -> dict[str, str]:
        """Open a sealed JoinRequest, spend its token, create the node, sign the answer."""
        bundle = self._bundle()
        request = self._open(bundle, sealed)
        csr = _load_csr(request.csr_pem)
        for _ in range(RETRY_ATTEMPTS):  # the one retry policy (api/services/unit.py)
            answer = self._try_join(bundle, request, csr)
            if answer is not None:
                return answer
        raise Conflict(
            "the join token was being used by other machines at the same moment; nothing was "
            "spent: run bcd join again"
        )

    def _try_join(self, bundle: pki.PkiBundle, request: JoinRequest,
                  csr: x509.CertificateSigningRequest) -> dict[str, str] | None:
        token = self.service.aggregates.get(JoinToken, token_uuid_of_secret(request.token))
        if token is None or not token.matches(request.token):
            raise Unauthenticated(UNKNOWN_TOKEN)
        return self._join_with(token, bundle, request, csr)

    def _join_with(self, token: JoinToken, bundle: pki.PkiBundle, request: JoinRequest,
                   csr: x509.CertificateSigningRequest) -> dict[str, str] | None:
        now = self.service.clock()
        refusal = token.refusal(now)
        if refusal is not None:
            if token.mark_expired(now):
                # Another request may have recorded it (or used the token) just now.
                with contextlib.suppress(IntegrityError):
                    self.service.store.save(token, actor=token.public_id)
            raise refusal
        key_pin = pki.spki_pin(csr.public_key())
        token.check_fresh(key_pin, request.nonce)  # a replayed request: before anything else
        hw = request.hardware
        hardware_key = check_binding(token.expect, hw.serial, hw.product_uuid, hw.macs)
        if self.service.aggregates.get(Pool, parse_id("pool", token.pool_id)) is None:
            raise NotFound(f"pool {token.pool_id} of join token {token.public_id} is gone")
        node_uuid = machine_node_uuid(hardware_key, self.service.id_namespace())
        earlier = self.service.aggregates.get(Node, node_uuid)
        _check_rejoin(earlier, token, hardware_key)
        node_id = public_id("node", node_uuid)
        cert = pki.issue_node_certificate(bundle, csr, node_id, token.site_id, now=now,
                                          lifetime=NODE_CERTIFICATE_LIFETIME)
        not_after = cert.not_valid_after_utc
        facts: dict[str, Any] = {
            "pool_id": token.pool_id, "site_id": token.site_id,
            "join_token_id": token.public_id, "hardware": _hardware_doc(hw),
            "gpus": [_gpu_doc(g) for g in hw.gpus],
            "key_pin": key_pin,
            "certificate_serial": format(cert.serial_number, "x"),
            "certificate_not_after": not_after, "bcd_version": request.bcd_version,
        }
        if earlier is not None:  # a removed node: the machine gets it back
            node = earlier
            node.rejoin(**facts, at=now)
        else:
            node = Node(id=node_uuid, tenant_id=token.tenant_id, role=NODE_ROLE,
                        hardware_key=hardware_key, **facts)
        token.use(node_id, hardware_key, now, key_pin=key_pin, nonce=request.nonce)
        try:
            self.service.store.save(token, node, actor=token.public_id)  # it admitted the machine
        except IntegrityError:
            return None  # the token changed under us: read it again and re-check
        response = JoinResponse(
            nonce=request.nonce, node_id=node_id, site_id=token.site_id, pool_id=token.pool_id,
            tenant_id=token.tenant_id, role=NODE_ROLE, certificate_pem=pki.pem(cert),
            node_ca_certificate=pki.pem(bundle.node_ca_cert), not_after=iso(not_after) or "",
            gateway_url=self.service.gateway_url,
            serving_ca_spki_pin=pki.spki_pin(bundle.serving_ca_cert.public_key()),
        )
        payload = _ENCODER.encode(response)
        signature = pki.sign_join_response(bundle, payload)
        return {"payload": base64.b64encode(payload).decode("ascii"),
                "signature": base64.b64encode(signature).decode("ascii")}

    def _bundle(self) -> pki.PkiBundle:
        stored = self.service.pki()
        if self.service.master_key_text is None:
            raise Unavailable(
                "this control plane has no master key to open its PKI bundle, so it cannot "
                "issue node certificates: run it with BETTER_COMPUTE_MASTER_KEY_FILE set"
            )
        key = pki.parse_master_key(self.service.master_key_text())
        return pki.unseal_bundle(stored.sealed, key)

    def _open(self, bundle: pki.PkiBundle, sealed: str) -> JoinRequest:
        try:
            blob = base64.b64decode(sealed, validate=True)
        except (binascii.Error, ValueError):
            raise InvalidInput(
                "sealed is not base64: bcd sends base64 of the JoinRequest sealed to the join "
                "encryption key"
            ) from None
        plaintext = pki.open_sealed(bundle.join_encryption_key, blob)
        try:
            request = _REQUEST.decode(plaintext)
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            raise InvalidInput(f"the sealed join request is not a JoinRequest: {exc}") from None
        if not 16 <= len(request.nonce) <= 128:
            raise InvalidInput("the join request's nonce must be 16 to 128 characters (base64)")
        return request


def machine_node_uuid(hardware_key: str, namespace: UUID) -> UUID:
    """The node id of a machine: one per hardware key, so a machine is one node for good.

    In the installation's own id namespace (docs/security.md), like keyed ids: the same
    machine in two installations is two different node ids.
    """
    return uuid5(namespace, f"node-machine\x00{hardware_key}")


def _check_rejoin(earlier: Node | None, token: JoinToken, hardware_key: str) -> None:
    """A machine joins once; a removed node comes back only into its own tenant's pools."""
    if earlier is None:
        return
    if not earlier.removed:
        raise Conflict(
            f"this machine ({hardware_key}) already joined as node {earlier.public_id} "
            f"({earlier.provision_state}): a machine is one node. If its identity is intact, "
            "start bcd node with its config; to join it afresh, remove the node first "
            f"(`better-compute nodes remove {earlier.public_id}`), then run bcd join again",
            data={"nodeId": earlier.public_id})
    if earlier.tenant_id != token.tenant_id:
        raise PermissionDenied(
            f"this machine ({hardware_key}) was a node of another tenant and was removed; a "
            "removed node joins again only into a pool of its own tenant: ask the platform "
            "operator")


def _load_csr(text: str) -> x509.CertificateSigningRequest:
    try:
        return x509.load_pem_x509_csr(text.encode("ascii"))
    except (ValueError, UnicodeEncodeError):
        raise InvalidInput(
            "the join request's csrPem is not a PEM certificate signing request: bcd makes it "
            "from the node key it generates"
        ) from None


def _gpu_doc(gpu: HardwareGpu) -> dict[str, Any]:
    doc = msgspec.to_builtins(gpu)
    doc.pop("memoryMib", None)  # the old spelling, only ever read (api/wire/join.py)
    return dict(doc)


def _hardware_doc(hw: HardwareFacts) -> dict[str, Any]:
    doc = msgspec.to_builtins(hw)
    doc.pop("gpus", None)
    doc.pop("memoryGib", None)  # the old spelling, only ever read (api/wire/join.py)
    return dict(doc)
