"""Prefixed, opaque public ids and the aggregate UUIDs behind them.

A public id is ``<prefix>_<base32 of the UUID>`` (26 lower-case letters and
digits, no dashes: ids end up in systemd slice names where a dash is a level).
Creates that carry an idempotency key derive the UUID from the tenant, the kind
and the key, so a retry lands on the same aggregate, in the installation's own
namespace (a random UUID drawn by ``init`` and kept with the PKI bundle): two
clusters built by one script mint different ids. Stores initialized before
installation namespaces keep minting in ``NAMESPACE``. Once minted, an id is an
opaque string: reading it never needs the namespace.
"""

from __future__ import annotations

import base64
import binascii
import functools
import re
import uuid

from better_compute.domain.errors import InvalidInput

NAMESPACE = uuid.UUID("5b0e0c2e-6f6c-4a35-9a55-6b1c0a3d7e11")

PREFIXES = ("site", "pool", "node", "rsv", "alloc", "jt", "tok")

_KEY_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@/-]{0,127}\Z")
_TENANT_RE = re.compile(r"^[a-z][a-z0-9-]{0,39}\Z")


# Both are pure and run several times per event and per call (base32 is slow in Python):
# remembered for the ids in use. Only well-formed ids are remembered (a refusal raises).
@functools.lru_cache(maxsize=1 << 14)
def public_id(prefix: str, value: uuid.UUID) -> str:
    return f"{prefix}_" + base64.b32encode(value.bytes).decode().rstrip("=").lower()


@functools.lru_cache(maxsize=1 << 14)
def parse_id(prefix: str, text: str) -> uuid.UUID:
    """The UUID behind ``text``; an input error when it is not a well-formed ``prefix_`` id."""
    head, sep, tail = text.partition("_")
    value: uuid.UUID | None = None
    if head == prefix and sep and len(tail) == 26:
        try:
            value = uuid.UUID(bytes=base64.b32decode(tail.upper() + "======"))
        except (ValueError, binascii.Error):
            value = None
    # Only the canonical spelling is an id: 26 base32 characters carry 130 bits for 128.
    if value is None or public_id(prefix, value) != f"{prefix}_{tail.lower()}":
        raise InvalidInput(
            f"{text!r} is not a {prefix} id: {prefix} ids look like {prefix}_ followed by "
            "26 letters and digits, as printed when the object was created"
        )
    return value


def keyed_uuid(tenant_id: str, kind: str, key: str, namespace: uuid.UUID = NAMESPACE
               ) -> uuid.UUID:
    """The UUID of the object ``key`` names, in an installation's ``namespace``."""
    return uuid.uuid5(namespace, f"{kind}\x00{tenant_id}\x00{key}")


def keyed_or_new(tenant_id: str, kind: str, key: str | None, namespace: uuid.UUID) -> uuid.UUID:
    """A create's UUID: derived from its idempotency key when it has one, else random."""
    return keyed_uuid(tenant_id, kind, key, namespace) if key else new_uuid()


def named_uuid(kind: str, name: str) -> uuid.UUID:
    return uuid.uuid5(NAMESPACE, f"{kind}\x00{name}")


def new_uuid() -> uuid.UUID:
    return uuid.uuid4()


def check_key(key: str) -> str:
    if not _KEY_RE.match(key):
        raise InvalidInput(
            f"--key {key!r} is not a valid idempotency key: use 1 to 128 letters, digits "
            "and . _ : @ / -, starting with a letter or digit (for example site-eu-1)"
        )
    return key


def check_tenant_id(tenant_id: str) -> str:
    if not _TENANT_RE.match(tenant_id):
        raise InvalidInput(
            f"{tenant_id!r} is not a valid tenant id: use 1 to 40 lower-case letters, digits "
            "and dashes, starting with a letter (for example acme)"
        )
    return tenant_id
