"""Join tokens: let a limited number of machines join one pool for a limited time.

The secret (``bcjt_<26 characters of the token id>.<random>``) is shown once;
only its SHA-256 hash is kept. The secret carries the token's public id, so
checking a presented secret is one aggregate read followed by a constant-time
comparison of hashes, and the id can still come from an idempotency key.

A token may be bound to one machine by exactly one of its hardware
identifiers (``--expect-serial``, ``--expect-mac``, ``--expect-uuid``).

``joinToken.expired`` is recorded lazily: by the first join attempted after
the token's end (that attempt is still refused and spends nothing). Until
then, reads compute the state from the clock (:func:`effective_state`).

Replays: each use records the SPKI pin of the node key and the SHA-256 of the
request's nonce (``joinToken.used``), and the token refuses a request with a
key or a nonce it has seen (``Conflict``), so a captured sealed request posted
again joins nothing, however many uses the token has left.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import uuid
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from eventsourcing.domain import event

from better_compute.domain.base import TenantOwned, iso
from better_compute.domain.durations import format_duration, parse_duration
from better_compute.domain.errors import (
    Conflict,
    Expired,
    InvalidInput,
    PermissionDenied,
    Unauthenticated,
)
from better_compute.domain.ids import NAMESPACE, keyed_or_new, parse_id, public_id

JOIN_TOKEN_PREFIX = "bcjt_"
MIN_TTL = timedelta(minutes=1)
MAX_TTL = timedelta(hours=24)
MAX_USES = 10_000
EXPECT_KINDS = ("serial", "mac", "uuid")

_SECRET_RE = re.compile(r"^bcjt_([a-z2-7]{26})\.([A-Za-z0-9_-]{32,128})\Z")
_MAC_RE = re.compile(r"^[0-9a-f]{2}([:-]?)[0-9a-f]{2}(\1[0-9a-f]{2}){4}\Z")
_SERIAL_RE = re.compile(r"^[\x21-\x7e][\x20-\x7e]{0,127}\Z")

UNKNOWN_TOKEN = (
    "the join token is unknown or malformed: copy the whole bcjt_… secret that "
    "`better-compute join-tokens create` wrote, or mint a new one"
)


def join_token_hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def nonce_digest(nonce: str) -> str:
    return hashlib.sha256(nonce.encode()).hexdigest()


def make_secret(token_uuid: UUID, random_part: str) -> str:
    """The secret handed out once: the token's id, a dot, then the random part."""
    return f"{JOIN_TOKEN_PREFIX}{public_id('jt', token_uuid)[3:]}.{random_part}"


def token_uuid_of_secret(secret: str) -> UUID:
    """The id a presented secret names; Unauthenticated when it cannot be one of ours."""
    match = _SECRET_RE.match(secret.strip())
    if match is None:
        raise Unauthenticated(UNKNOWN_TOKEN)
    try:
        return parse_id("jt", "jt_" + match.group(1))
    except (InvalidInput, ValueError):
        raise Unauthenticated(UNKNOWN_TOKEN) from None


def parse_ttl(text: str) -> timedelta:
    ttl = parse_duration(text, flag="--ttl")
    if not MIN_TTL <= ttl <= MAX_TTL:
        raise InvalidInput(
            f"--ttl {text} is out of range: a join token lives from 1m to 24h "
            "(for example --ttl 2h); mint a new token when it runs out"
        )
    return ttl


def parse_max_uses(value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_USES:
        raise InvalidInput(
            f"--max-uses {value!r} is out of range: use a whole number from 1 to {MAX_USES} "
            "(1 lets exactly one machine join)"
        )
    return value


def normalize_mac(text: str) -> str | None:
    value = text.strip().lower()
    if not _MAC_RE.match(value):
        return None
    digits = value.replace(":", "").replace("-", "")
    return ":".join(digits[i : i + 2] for i in range(0, 12, 2))


def normalize_uuid(text: str) -> str | None:
    try:
        return str(uuid.UUID(text.strip()))
    except ValueError:
        return None


def parse_expect(serial: str | None, mac: str | None, product_uuid: str | None
                 ) -> dict[str, str] | None:
    """The binding of a token to one machine: at most one identifier, normalized."""
    given = {k: v for k, v in (("serial", serial), ("mac", mac), ("uuid", product_uuid))
             if v is not None}
    if not given:
        return None
    if len(given) > 1:
        raise InvalidInput(
            "a join token binds one identifier: pass only one of --expect-serial, "
            "--expect-mac and --expect-uuid"
        )
    kind, value = next(iter(given.items()))
    if kind == "serial":
        if not _SERIAL_RE.match(value.strip()):
            raise InvalidInput(
                f"--expect-serial {value!r} is not a serial number: use 1 to 128 printable "
                "characters, as the machine's firmware reports it (for example SN-7701)"
            )
        return {"serial": value.strip()}
    if kind == "mac":
        mac_value = normalize_mac(value)
        if mac_value is None:
            raise InvalidInput(
                f"--expect-mac {value!r} is not a MAC address: write six hex pairs "
                "(for example 52:54:00:12:34:56)"
            )
        return {"mac": mac_value}
    uuid_value = normalize_uuid(value)
    if uuid_value is None:
        raise InvalidInput(
            f"--expect-uuid {value!r} is not a UUID: use the machine's product UUID "
            "(cat /sys/class/dmi/id/product_uuid)"
        )
    return {"uuid": uuid_value}


def check_binding(expect: dict[str, str] | None, serial: str | None, product_uuid: str | None,
                  macs: list[str]) -> str:
    """Refuse a machine the token is not bound to; return the machine's hardware key.

    A machine that reports neither a product UUID nor a serial has no trusted
    hardware key: it may join only with a token bound to one of its MACs.
    """
    serial = (serial or "").strip() or None
    uuid_value = normalize_uuid(product_uuid) if product_uuid else None
    mac_values = {m for m in (normalize_mac(x) for x in macs) if m}
    if expect is None:
        if uuid_value:
            return f"uuid:{uuid_value}"
        if serial:
            return f"serial:{serial}"
        raise PermissionDenied(
            "no trusted hardware key: this machine reports no product UUID and no serial "
            "(WSL 2 and many VMs), and the join token is not bound to it; bind the token with "
            "--expect-mac (`better-compute join-tokens create … --expect-mac <its MAC>`)"
        )
    kind, want = next(iter(expect.items()))
    if kind == "serial":
        if serial != want:
            raise PermissionDenied(
                f"this join token is bound to serial {want}, but this machine reports "
                f"{'serial ' + serial if serial else 'no serial'}: use the token minted for this "
                "machine, or mint one with its --expect-serial"
            )
        return f"serial:{want}"
    if kind == "uuid":
        if uuid_value != want:
            raise PermissionDenied(
                f"this join token is bound to product UUID {want}, but this machine reports "
                f"{uuid_value or 'no product UUID'}: use the token minted for this machine, or "
                "mint one with its --expect-uuid"
            )
        return f"uuid:{want}"
    if want not in mac_values:
        shown = ", ".join(sorted(mac_values)) or "no MAC address"
        raise PermissionDenied(
            f"this join token is bound to MAC {want}, but this machine reports {shown}: use the "
            "token minted for this machine, or mint one with one of its --expect-mac addresses"
        )
    return f"mac:{want}"


def effective_state(state: str, expires_at: datetime | str | None, now: datetime) -> str:
    """The state a reader sees: an active token past its end is expired."""
    if state != "active" or expires_at is None:
        return state
    end = datetime.fromisoformat(expires_at.replace("Z", "+00:00")) if isinstance(
        expires_at, str) else expires_at
    return "expired" if now >= end else state


class JoinToken(TenantOwned):
    PREFIX = "jt"
    TOPIC = "bc.aggregate.jointoken"

    class Event(TenantOwned.Event):
        TOPIC = "bc.jointoken.event"

    @event("Created", topic="joinToken.created")
    def __init__(
        self, id: UUID, tenant_id: str, pool_id: str, site_id: str, secret_hash: str, ttl: str,
        expires_at: datetime, max_uses: int, expect: dict[str, str] | None, key: str | None,
        fingerprint: str | None, created_by: str | None,
    ) -> None:
        self.tenant_id = tenant_id
        self.pool_id = pool_id
        self.site_id = site_id
        self.secret_hash = secret_hash
        self.ttl = ttl
        self.expires_at = expires_at
        self.max_uses = max_uses
        self.expect = expect
        self.key = key
        self.fingerprint = fingerprint
        self.created_by = created_by
        self.uses = 0
        self.node_ids: list[str] = []
        self.state = "active"
        self.ended_at: datetime | None = None

    @staticmethod
    def new_uuid(tenant_id: str, key: str | None, namespace: UUID = NAMESPACE) -> UUID:
        return keyed_or_new(tenant_id, "jointoken", key, namespace)

    @classmethod
    def mint(
        cls, *, token_uuid: UUID, secret: str, tenant_id: str, pool_id: str, site_id: str,
        ttl: timedelta, now: datetime, max_uses: int, expect: dict[str, str] | None,
        key: str | None, fingerprint: str | None, created_by: str | None,
    ) -> JoinToken:
        return cls(
            tenant_id=tenant_id, pool_id=pool_id, site_id=site_id,
            secret_hash=join_token_hash(secret), ttl=format_duration(ttl),
            expires_at=now + ttl, max_uses=max_uses, expect=expect, key=key,
            fingerprint=fingerprint, created_by=created_by, id=token_uuid,
        )

    # ------------------------------------------------------------------ checks

    def matches(self, secret: str) -> bool:
        return hmac.compare_digest(self.secret_hash, join_token_hash(secret))

    def is_expired(self, now: datetime) -> bool:
        return self.state == "expired" or (self.state == "active" and now >= self.expires_at)

    def refusal(self, now: datetime) -> Exception | None:
        """Why this token cannot be used now (None when it can)."""
        if self.state == "revoked":
            return PermissionDenied(
                f"join token {self.public_id} was revoked: mint a new one with "
                "`better-compute join-tokens create`"
            )
        if self.state == "exhausted":
            return PermissionDenied(
                f"join token {self.public_id} is used up ({self.uses} of {self.max_uses} uses): "
                "mint a new one with `better-compute join-tokens create`"
            )
        if self.is_expired(now):
            return Expired(
                f"join token {self.public_id} expired at {iso(self.expires_at)}: mint a new one "
                "with `better-compute join-tokens create --ttl …` (1m to 24h)"
            )
        return None

    # --------------------------------------------------------------- commands

    def mark_expired(self, now: datetime) -> bool:
        """Record the end of an active token past its time; False when nothing changes."""
        if self.state != "active" or now < self.expires_at:
            return False
        self._expired(expired_at=self.expires_at)
        return True

    @event("Expired", topic="joinToken.expired")
    def _expired(self, expired_at: datetime) -> None:
        self.state = "expired"
        self.ended_at = expired_at

    def check_fresh(self, key_pin: str, nonce: str) -> None:
        """Refuse a join request this token has seen: the same node key or the same nonce."""
        if key_pin in getattr(self, "key_pins", []) or (
                nonce_digest(nonce) in getattr(self, "nonce_digests", [])):
            raise Conflict(
                f"this join request was already used with join token {self.public_id} (its "
                "node key or nonce was seen before): a replayed request joins nothing. bcd "
                "makes a new key and nonce for every join: run bcd join again"
            )

    def use(self, node_id: str, hardware_key: str, now: datetime, key_pin: str | None = None,
            nonce: str | None = None) -> None:
        refusal = self.refusal(now)
        if refusal is not None:
            raise refusal
        if key_pin is not None and nonce is not None:
            self.check_fresh(key_pin, nonce)
        self._used(node_id=node_id, hardware_key=hardware_key, used_at=now, key_pin=key_pin,
                   nonce_sha256=nonce_digest(nonce) if nonce is not None else None)
        if self.uses >= self.max_uses:
            self._exhausted(exhausted_at=now)

    @event("Used", topic="joinToken.used")
    def _used(self, node_id: str, hardware_key: str, used_at: datetime,
              key_pin: str | None = None, nonce_sha256: str | None = None) -> None:
        # key_pin and nonce_sha256: None in uses recorded before replays were checked.
        self.uses += 1
        self.node_ids = [*self.node_ids, node_id]
        self.key_pins = [*getattr(self, "key_pins", []), *([key_pin] if key_pin else [])]
        self.nonce_digests = [*getattr(self, "nonce_digests", []),
                              *([nonce_sha256] if nonce_sha256 else [])]

    @event("Exhausted", topic="joinToken.exhausted")
    def _exhausted(self, exhausted_at: datetime) -> None:
        self.state = "exhausted"
        self.ended_at = exhausted_at

    def revoke(self, now: datetime, by: str | None) -> None:
        if self.state == "revoked":
            raise Conflict(f"join token {self.public_id} is already revoked")
        self._revoked(revoked_at=now, revoked_by=by)

    @event("Revoked", topic="joinToken.revoked")
    def _revoked(self, revoked_at: datetime, revoked_by: str | None) -> None:
        self.state = "revoked"
        self.ended_at = revoked_at

    def to_doc(self, now: datetime | None = None) -> dict[str, Any]:
        state = self.state if now is None else effective_state(self.state, self.expires_at, now)
        return {
            "id": self.public_id,
            "tenantId": self.tenant_id,
            "poolId": self.pool_id,
            "siteId": self.site_id,
            "state": state,
            "ttl": self.ttl,
            "expiresAt": iso(self.expires_at),
            "maxUses": self.max_uses,
            "uses": self.uses,
            "expect": dict(self.expect) if self.expect else None,
            "nodeIds": list(self.node_ids),
            "key": self.key,
            "createdBy": self.created_by,
            "createdAt": iso(self.created_on),
            "endedAt": iso(self.ended_at),
        }
