"""tenants.*, tokens.*, sites.*, pools.*: the catalog of the control plane."""

from __future__ import annotations

from typing import Any

from better_compute.api.http import schemas as s
from better_compute.api.http.rpc import Call, method


@method("tenants.create", s.TenantsCreate, "Create a tenant (root administrators).")
def tenants_create(call: Call, p: s.TenantsCreate) -> dict[str, Any]:
    return call.service.tenants_create(call.principal, p.tenant_id, p.name)


@method("tenants.get", s.TenantsGet, "One tenant.")
def tenants_get(call: Call, p: s.TenantsGet) -> dict[str, Any]:
    return call.service.tenants_get(call.principal, p.tenant_id)


@method("tenants.list", s.NoParams, "Tenants the caller sees (the root tenant sees all).")
def tenants_list(call: Call, _: s.NoParams) -> list[dict[str, Any]]:
    return call.service.tenants_list(call.principal)


@method("tokens.create", s.TokensCreate,
        "Mint an API token for a tenant with a role (admin, member, read-only) and a TTL; "
        "shown once.")
def tokens_create(call: Call, p: s.TokensCreate) -> dict[str, Any]:
    return call.service.tokens_create(call.principal, p.tenant_id, p.role, p.name, p.ttl)


@method("tokens.list", s.TenantScope,
        "A tenant's tokens (never their secrets), with their state, end and last use.")
def tokens_list(call: Call, p: s.TenantScope) -> list[dict[str, Any]]:
    return call.service.tokens_list(call.principal, p.tenant_id)


@method("tokens.revoke", s.TokensRevoke, "Revoke a token; it stops working at once.")
def tokens_revoke(call: Call, p: s.TokensRevoke) -> dict[str, Any]:
    return call.service.tokens_revoke(call.principal, p.token_id)


@method("sites.create", s.SitesCreate,
        "Create a platform site, shared or dedicated (root tenant); key makes it retry-safe.")
def sites_create(call: Call, p: s.SitesCreate) -> dict[str, Any]:
    return call.service.sites_create(call.principal, p.kind, p.region, p.name, p.key)


@method("sites.get", s.SitesGet, "One site.")
def sites_get(call: Call, p: s.SitesGet) -> dict[str, Any]:
    return call.service.sites_get(call.principal, p.site_id)


@method("sites.list", s.NoParams, "Sites the caller sees.")
def sites_list(call: Call, _: s.NoParams) -> list[dict[str, Any]]:
    return call.service.sites_list(call.principal)


@method("pools.create", s.PoolsCreate,
        "Create a pool of one GPU model with a policy on a site; key makes it retry-safe.")
def pools_create(call: Call, p: s.PoolsCreate) -> dict[str, Any]:
    return call.service.pools_create(
        call.principal, p.site_id, p.node_class, p.gpu_model, p.policy, p.name, p.key
    )


@method("pools.get", s.PoolsGet, "One pool with its policy and offerings.")
def pools_get(call: Call, p: s.PoolsGet) -> dict[str, Any]:
    return call.service.pools_get(call.principal, p.pool_id)


@method("pools.list", s.PoolsList, "Pools the caller owns or is offered.")
def pools_list(call: Call, p: s.PoolsList) -> list[dict[str, Any]]:
    return call.service.pools_list(call.principal, p.site_id)


@method("pools.offer", s.PoolsOffer,
        "Offer a pool to a tenant with a quota (the resource is gpu), or change the quota.")
def pools_offer(call: Call, p: s.PoolsOffer) -> dict[str, Any]:
    return call.service.pools_offer(call.principal, p.pool_id, p.to_tenant_id, p.quota)


@method("tokens.rotate", s.TokensRotate,
        "A new secret for a token (same tenant, role and name; a new id); the old one keeps "
        "working for the grace period. Admins rotate their tenant's tokens; a token itself.")
def tokens_rotate(call: Call, p: s.TokensRotate) -> dict[str, Any]:

    return call.services.tokens.rotate(call.principal, p.token_id, p.grace, p.ttl)
