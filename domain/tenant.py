"""Tenants: the customers (and the root tenant, the platform operator)."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from eventsourcing.domain import event

from better_compute.domain.base import TenantOwned, iso
from better_compute.domain.ids import named_uuid


class Tenant(TenantOwned):
    TOPIC = "bc.aggregate.tenant"

    class Event(TenantOwned.Event):
        TOPIC = "bc.tenant.event"

    @event("Created", topic="tenant.created")
    def __init__(self, tenant_id: str, name: str, created_by: str | None) -> None:
        self.tenant_id = tenant_id
        self.name = name
        self.created_by = created_by

    @staticmethod
    def create_id(tenant_id: str, **_: Any) -> UUID:
        return tenant_uuid(tenant_id)

    @property
    def public_id(self) -> str:
        return self.tenant_id

    def to_doc(self) -> dict[str, Any]:
        return {"id": self.tenant_id, "name": self.name, "createdAt": iso(self.created_on)}


def tenant_uuid(tenant_id: str) -> UUID:
    return named_uuid("tenant", tenant_id)


