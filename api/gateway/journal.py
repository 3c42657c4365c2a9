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
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from uuid import UUID

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, ed25519

from better_compute.api.services.reservation_journal import (
    JournalHandler,
    entry_of,
    reservation_handlers,
)
from better_compute.api.wire.gateway import SignedEntry
from better_compute.api.wire.journal import AcceptanceResult, Entry, EntryInvalid, decode_entry
from better_compute.domain.node import Node

if TYPE_CHECKING:
    from better_compute.api.services.registry import Services


class EntryRefused(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def verify_entry(public_key: Any, entry: SignedEntry) -> tuple[Entry, dict[str, Any]]:
    """The entry (what every entry carries, and its whole JSON document for the handler of
    its kind to decode) once its signature verifies with ``public_key``."""
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
    try:
        return decode_entry(doc, Entry), doc
    except EntryInvalid:
        raise EntryRefused("malformed", "the signed payload is not an entry with a kind"
                           ) from None


def journal_handlers(services: Services) -> dict[str, JournalHandler]:
    """Every kind of journal entry this control plane takes, and who answers it (registered
    here, explicitly: the composition root's services)."""
    inventory = services.inventory

    def acceptance_result(uuid: UUID, epoch: int, payload: dict[str, Any]) -> None:
        _refused_inventory(inventory.acceptance_result(uuid, epoch,
                                                       entry_of(AcceptanceResult, payload)))

    return {"acceptance.result": acceptance_result,
            **reservation_handlers(services.reservations)}


@dataclass(frozen=True)
class NodeChange:
    """A kind of ``journal_handlers`` answered by a change of its node (and of what the change
    claims), which the gateway saves with other sessions' in one write (api/gateway/writes.py):
    ``change(epoch, entry)`` is the change, ``check(answer)`` raises ``EntryRefused`` when
    its answer refuses the entry."""

    change: Callable[[int, dict[str, Any]], Callable[[Node], Any]]
    check: Callable[[Any], None]


def node_changes(services: Services) -> dict[str, NodeChange]:
    """The kinds of ``journal_handlers`` the gateway saves a batch at a time."""
    inventory = services.inventory

    def accepting(epoch: int, payload: dict[str, Any]) -> Callable[[Node], Any]:
        return inventory.accepting(epoch, entry_of(AcceptanceResult, payload))

    return {"acceptance.result": NodeChange(accepting, _refused_inventory)}


def _refused_inventory(refusal: str | None) -> None:
    if refusal is not None:  # it listed other GPUs than the node's: recorded, refused
        raise EntryRefused("inventory_mismatch", refusal)
