"""API tokens: ``biam_…`` secrets shown once, stored only as a hash.

The aggregate's id is derived from the secret's hash, so authenticating a
request is one aggregate read and no table of secrets exists anywhere.

Lifetimes (docs/operations.md, "Token lifetimes"): a token made with a TTL
stops working at ``expires_at``. Rotation mints a NEW token (a new secret is
a new id) and gives the old one a grace period: it keeps working until
``grace_until`` (never past its own end). A token past its end is refused
by authentication at once, by the clock; ``token.expired`` records it in the
log, dated at that end, when the tokens controller next looks (within a
minute) — never on the request path.
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from eventsourcing.domain import event

from better_compute.domain.access import Role
from better_compute.domain.base import TenantOwned, iso
from better_compute.domain.durations import format_duration, parse_duration
from better_compute.domain.errors import Conflict, InvalidInput
from better_compute.domain.ids import named_uuid

TOKEN_PREFIX = "biam_"


def token_hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


@functools.lru_cache(maxsize=4096)
def token_uuid(secret_hash: str) -> UUID:
    """The token's aggregate id (a name-based UUID: a SHA-1 per call, on every request's
    authentication, so the last few thousand are kept; keyed by the hash, never the secret)."""
    return named_uuid("token", secret_hash)


class ApiToken(TenantOwned):
    PREFIX = "tok"
    TOPIC = "bc.aggregate.token"
    # Every event gives an attribute a new value, never changes one in place: the aggregate
    # cache hands out shallow copies (api/store/aggregate_cache.py, COPY_ON_WRITE).
    COPY_ON_WRITE = True

    class Event(TenantOwned.Event):
        TOPIC = "bc.token.event"

    @event("Created", topic="token.created")
    def __init__(
        self, tenant_id: str, role: str, name: str, secret_hash: str, created_by: str | None,
        expires_at: datetime | None = None, ttl: str | None = None,
        rotated_from: str | None = None,
    ) -> None:
        # expires_at, ttl, rotated_from: tokens made before lifetimes existed have none.
        self.tenant_id = tenant_id
        self.role = role
        self.name = name
        self.secret_hash = secret_hash
        self.created_by = created_by
        self.revoked_at: datetime | None = None
        self.expires_at = expires_at
        self.ttl = ttl
        self.rotated_from = rotated_from
        self.rotated_to: str | None = None
        self.grace_until: datetime | None = None
        self.expired_at: datetime | None = None

    @staticmethod
    def create_id(secret_hash: str, **_: Any) -> UUID:
        return token_uuid(secret_hash)

    @property
    def role_enum(self) -> Role:
        return Role(self.role)

    @property
    def revoked(self) -> bool:
        return self.revoked_at is not None

    @property
    def ends_at(self) -> datetime | None:
        """When the token stops working: its lifetime's end or, once rotated, the grace's."""
        ends = [t for t in (self.expires_at, self.grace_until) if t is not None]
        return min(ends) if ends else None

    def expired(self, now: datetime) -> bool:
        ends = self.ends_at
        return ends is not None and now >= ends

    def state(self, now: datetime) -> str:
        """active, rotated (in its grace period), expired or revoked."""
        if self.revoked:
            return "revoked"
        if self.expired_at is not None or self.expired(now):
            return "expired"
        return "rotated" if self.rotated_to else "active"

    def rotate(self, now: datetime, by: str | None, rotated_to: str, grace: timedelta) -> None:
        """The token was replaced by ``rotated_to``; it keeps working for ``grace``."""
        if self.revoked:
            raise Conflict(f"token {self.public_id} is revoked: mint a new one with "
                           "`better-compute tokens create`")
        if self.rotated_to:
            raise Conflict(f"token {self.public_id} was already rotated to {self.rotated_to}: "
                           f"rotate {self.rotated_to} instead")
        if self.expired(now):
            raise Conflict(f"token {self.public_id} expired at {iso(self.ends_at)}: an expired "
                           "token is not rotated; mint a new one with `better-compute tokens "
                           "create`")
        until = now + grace
        if self.expires_at is not None:
            until = min(until, self.expires_at)
        self._rotated(rotated_to=rotated_to, grace_until=until, at=now, by=by)

    @event("Rotated", topic="token.rotated")
    def _rotated(self, rotated_to: str, grace_until: datetime, at: datetime, by: str | None
                 ) -> None:
        self.rotated_to = rotated_to
        self.grace_until = grace_until

    def mark_expired(self, now: datetime) -> bool:
        """Record the end of a token past it (once; never a revoked one)."""
        ends = self.ends_at
        if self.revoked or self.expired_at is not None or ends is None or now < ends:
            return False
        self._expired(at=ends)
        return True

    @event("Expired", topic="token.expired")
    def _expired(self, at: datetime) -> None:
        self.expired_at = at

    def revoke(self, now: datetime, by: str | None) -> None:
        if self.revoked:
            raise Conflict(f"token {self.public_id} is already revoked")
        self._revoked(revoked_at=now, revoked_by=by)

    @event("Revoked", topic="token.revoked")
    def _revoked(self, revoked_at: datetime, revoked_by: str | None) -> None:
        self.revoked_at = revoked_at

    def to_doc(self, now: datetime | None = None) -> dict[str, Any]:
        """The public document; ``state`` as of ``now`` (None: as the events left it)."""
        return {
            "id": self.public_id,
            "tenantId": self.tenant_id,
            "role": self.role,
            "name": self.name,
            "state": self.state(now) if now is not None else self._recorded_state(),
            "createdAt": iso(self.created_on),
            "expiresAt": iso(self.ends_at),
            "ttl": self.ttl,
            "rotatedFrom": self.rotated_from,
            "rotatedTo": self.rotated_to,
            "graceUntil": iso(self.grace_until),
            "expiredAt": iso(self.expired_at),
            "revokedAt": iso(self.revoked_at),
        }

    def _recorded_state(self) -> str:
        if self.revoked:
            return "revoked"
        if self.expired_at is not None:
            return "expired"
        return "rotated" if self.rotated_to else "active"


def effective_token_state(doc: dict[str, Any], now: datetime) -> str:
    """The state of a listed token document at ``now`` (its end may have passed since)."""
    state = str(doc.get("state") or "active")
    ends = doc.get("expiresAt")
    if state in ("active", "rotated") and ends and \
            datetime.fromisoformat(str(ends).replace("Z", "+00:00")) <= now:
        return "expired"
    return state


MIN_TOKEN_TTL = timedelta(minutes=1)
MAX_GRACE = timedelta(days=7)


@dataclass(frozen=True)
class TokenLifetimes:
    """How long new tokens live (``ttl``: default and maximum) and how long a rotated one
    keeps working (``grace``); the server's settings (docs/operations.md)."""

    default_ttl: timedelta = timedelta(days=90)
    max_ttl: timedelta = timedelta(days=365)
    grace: timedelta = timedelta(hours=1)

    def check(self) -> None:
        if self.max_ttl < MIN_TOKEN_TTL:
            raise InvalidInput("the maximum token TTL must be at least 1m")
        if not MIN_TOKEN_TTL <= self.default_ttl <= self.max_ttl:
            raise InvalidInput(
                f"the default token TTL ({format_duration(self.default_ttl)}) must lie between "
                f"1m and the maximum ({format_duration(self.max_ttl)})")
        if not timedelta(0) <= self.grace <= MAX_GRACE:
            raise InvalidInput("the rotation grace must lie between 0s and 7d")

    def ttl(self, text: str | None) -> timedelta:
        """``--ttl`` (None: the default), within 1m and the maximum."""
        if text is None:
            return self.default_ttl
        ttl = parse_duration(text, flag="--ttl")
        if not MIN_TOKEN_TTL <= ttl <= self.max_ttl:
            raise InvalidInput(
                f"--ttl {text} is out of range: an API token lives from 1m to "
                f"{format_duration(self.max_ttl)} on this control plane (for example --ttl 90d); "
                "rotate it before it ends (`better-compute tokens rotate`)")
        return ttl

    def grace_of(self, text: str | None) -> timedelta:
        """``--grace`` (None: the default), within 0s and 7d."""
        if text is None:
            return self.grace
        grace = parse_duration(text, flag="--grace")
        if grace > MAX_GRACE:
            raise InvalidInput(f"--grace {text} is too long: the old token may keep working at "
                               "most 7d after a rotation (for example --grace 1h)")
        return grace
