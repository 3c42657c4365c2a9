"""Journal entries signed by the node key, verified before they count.

The key is the public key of the certificate the node presented in the TLS
handshake, which the gateway has already matched with the key pin recorded
when the node joined. An entry that does not verify, or that names another
node, changes nothing and is answered with a Nack.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, ed25519

from better_compute.api.wire.gateway import SignedEntry


class EntryRefused(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def verify_entry(public_key: Any, entry: SignedEntry) -> dict[str, Any]:
    """The entry's JSON payload once its signature verifies with ``public_key``."""
    try:
        payload = base64.b64decode(entry.payload, validate=True)
        signature = base64.b64decode(entry.signature, validate=True)
    except (binascii.Error, ValueError):
        raise EntryRefused("malformed", "payload and signature must be base64") from None
    try:
        if isinstance(public_key, ec.EllipticCurvePublicKey):
            public_key.verify(signature, payload, ec.ECDSA(hashes.SHA256()))
        elif isinstance(public_key, ed25519.Ed25519PublicKey):
            public_key.verify(signature, payload)
        else:
            raise EntryRefused("bad_key", f"node keys are EC P-256 or Ed25519, not "
                               f"{type(public_key).__name__}")
    except InvalidSignature:
        raise EntryRefused(
            "bad_signature", "the entry's signature does not verify with this node's key: "
            "entries must be signed by the node key the node joined with"
        ) from None
    try:
        doc = json.loads(payload)
    except ValueError:
        raise EntryRefused("malformed", "the signed payload is not JSON") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("kind"), str):
        raise EntryRefused("malformed", "the signed payload is not an entry with a kind")
    return doc


# kind -> handler(node_service, node uuid, session epoch, payload) -> None; raising a
# BetterComputeError refuses the entry. Reservations add the allocation.* kinds here.
Handler = Callable[[Any, Any, int, dict[str, Any]], None]
HANDLERS: dict[str, Handler] = {}


def handles(kind: str) -> Callable[[Handler], Handler]:
    def register(handler: Handler) -> Handler:
        HANDLERS[kind] = handler
        return handler

    return register


@handles("acceptance.result")
def _acceptance_result(nodes: Any, uuid: Any, epoch: int, payload: dict[str, Any]) -> None:
    nodes.acceptance_result(uuid, epoch, payload)
