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
from better_compute.domain.ids import NAMESPACE, named_uuid, new_uuid

PKI_ID = named_uuid("pki", "bundle")


class PkiBundle(TenantOwned):
    TOPIC = "bc.aggregate.pki"

    class Event(TenantOwned.Event):
        TOPIC = "bc.pki.event"

    @event("Created", topic="pki.created")
    def __init__(self, tenant_id: str, public: dict[str, str], sealed: str,
                 installation_id: str | None = None) -> None:
        self.tenant_id = tenant_id
        self.public = public
        self.sealed = sealed
        # The namespace of this installation's keyed ids (domain/ids.py); None in
        # bundles created before installations had one: they mint in NAMESPACE.
        self.installation_id = installation_id

    @staticmethod
    def create_id(**_: Any) -> UUID:
        return PKI_ID

    @classmethod
    def new(cls, public: dict[str, str], sealed: str) -> PkiBundle:
        """A new installation's bundle, with a random installation id."""
        return cls(tenant_id=ROOT_TENANT, public=public, sealed=sealed,
                   installation_id=str(new_uuid()))

    @property
    def id_namespace(self) -> UUID:
        installation = getattr(self, "installation_id", None)
        return UUID(installation) if installation else NAMESPACE

    @property
    def public_id(self) -> str:
        return "pki"

    def to_doc(self) -> dict[str, Any]:
        return {**self.public, "createdAt": iso(self.created_on)}
