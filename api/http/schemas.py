"""Wire schemas of the JSON-RPC API: params by name, in camelCase.

One Struct per method. Unknown params are refused with their name, so a typo
never silently does something else. New optional fields get defaults.
"""

from __future__ import annotations

from typing import Any

import msgspec


class Params(msgspec.Struct, forbid_unknown_fields=True, rename="camel", kw_only=True):
    pass


class NoParams(Params, kw_only=True):
    pass


class TenantScope(Params, kw_only=True):
    tenant_id: str | None = None


class TenantsCreate(Params, kw_only=True):
    tenant_id: str
    name: str | None = None


class TenantsGet(Params, kw_only=True):
    tenant_id: str


class TokensCreate(Params, kw_only=True):
    role: str
    tenant_id: str | None = None
    name: str | None = None
    ttl: str | None = None  # e.g. 90d; default and maximum: the server's settings


class TokensRevoke(Params, kw_only=True):
    token_id: str  # the tok_ id names the tenant; no tenantId to contradict it


class TokensRotate(Params, kw_only=True):
    token_id: str
    grace: str | None = None  # how long the old secret keeps working (default: the server's)
    ttl: str | None = None  # the new token's lifetime (default: the old one's)


class SitesCreate(Params, kw_only=True):
    kind: str
    region: str
    name: str | None = None
    key: str | None = None


class SitesGet(Params, kw_only=True):
    site_id: str


class PoolsCreate(Params, kw_only=True):
    site_id: str
    node_class: str = msgspec.field(name="class")
    gpu_model: str
    policy: dict[str, Any]
    name: str | None = None
    key: str | None = None


class PoolsGet(Params, kw_only=True):
    pool_id: str


class PoolsList(Params, kw_only=True):
    site_id: str | None = None


class PoolsOffer(Params, kw_only=True):
    pool_id: str
    to_tenant_id: str
    quota: dict[str, Any]


class RpcRequest(msgspec.Struct):
    """``id`` is UNSET when the member is absent: a notification, which gets no answer."""

    method: str
    jsonrpc: str = "2.0"
    params: msgspec.Raw = msgspec.Raw(b"{}")
    id: int | str | msgspec.UnsetType | None = msgspec.UNSET


class RpcError(msgspec.Struct, omit_defaults=True):
    code: int
    message: str
    data: dict[str, Any] = {}


class RpcResponse(msgspec.Struct):
    """JSON-RPC 2.0 requires ``jsonrpc`` and ``id`` (null when unknown) in every answer;
    exactly one of ``result`` and ``error`` is present (UNSET fields are never encoded)."""

    jsonrpc: str = "2.0"
    id: int | str | None = None
    result: Any = msgspec.UNSET
    error: RpcError | msgspec.UnsetType = msgspec.UNSET
