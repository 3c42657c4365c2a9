"""Sites: where machines live. Platform sites are shared or dedicated."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from eventsourcing.domain import event

from better_compute.domain.access import Principal
from better_compute.domain.base import TenantOwned, iso
from better_compute.domain.errors import InvalidInput, PermissionDenied
from better_compute.domain.ids import keyed_uuid, new_uuid
from better_compute.domain.text import MAX_REGION, check_name, check_text

SITE_KINDS = ("shared", "dedicated")


def check_new_site(principal: Principal, kind: str, region: str, name: str | None) -> None:
    """A site's kind and region, and who may create platform sites (the root tenant's admins)."""
    if kind not in SITE_KINDS:
        raise InvalidInput(f"--kind {kind!r} is not a site kind: use shared or dedicated")
    if not principal.is_root:
        raise PermissionDenied(
            "only the root tenant creates platform sites (shared or dedicated); "
            f"this token belongs to tenant {principal.tenant_id}"
        )
    principal.require_root_admin("create sites")
    check_text(region, "--region", MAX_REGION, example="eu-1")
    check_name(name)
    if not region or not region.replace("-", "").replace("_", "").isalnum():
        raise InvalidInput(
            f"--region {region!r} is not a region name: use letters, digits and dashes "
            "(for example eu-1)"
        )


class Site(TenantOwned):
    PREFIX = "site"
    TOPIC = "bc.aggregate.site"

    class Event(TenantOwned.Event):
        TOPIC = "bc.site.event"

    @event("Created", topic="site.created")
    def __init__(
        self, tenant_id: str, kind: str, region: str, name: str, key: str | None,
        fingerprint: str | None,
    ) -> None:
        self.tenant_id = tenant_id
        self.kind = kind
        self.region = region
        self.name = name
        self.key = key
        self.fingerprint = fingerprint

    @staticmethod
    def create_id(tenant_id: str, key: str | None, **_: Any) -> UUID:
        return keyed_uuid(tenant_id, "site", key) if key else new_uuid()

    @classmethod
    def with_id(cls, id: UUID, **fields: Any) -> Site:
        """A new site with the given aggregate id (the service's, in the installation's
        namespace, domain/ids.py) instead of ``create_id``'s."""
        return cls._create(cls.Created, id=id, **fields)

    def to_doc(self) -> dict[str, Any]:
        return {
            "id": self.public_id,
            "tenantId": self.tenant_id,
            "kind": self.kind,
            "region": self.region,
            "name": self.name,
            "key": self.key,
            "createdAt": iso(self.created_on),
        }
