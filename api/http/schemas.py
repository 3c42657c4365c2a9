"""Wire schemas of the JSON-RPC API: the request and response envelopes, and the params base.

Each method's params Struct (a ``Params``) lives next to the method, in api/http/methods/.
Params are by name, in camelCase; unknown params are refused with their name, so a typo
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


class ListScope(TenantScope, kw_only=True):
    """A list method's scope: one tenant's objects (``tenantId``, default the caller's), or
    every tenant's (``allTenants``: root-tenant callers only)."""

    all_tenants: bool = False


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
