"""joinTokens.* and the public nodes.join: how servers join pools."""

from __future__ import annotations

from typing import Any

from better_compute.api.http.methods import Call
from better_compute.api.http.schemas import ListScope, Params
from better_compute.api.services.join import JoinService
from better_compute.api.wire.join import JoinParams


class JoinTokensCreate(Params, kw_only=True):
    pool_id: str
    ttl: str  # a duration from 1m to 24h, such as 2h
    max_uses: int = 1
    expect_serial: str | None = None
    expect_mac: str | None = None
    expect_uuid: str | None = None
    key: str | None = None


class JoinTokensList(ListScope, kw_only=True):
    pool_id: str | None = None


class JoinTokenRef(Params, kw_only=True):
    join_token_id: str


def _joins(call: Call) -> JoinService:
    return call.services.join


def join_tokens_create(call: Call, p: JoinTokensCreate) -> dict[str, Any]:
    return _joins(call).create(call.principal, p.pool_id, p.ttl, p.max_uses, p.expect_serial,
                               p.expect_mac, p.expect_uuid, p.key)


def join_tokens_list(call: Call, p: JoinTokensList) -> list[dict[str, Any]]:
    return _joins(call).list(call.principal, p.tenant_id, p.pool_id, p.all_tenants)


def join_tokens_get(call: Call, p: JoinTokenRef) -> dict[str, Any]:
    return _joins(call).get(call.principal, p.join_token_id)


def join_tokens_revoke(call: Call, p: JoinTokenRef) -> dict[str, Any]:
    return _joins(call).revoke(call.principal, p.join_token_id)


def nodes_join(call: Call, p: JoinParams) -> dict[str, str]:
    return _joins(call).join(p.sealed)
