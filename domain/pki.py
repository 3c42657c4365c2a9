"""The PKI bundle as an aggregate: public parts in the clear, private keys sealed.

Sealing and unsealing (AES-GCM under the operator's master key) happen in
api/pki.py; the domain only records what was sealed.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from eventsourcing.domain import event

from better_compute.domain.access import ROOT_TENANT
from better_compute.domain.base import TenantOwned, iso
from better_compute.domain.ids import named_uuid

PKI_ID = named_uuid("pki", "bundle")


class PkiBundle(TenantOwned):
    TOPIC = "bc.aggregate.pki"

    class Event(TenantOwned.Event):
        TOPIC = "bc.pki.event"

    @event("Created", topic="pki.created")
    def __init__(self, tenant_id: str, public: dict[str, str], sealed: str) -> None:
        self.tenant_id = tenant_id
        self.public = public
        self.sealed = sealed

    @staticmethod
    def create_id(**_: Any) -> UUID:
        return PKI_ID

    @classmethod
    def new(cls, public: dict[str, str], sealed: str) -> PkiBundle:
        return cls(tenant_id=ROOT_TENANT, public=public, sealed=sealed)

    @property
    def public_id(self) -> str:
        return "pki"

    def to_doc(self) -> dict[str, Any]:
        return {**self.public, "createdAt": iso(self.created_on)}
