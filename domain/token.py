"""API tokens: ``biam_…`` secrets shown once, stored only as a hash.

The aggregate's id is derived from the secret's hash, so authenticating a
request is one aggregate read and no table of secrets exists anywhere.
"""

from __future__ import annotations

import hashlib
from datetime import datetime
from typing import Any
from uuid import UUID

from eventsourcing.domain import event

from better_compute.domain.access import Role
from better_compute.domain.base import TenantOwned, iso
from better_compute.domain.errors import Conflict
from better_compute.domain.ids import named_uuid

TOKEN_PREFIX = "biam_"


def token_hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def token_uuid(secret_hash: str) -> UUID:
    return named_uuid("token", secret_hash)


class ApiToken(TenantOwned):
    PREFIX = "tok"
    TOPIC = "bc.aggregate.token"

    class Event(TenantOwned.Event):
        TOPIC = "bc.token.event"

    @event("Created", topic="token.created")
    def __init__(
        self, tenant_id: str, role: str, name: str, secret_hash: str, created_by: str | None
    ) -> None:
        self.tenant_id = tenant_id
        self.role = role
        self.name = name
        self.secret_hash = secret_hash
        self.created_by = created_by
        self.revoked_at: datetime | None = None

    @staticmethod
    def create_id(secret_hash: str, **_: Any) -> UUID:
        return token_uuid(secret_hash)

    @property
    def role_enum(self) -> Role:
        return Role(self.role)

    @property
    def revoked(self) -> bool:
        return self.revoked_at is not None

    def revoke(self, now: datetime, by: str | None) -> None:
        if self.revoked:
            raise Conflict(f"token {self.public_id} is already revoked")
        self._revoked(revoked_at=now, revoked_by=by)

    @event("Revoked", topic="token.revoked")
    def _revoked(self, revoked_at: datetime, revoked_by: str | None) -> None:
        self.revoked_at = revoked_at

    def to_doc(self) -> dict[str, Any]:
        return {
            "id": self.public_id,
            "tenantId": self.tenant_id,
            "role": self.role,
            "name": self.name,
            "createdAt": iso(self.created_on),
            "revokedAt": iso(self.revoked_at),
        }
