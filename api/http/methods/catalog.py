"""tenants.*, tokens.*, sites.*, pools.*: the catalog of the control plane."""

from __future__ import annotations

from typing import Any

import msgspec

from better_compute.api.http.methods import Call
from better_compute.api.http.schemas import ListScope, NoParams, Params


class TenantsCreate(Params, kw_only=True):
    tenant_id: str
    name: str | None = None


def tenants_create(call: Call, p: TenantsCreate) -> dict[str, Any]:
    return call.service.tenants_create(call.principal, p.tenant_id, p.name)


class TenantsGet(Params, kw_only=True):
    tenant_id: str


def tenants_get(call: Call, p: TenantsGet) -> dict[str, Any]:
    return call.service.tenants_get(call.principal, p.tenant_id)


def tenants_list(call: Call, _: NoParams) -> list[dict[str, Any]]:
    return call.service.tenants_list(call.principal)


class TokensCreate(Params, kw_only=True):
    role: str
    tenant_id: str | None = None
    name: str | None = None
    ttl: str | None = None  # e.g. 90d; default and maximum: the server's settings


def tokens_create(call: Call, p: TokensCreate) -> dict[str, Any]:
    return call.service.tokens_create(call.principal, p.tenant_id, p.role, p.name, p.ttl)


class TokensList(ListScope, kw_only=True):
    limit: int | None = None  # at most this many (1 to 1,000, the default)
    after: str | None = None  # only those created after this token (the next page)


def tokens_list(call: Call, p: TokensList) -> list[dict[str, Any]]:
    return call.service.tokens.list(call.principal, p.tenant_id, p.limit, p.after,
                                    p.all_tenants)


class TokensRevoke(Params, kw_only=True):
    token_id: str  # the tok_ id names the tenant; no tenantId to contradict it


def tokens_revoke(call: Call, p: TokensRevoke) -> dict[str, Any]:
    return call.service.tokens_revoke(call.principal, p.token_id)


class SitesCreate(Params, kw_only=True):
    kind: str
    region: str
    name: str | None = None
    key: str | None = None


def sites_create(call: Call, p: SitesCreate) -> dict[str, Any]:
    return call.service.sites_create(call.principal, p.kind, p.region, p.name, p.key)


class SitesGet(Params, kw_only=True):
    site_id: str


def sites_get(call: Call, p: SitesGet) -> dict[str, Any]:
    return call.service.sites_get(call.principal, p.site_id)


class SitesList(Params, kw_only=True):
    all_tenants: bool = False  # say that every tenant's are meant (root sees them all anyway)


def sites_list(call: Call, p: SitesList) -> list[dict[str, Any]]:
    return call.service.sites_list(call.principal, p.all_tenants)


class PoolsCreate(Params, kw_only=True):
    site_id: str
    node_class: str = msgspec.field(name="class")
    gpu_model: str
    policy: dict[str, Any]
    name: str | None = None
    key: str | None = None


def pools_create(call: Call, p: PoolsCreate) -> dict[str, Any]:
    return call.service.pools_create(
        call.principal, p.site_id, p.node_class, p.gpu_model, p.policy, p.name, p.key
    )


class PoolsGet(Params, kw_only=True):
    pool_id: str


def pools_get(call: Call, p: PoolsGet) -> dict[str, Any]:
    return call.service.pools_get(call.principal, p.pool_id)


class PoolsList(Params, kw_only=True):
    site_id: str | None = None
    all_tenants: bool = False  # say that every tenant's are meant (root sees them all anyway)


def pools_list(call: Call, p: PoolsList) -> list[dict[str, Any]]:
    return call.service.pools_list(call.principal, p.site_id, p.all_tenants)


class PoolsOffer(Params, kw_only=True):
    pool_id: str
    to_tenant_id: str
    quota: dict[str, Any]


def pools_offer(call: Call, p: PoolsOffer) -> dict[str, Any]:
    return call.service.pools_offer(call.principal, p.pool_id, p.to_tenant_id, p.quota)


class TokensRotate(Params, kw_only=True):
    token_id: str
    grace: str | None = None  # how long the old secret keeps working (default: the server's)
    ttl: str | None = None  # the new token's lifetime (default: the old one's)


def tokens_rotate(call: Call, p: TokensRotate) -> dict[str, Any]:
    return call.services.tokens.rotate(call.principal, p.token_id, p.grace, p.ttl)
