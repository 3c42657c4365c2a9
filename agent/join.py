"""`bcd join`: join this machine to a pool with a join token, pinning the control plane.

Order matters, and every refusal happens before anything is written:

1. Already joined (config.toml has a [node])? Print so and stop: no token is read or spent.
2. Read the token (join_token), the pins and the server (flags, else the pre-join config).
3. Read the well-known document over TLS pinned to the serving CA; refuse it when any
   published pin, or any published key's own pin, differs from the operator's.
4. Generate the node key (EC P-256) here, a CSR, a nonce; read the hardware facts;
   seal the JoinRequest to the join encryption key; call ``nodes.join``.
5. Verify the SignedJoinResponse with the pinned join signing key, its nonce, and that
   the certificate is for our key, for the node id, issued by the node CA it names.
6. Only then write the key, certificates, join-encryption.jwk and, last, config.toml,
   each atomically; delete the token file.
"""

from __future__ import annotations

import base64
import binascii
import os
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TextIO

import msgspec
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, x25519
from cryptography.x509.oid import NameOID

from better_compute.api.wire.join import (
    HardwareFacts,
    JoinParams,
    JoinRequest,
    JoinResponse,
    SignedJoinResponse,
    WellKnown,
)
from better_compute.api.wire.sealing import (
    SealingError,
    seal_to,
    spki_der,
    spki_pin,
    verify_join_response,
)

from . import config as config_file
from .config import AgentConfig, FilesSection, NodeSection, ServerSection
from .control_plane import ControlPlane, HttpControlPlane, ca_pin, normalize_server
from .errors import BcdError, UsageError
from .files import write_atomic
from .hardware import collect
from .join_token import JoinToken, read_token
from .node.state import removed_marker, removed_node
from .paths import Paths
from .times import rfc3339
from .version import bcd_version

_FETCH_PINS = "print them on the control plane with `better-compute pki show --query <name>Pin`"


@dataclass(frozen=True)
class Pins:
    serving_ca: str
    join_signing: str
    join_encryption: str


@dataclass(frozen=True)
class JoinOptions:
    server: str | None = None
    serving_ca_pin: str | None = None
    join_signing_pin: str | None = None
    join_encryption_pin: str | None = None
    token_file: str | None = None


@dataclass(frozen=True)
class Joined:
    response: JoinResponse
    not_after: datetime


def b64decode(text: str, what: str) -> bytes:
    """Standard base64 (URL-safe accepted too); BcdError naming ``what`` otherwise."""
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        pass
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        raise BcdError(f"the join response's {what} is not base64: refusing it") from None


def resolve(options: JoinOptions, existing: AgentConfig | None) -> tuple[str, Pins, str | None]:
    """Server, pins and gateway from the flags, else from a pre-join config.toml."""
    server_cfg = existing.server if existing else ServerSection()
    server = options.server or server_cfg.url
    values = {
        "--serving-ca-pin": options.serving_ca_pin or server_cfg.serving_ca_pin,
        "--join-signing-pin": options.join_signing_pin or server_cfg.join_signing_pin,
        "--join-encryption-pin": options.join_encryption_pin or server_cfg.join_encryption_pin,
    }
    missing = [flag for flag, value in {"--server": server, **values}.items() if not value]
    if missing:
        raise BcdError(
            f"bcd join needs {', '.join(missing)} (or the same in config.toml's [server], as the "
            f"install script writes it); {_FETCH_PINS}", code="invalid_input"
        )
    for flag, value in values.items():
        if not str(value).startswith("sha256/"):
            raise BcdError(f"{flag} {value!r} is not a pin: pins look like sha256/<base64>; "
                           f"{_FETCH_PINS}", code="invalid_input")
    pins = Pins(values["--serving-ca-pin"], values["--join-signing-pin"],  # type: ignore[arg-type]
                values["--join-encryption-pin"])  # type: ignore[arg-type]
    return normalize_server(str(server)), pins, server_cfg.gateway_url


def _public_key(pem_text: str, kind: type, what: str) -> object:
    try:
        key = serialization.load_pem_public_key(pem_text.encode())
    except ValueError:
        key = None
    if not isinstance(key, kind):
        raise BcdError(f"the well-known document's {what} is not a {kind.__name__}: refusing it")
    return key


def check_well_known(document: WellKnown, pins: Pins) -> tuple[ed25519.Ed25519PublicKey,
                                                               x25519.X25519PublicKey]:
    """Refuse the document unless every published pin, and every key's own pin, is the given one.

    Returns the join signing and join encryption public keys, now trusted.
    """
    published = (
        ("serving CA", document.serving_ca_spki_pin, pins.serving_ca, "--serving-ca-pin"),
        ("join signing key", document.join_signing_key_pin, pins.join_signing,
         "--join-signing-pin"),
        ("join encryption key", document.join_encryption_key_pin, pins.join_encryption,
         "--join-encryption-pin"),
    )
    for label, theirs, ours, flag in published:
        if theirs != ours:
            raise BcdError(
                f"the control plane publishes {label} pin {theirs}, but {flag} is {ours}: "
                f"refusing to join (nothing written). Check the pin: {_FETCH_PINS}",
                code="invalid_input")
    signing = _public_key(document.join_signing_public_key, ed25519.Ed25519PublicKey,
                          "joinSigningPublicKey")
    encryption = _public_key(document.join_encryption_public_key, x25519.X25519PublicKey,
                             "joinEncryptionPublicKey")
    actual = (
        ("serving CA certificate", ca_pin(document.serving_ca_certificate), pins.serving_ca),
        ("join signing public key", spki_pin(signing), pins.join_signing),  # type: ignore[arg-type]
        ("join encryption public key", spki_pin(encryption), pins.join_encryption),  # type: ignore[arg-type]
    )
    for label, theirs, ours in actual:
        if theirs != ours:
            raise BcdError(
                f"the well-known document's {label} has pin {theirs}, not the pinned {ours}: "
                "the document was altered; refusing to join (nothing written)"
            )
    return signing, encryption  # type: ignore[return-value]


def new_node_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def certificate_request(key: ec.EllipticCurvePrivateKey, hostname: str | None) -> str:
    """A CSR proving we hold the key; the control plane uses only its key, never its names."""
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, (hostname or "bcd")[:64])])
    csr = x509.CertificateSigningRequestBuilder().subject_name(name).sign(key, hashes.SHA256())
    return csr.public_bytes(serialization.Encoding.PEM).decode("ascii")


def verify_response(signed: SignedJoinResponse, signing_key: ed25519.Ed25519PublicKey,
                    nonce: str, node_key: ec.EllipticCurvePrivateKey) -> Joined:
    """The JoinResponse, once its signature, nonce and certificate all check out."""
    payload = b64decode(signed.payload, "payload")
    signature = b64decode(signed.signature, "signature")
    try:
        valid = verify_join_response(signing_key, payload, signature)
    except SealingError as exc:
        raise BcdError(str(exc)) from None
    if not valid:
        raise BcdError(
            "the join response's signature does not verify with the pinned join signing key: it "
            "was forged or altered on the way; refusing it (nothing written). Run bcd join again; "
            "if this repeats, something between this machine and the control plane rewrites traffic"
        )
    try:
        response = msgspec.json.decode(payload, type=JoinResponse)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise BcdError(f"the signed join response is not a JoinResponse: {exc}") from None
    if response.nonce != nonce:
        raise BcdError(
            "the join response answers another request (its nonce is not this join's): "
            "refusing a replayed response (nothing written); run bcd join again"
        )
    try:
        cert = x509.load_pem_x509_certificate(response.certificate_pem.encode())
        node_ca = x509.load_pem_x509_certificate(response.node_ca_certificate.encode())
    except ValueError:
        raise BcdError("the join response's certificates are not PEM certificates") from None
    if spki_der(cert.public_key()) != spki_der(node_key.public_key()):
        raise BcdError("the node certificate in the join response is not for this machine's key")
    try:
        cert.verify_directly_issued_by(node_ca)
    except (InvalidSignature, ValueError, TypeError):
        raise BcdError("the node certificate is not issued by the node CA sent with it: "
                       "refusing the join response (nothing written)") from None
    names = [attr.value for attr in cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)]
    if names != [response.node_id]:
        raise BcdError(f"the node certificate names {names}, not node {response.node_id}")
    return Joined(response, cert.not_valid_after_utc)


def jwk(public_key: x25519.X25519PublicKey, pin: str) -> str:
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    x = base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")
    document = {"kty": "OKP", "crv": "X25519", "use": "enc", "kid": pin, "x": x}
    return msgspec.json.encode(document).decode() + "\n"


def _write_identity(paths: Paths, server: str, pins: Pins, gateway: str | None,
                    document: WellKnown, encryption: x25519.X25519PublicKey,
                    key: ec.EllipticCurvePrivateKey, joined: Joined, token_id: str | None
                    ) -> None:
    response = joined.response
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    paths.etc.mkdir(parents=True, exist_ok=True, mode=0o755)
    write_atomic(paths.node_key, key_pem, mode=0o600)
    write_atomic(paths.node_certificate, response.certificate_pem)
    write_atomic(paths.node_ca_certificate, response.node_ca_certificate)
    write_atomic(paths.serving_ca_certificate, document.serving_ca_certificate)
    write_atomic(paths.join_encryption_jwk, jwk(encryption, pins.join_encryption))
    before = config_file.load(paths.config)  # the operator's node settings stay
    config = AgentConfig(
        server=ServerSection(
            url=server, gateway_url=response.gateway_url or document.gateway_url or gateway,
            serving_ca_pin=pins.serving_ca, join_signing_pin=pins.join_signing,
            join_encryption_pin=pins.join_encryption,
        ),
        node=NodeSection(
            id=response.node_id, site_id=response.site_id, pool_id=response.pool_id,
            tenant_id=response.tenant_id, role=response.role,
            certificate_not_after=rfc3339(joined.not_after, timespec="seconds"),
            join_token_id=token_id,
        ),
        files=FilesSection(
            key=str(paths.node_key), certificate=str(paths.node_certificate),
            node_ca=str(paths.node_ca_certificate), serving_ca=str(paths.serving_ca_certificate),
            join_encryption_key=str(paths.join_encryption_jwk),
        ),
        kubernetes=before.kubernetes if before else None,
        container_toolkit=before.container_toolkit if before else None,
        metrics=before.metrics if before else None,
        log=before.log if before else None,
    )
    config_file.save(paths.config, config)  # last: its [node] is what "joined" means


_TOKEN_ID = re.compile(r"^bcjt_([a-z2-7]{26})\.")


def join_token_id(secret: str) -> str | None:
    """The id (``jt_…``) a join token's secret names, or None for one that names none."""
    found = _TOKEN_ID.match(secret)
    return f"jt_{found.group(1)}" if found else None


def _offered_token(options: JoinOptions, env: Mapping[str, str], stdin: TextIO | None
                   ) -> JoinToken | None:
    """The join token this run was given, if any could be read (a second run after a join
    finds its --token-file deleted: then none was offered)."""
    if options.token_file and not Path(options.token_file).exists():
        return None
    try:
        return read_token(options.token_file, env, stdin)
    except UsageError:
        return None


def _check_same_join(existing: AgentConfig, options: JoinOptions, paths: Paths,
                     env: Mapping[str, str], stdin: TextIO | None) -> None:
    """A run on a joined machine repeats its join (exit 0: nothing to do) unless it names
    another control plane, other pins or another join token: then it is refused
    (``conflict``), since this machine stays joined where it is."""
    assert existing.node is not None
    server = existing.server
    given = (("--server", (options.server or "").strip().rstrip("/"), server.url),
             ("--serving-ca-pin", options.serving_ca_pin, server.serving_ca_pin),
             ("--join-signing-pin", options.join_signing_pin, server.join_signing_pin),
             ("--join-encryption-pin", options.join_encryption_pin, server.join_encryption_pin))
    why = next((f"{flag} {ours} is not the {theirs} it joined with"
                for flag, ours, theirs in given if ours and theirs and ours != theirs), None)
    joined_with = existing.node.join_token_id
    token = _offered_token(options, env, stdin) if why is None and joined_with else None
    if token is not None and join_token_id(token.secret) != joined_with:
        offered = join_token_id(token.secret) or "not a join token"
        why = f"the join token from {token.source} is {offered}, not {joined_with}, which it " \
              "joined with"
    if why is not None:
        node = existing.node.id
        raise BcdError(
            f"this machine is already joined as {node}, and {why}: nothing was changed. To join "
            f"it elsewhere, remove the node (`better-compute nodes remove {node}`) and run bcd "
            f"join again, or move {paths.config} away first", code="conflict")


def join(options: JoinOptions, *, paths: Paths, env: Mapping[str, str], stdin: TextIO | None,
         out: TextIO = sys.stdout,
         control_plane: Callable[[str], ControlPlane] = HttpControlPlane,
         hardware: Callable[[Paths, Mapping[str, str]], HardwareFacts] = collect) -> int:
    existing = config_file.load(paths.config)
    removed = removed_node(paths)
    if existing is not None and existing.node is not None:
        if removed != existing.node.id:
            _check_same_join(existing, options, paths, env, stdin)
            print(f"already joined as {existing.node.id}", file=out)
            return 0
        print(f"node {removed} was removed from the control plane: joining again", file=out)
    server, pins, gateway = resolve(options, existing)
    token: JoinToken = read_token(options.token_file, env, stdin)
    facts = hardware(paths, env)
    plane = control_plane(server)
    document = plane.well_known(pins.serving_ca)
    signing, encryption = check_well_known(document, pins)
    key = new_node_key()
    nonce = base64.b64encode(os.urandom(32)).decode("ascii")
    request = JoinRequest(token=token.secret, nonce=nonce, hardware=facts,
                          csr_pem=certificate_request(key, facts.hostname),
                          bcd_version=bcd_version())
    sealed = seal_to(encryption, msgspec.json.encode(request))
    signed = plane.join(JoinParams(sealed=base64.b64encode(sealed).decode("ascii")))
    joined = verify_response(signed, signing, nonce, key)
    _write_identity(paths, server, pins, gateway, document, encryption, key, joined,
                    join_token_id(token.secret))
    removed_marker(paths).unlink(missing_ok=True)
    if token.file is not None:
        token.file.unlink(missing_ok=True)
    response = joined.response
    print(f"joined as {response.node_id} (site {response.site_id}, role {response.role}); "
          f"certificate valid until {rfc3339(joined.not_after, timespec='seconds')}", file=out)
    return 0
