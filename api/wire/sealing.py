"""The cryptography bcd shares with the control plane: pins, sealing, join signatures.

This module imports only ``cryptography`` and the standard library, because bcd
(which runs on the nodes) imports it as well as the API. Failures raise
:class:`SealingError`, a ``ValueError``; ``api.pki`` re-exports these names and
turns SealingError into the project's InvalidInput where its API promises that.

* :func:`spki_pin`: ``sha256/`` + base64 of SHA-256 over the DER SubjectPublicKeyInfo,
  the pin format of the serving CA and the two join keys.
* :func:`seal_to` / :func:`open_sealed`: ephemeral X25519 -> HKDF-SHA256 ->
  ChaCha20-Poly1305, how bcd sends its join request to the join encryption key.
* :func:`verify_join_response`: the Ed25519 signature of the join signing key.
* :func:`sign_entry` / :func:`verify_entry`: journal entries signed by the node key
  (ECDSA P-256 with SHA-256, DER signature; Ed25519 node keys sign plainly), sent as
  base64 payload + base64 signature (api/wire/gateway.py ``SignedEntry``).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
from typing import Any

from cryptography.exceptions import InvalidSignature, InvalidTag
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, x25519
from cryptography.hazmat.primitives.asymmetric.types import PublicKeyTypes
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

__all__ = [
    "JOIN_INFO",
    "SealingError",
    "open_sealed",
    "seal_to",
    "sign_entry",
    "spki_pin",
    "verify_entry",
    "verify_join_response",
]

JOIN_INFO = b"better-compute join v1"
BAD_JOIN_BLOB = (
    "the sealed join request cannot be opened with this control plane's join encryption key: "
    "fetch the current joinEncryptionPublicKey from the control plane and seal the request again"
)
NOT_ED25519 = "the join signing public key is not an Ed25519 PEM public key"


class SealingError(ValueError):
    """A sealed blob that does not open, or a key of the wrong kind."""


def spki_der(public_key: PublicKeyTypes) -> bytes:
    return public_key.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def spki_pin(public_key: PublicKeyTypes) -> str:
    """``sha256/`` + standard base64 of SHA-256 over the key's DER SubjectPublicKeyInfo."""
    digest = hashlib.sha256(spki_der(public_key)).digest()
    return "sha256/" + base64.b64encode(digest).decode("ascii")


def verify_join_response(
    public_key_pem: bytes | ed25519.Ed25519PublicKey, payload: bytes, signature: bytes
) -> bool:
    """False for a bad signature; SealingError when the key itself is not an Ed25519 key."""
    key: Any = public_key_pem
    if isinstance(public_key_pem, bytes):
        try:
            key = serialization.load_pem_public_key(public_key_pem)
        except ValueError:
            key = None
    if not isinstance(key, ed25519.Ed25519PublicKey):
        raise SealingError(NOT_ED25519)
    try:
        key.verify(signature, payload)
    except InvalidSignature:
        return False
    return True


def _join_key(shared: bytes, ephemeral: bytes, recipient: bytes, info: bytes) -> bytes:
    # Both public keys go into the salt so the derived key is bound to this exact exchange.
    hkdf = HKDF(algorithm=hashes.SHA256(), length=32, salt=ephemeral + recipient, info=info)
    return hkdf.derive(shared)


def _raw(public_key: x25519.X25519PublicKey) -> bytes:
    return public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def seal_to(
    public_key: x25519.X25519PublicKey, plaintext: bytes, info: bytes = JOIN_INFO
) -> bytes:
    """Ephemeral X25519 -> HKDF-SHA256 -> ChaCha20-Poly1305; ``epk(32) || nonce(12) || ct``."""
    ephemeral = x25519.X25519PrivateKey.generate()
    ephemeral_raw = _raw(ephemeral.public_key())
    key = _join_key(ephemeral.exchange(public_key), ephemeral_raw, _raw(public_key), info)
    nonce = os.urandom(12)
    return ephemeral_raw + nonce + ChaCha20Poly1305(key).encrypt(nonce, plaintext, None)


def open_sealed(
    private_key: x25519.X25519PrivateKey, blob: bytes, info: bytes = JOIN_INFO
) -> bytes:
    """The plaintext of :func:`seal_to`'s blob; SealingError when it does not open."""
    if len(blob) < 32 + 12 + 16:
        raise SealingError(BAD_JOIN_BLOB)
    ephemeral_raw, nonce, ciphertext = blob[:32], blob[32:44], blob[44:]
    try:
        ephemeral = x25519.X25519PublicKey.from_public_bytes(ephemeral_raw)
        shared = private_key.exchange(ephemeral)  # ValueError for low-order points
        key = _join_key(shared, ephemeral_raw, _raw(private_key.public_key()), info)
        return ChaCha20Poly1305(key).decrypt(nonce, ciphertext, None)
    except (InvalidTag, ValueError):
        raise SealingError(BAD_JOIN_BLOB) from None


def sign_entry(
    private_key: ec.EllipticCurvePrivateKey | ed25519.Ed25519PrivateKey, payload: bytes
) -> tuple[str, str]:
    """``(payload_b64, signature_b64)`` of a journal entry signed by the node key."""
    if isinstance(private_key, ed25519.Ed25519PrivateKey):
        signature = private_key.sign(payload)
    elif isinstance(private_key, ec.EllipticCurvePrivateKey):
        signature = private_key.sign(payload, ec.ECDSA(hashes.SHA256()))
    else:
        raise SealingError("node keys are EC P-256 or Ed25519 private keys")
    return base64.b64encode(payload).decode("ascii"), base64.b64encode(signature).decode("ascii")


def verify_entry(
    public_key: PublicKeyTypes | bytes | str, payload_b64: str, signature_b64: str
) -> bytes | None:
    """The entry's payload bytes when the node key's signature verifies, else None.

    ``public_key`` is the key recorded at join (a key object or its PEM). Malformed
    base64, a wrong key or a tampered payload all give None: the caller refuses the
    entry without learning which, and changes nothing.
    """
    key: Any = public_key
    if isinstance(public_key, bytes | str):
        text = public_key.encode() if isinstance(public_key, str) else public_key
        try:
            key = serialization.load_pem_public_key(text)
        except ValueError:
            return None
    try:
        payload = base64.b64decode(payload_b64, validate=True)
        signature = base64.b64decode(signature_b64, validate=True)
    except (binascii.Error, ValueError):
        return None
    try:
        if isinstance(key, ed25519.Ed25519PublicKey):
            key.verify(signature, payload)
        elif isinstance(key, ec.EllipticCurvePublicKey):
            key.verify(signature, payload, ec.ECDSA(hashes.SHA256()))
        else:
            return None
    except InvalidSignature:
        return None
    return payload
