"""Roles and the caller of a command.

Roles, from most to least powerful: ``admin`` (on the root tenant this is the
root administrator, the platform operator), ``member`` (creates and uses
reservations), ``read-only`` (reads). Every command checks the caller's tenant:
a tenant never sees or changes another tenant's objects.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from better_compute.domain.errors import InvalidInput, PermissionDenied

ROOT_TENANT = "root"
LOCAL = "local"  # the actor of the in-process CLI without a token, and of `init`


class Role(StrEnum):
    ADMIN = "admin"
    MEMBER = "member"
    READ_ONLY = "read-only"

    @classmethod
    def parse(cls, text: str) -> Role:
        aliases = {"tenant-admin": "admin", "root-admin": "admin", "readonly": "read-only",
                   "read_only": "read-only", "viewer": "read-only"}
        try:
            return cls(aliases.get(text, text))
        except ValueError:
            raise InvalidInput(
                f"unknown role {text!r}: use one of admin, member, read-only "
                "(admin on the root tenant is a root administrator)"
            ) from None

    @property
    def rank(self) -> int:
        return {Role.ADMIN: 3, Role.MEMBER: 2, Role.READ_ONLY: 1}[self]


@dataclass(frozen=True)
class Principal:
    """Who is calling: a token's tenant and role (or the local operator)."""

    tenant_id: str
    role: Role
    token_id: str | None = None
    expires_at: datetime | None = None  # when the token stops working (None: never)

    @property
    def actor(self) -> str:
        """Who the events of this caller's commands name (docs/events.md, "actor")."""
        return self.token_id or LOCAL

    @property
    def is_root_admin(self) -> bool:
        return self.tenant_id == ROOT_TENANT and self.role is Role.ADMIN

    @property
    def is_root(self) -> bool:
        return self.tenant_id == ROOT_TENANT

    def can_see_tenant(self, tenant_id: str) -> bool:
        return self.is_root or self.tenant_id == tenant_id

    def require_role(self, role: Role, action: str) -> None:
        if self.role.rank < role.rank:
            raise PermissionDenied(
                f"{action} needs the {role.value} role; this token has {self.role.value} "
                f"on tenant {self.tenant_id}: ask an admin of the tenant for a token with that role"
            )

    def require_root_admin(self, action: str) -> None:
        if not self.is_root_admin:
            raise PermissionDenied(
                f"only a root administrator can {action}; this token is {self.role.value} "
                f"on tenant {self.tenant_id}"
            )

    def require_admin_of(self, tenant_id: str, action: str) -> None:
        self._require_of(tenant_id, Role.ADMIN, action, hint="")

    def require_member_of(self, tenant_id: str, action: str) -> None:
        """Members and admins of the tenant, or a root administrator for any tenant.

        Root-tenant tokens READ every tenant's reservations, but only a root
        administrator changes another tenant's: a root member or read-only token
        is refused, like any other tenant's.
        """
        self._require_of(tenant_id, Role.MEMBER, action,
                         hint=f": use a token of tenant {tenant_id} (member or admin)")

    def _require_of(self, tenant_id: str, role: Role, action: str, hint: str) -> None:
        if self.is_root_admin:
            return
        if self.tenant_id != tenant_id:
            raise PermissionDenied(
                f"this token belongs to tenant {self.tenant_id} and cannot {action} for tenant "
                f"{tenant_id}{hint}"
            )
        self.require_role(role, action)

    def require_can_act_on(self, tenant_id: str) -> None:
        """A call acts on the caller's own tenant, or any tenant for a root-tenant caller."""
        if not self.can_see_tenant(tenant_id):
            raise PermissionDenied(
                f"this token belongs to tenant {self.tenant_id} and cannot act on tenant "
                f"{tenant_id} (named by --tenant, tenantId or BETTER_COMPUTE_TENANT): use a token "
                f"of tenant {tenant_id}, or set BETTER_COMPUTE_TENANT={self.tenant_id}"
            )


LOCAL_OPERATOR = Principal(tenant_id=ROOT_TENANT, role=Role.ADMIN, token_id=None)
