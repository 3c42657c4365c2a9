"""tokens.*: minting, listing, revoking and rotating API tokens, and their expiry.

Lifetimes come from the server's settings (``TokenLifetimes``, read from the
environment by ``lifetimes_from_env``): the default and maximum TTL of a new
token and the grace period of a rotated one. ``expire_due`` is the tokens
controller's pass: it records ``token.expired`` for every token whose end
has passed (authentication already refuses them by the clock).
"""

from __future__ import annotations

import builtins
import secrets
import time
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from better_compute.api.settings import env_seconds
from better_compute.api.store.actor import CONTROLLER_TOKENS
from better_compute.domain.access import ROOT_TENANT, Principal, Role
from better_compute.domain.durations import format_duration
from better_compute.domain.errors import Conflict, InvalidInput, NotFound, QuotaExceeded
from better_compute.domain.ids import parse_id
from better_compute.domain.paging import page_size, position_after
from better_compute.domain.text import check_name
from better_compute.domain.token import (
    TOKEN_PREFIX,
    ApiToken,
    TokenLifetimes,
    effective_token_state,
    token_hash,
)
from better_compute.projections.listings import listing_seq_of, query_listing

if TYPE_CHECKING:
    from better_compute.api.services.compute import ComputeService
    from better_compute.domain.join_token import JoinToken

RESCAN_S = 30.0  # the controller looks for newly due tokens at least this often


def new_token_secret() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def lifetimes_from_env(env: Mapping[str, str]) -> TokenLifetimes:
    defaults = TokenLifetimes()

    def read(name: str, default: timedelta) -> timedelta:
        return timedelta(seconds=env_seconds(env, name, default.total_seconds()))

    lifetimes = TokenLifetimes(
        default_ttl=read("BETTER_COMPUTE_TOKEN_TTL", defaults.default_ttl),
        max_ttl=read("BETTER_COMPUTE_TOKEN_MAX_TTL", defaults.max_ttl),
        grace=read("BETTER_COMPUTE_TOKEN_ROTATION_GRACE", defaults.grace),
    )
    try:
        lifetimes.check()
    except InvalidInput as exc:
        raise InvalidInput(f"{exc.message}: check BETTER_COMPUTE_TOKEN_TTL, "
                           "BETTER_COMPUTE_TOKEN_MAX_TTL and "
                           "BETTER_COMPUTE_TOKEN_ROTATION_GRACE") from None
    return lifetimes


def revoke_token(service: ComputeService, principal: Principal, token: ApiToken | JoinToken,
                 what: str) -> dict[str, Any]:
    """Revoke an API or a join token as ``principal``, an admin of its tenant; its document.
    ``what``: the tokens, as the refusal names them ("tokens", "join tokens")."""
    principal.require_admin_of(token.tenant_id, f"revoke {what}")
    now = service.clock()
    token.revoke(now, principal.token_id)
    service.aggregates.save(token, actor=principal.actor)
    return token.to_doc(now)


class TokenService:
    def __init__(self, service: ComputeService) -> None:
        self.service = service

    def _visible(self, principal: Principal, token_id: str) -> ApiToken:
        token = self.service.aggregates.get(ApiToken, parse_id("tok", token_id))
        if token is None or not principal.can_see_tenant(token.tenant_id):
            raise NotFound(f"no token {token_id!r}: `better-compute tokens list` shows your "
                           "tenant's tokens")
        return token

    def create(self, principal: Principal, tenant_id: str | None, role: str,
               name: str | None, ttl: str | None = None) -> dict[str, Any]:
        service = self.service
        tenant = service.aggregates.scope(principal, tenant_id)
        principal.require_admin_of(tenant, "create tokens")
        role_enum = Role.parse(role)
        check_name(name)
        if role == "root-admin" and tenant != ROOT_TENANT:
            raise InvalidInput(
                f"root-admin exists only on the root tenant; for tenant {tenant} use --role admin"
            )
        lifetime = service.lifetimes.ttl(ttl)
        service.aggregates.tenant(tenant)
        now = service.clock()
        self._check_room(tenant, now)
        secret = new_token_secret()
        token = ApiToken(tenant_id=tenant, role=role_enum.value,
                         name=name or f"{role_enum.value} token", secret_hash=token_hash(secret),
                         created_by=principal.token_id, expires_at=now + lifetime,
                         ttl=format_duration(lifetime))
        service.aggregates.save(token, actor=principal.actor)
        return {**token.to_doc(now), "token": secret}

    def _check_room(self, tenant: str, now: datetime) -> None:
        """Refuse a new token of a tenant that has ``max_tokens_per_tenant`` live ones (read
        from the listing as the call finds it: racing creates may each pass it once)."""
        limit = self.service.limits.max_tokens_per_tenant
        if not limit or tenant == ROOT_TENANT:
            return
        live = self.service.aggregates.live_tokens(tenant, now)
        if live >= limit:
            raise QuotaExceeded(
                f"tenant {tenant} already has {live} live tokens (at most {limit}, "
                "tokens.max_per_tenant): revoke the ones no longer used with `better-compute "
                "tokens revoke TOKEN` (`tokens list` shows each one's last use), then retry",
                data={"per": "tokens", "tokens": live, "limit": limit})

    def list(self, principal: Principal, tenant_id: str | None, limit: int | None = None,
             after: str | None = None, all_tenants: bool = False
             ) -> builtins.list[dict[str, Any]]:
        """One page of a tenant's tokens (``all_tenants``: every tenant's), oldest first: at
        most ``limit`` (default and most ``MAX_PAGE``, domain/paging.py) created after the
        token ``after``; a shorter page is the last."""
        service = self.service
        tenant = service.aggregates.listed_tenant(principal, tenant_id, all_tenants, "tokens")
        principal.require_admin_of(tenant or principal.tenant_id, "list tokens")
        page = page_size(limit, "token")
        if after is not None:
            parse_id("tok", after)
        service.projections.catch_up("listings")
        after_seq = position_after(
            after, lambda tok: listing_seq_of(service.sql, "apitoken", tenant, tok), "token",
            tenant or "any")
        docs = query_listing(service.sql, "apitoken", tenant_id=tenant, after_seq=after_seq,
                             limit=page)
        used = service.token_use.last_used(d["id"] for d in docs)
        now = service.clock()
        for doc in docs:
            doc["state"] = effective_token_state(doc, now)
            doc["lastUsedAt"] = used.get(doc["id"])
        return docs

    def revoke(self, principal: Principal, token_id: str) -> dict[str, Any]:
        return revoke_token(self.service, principal, self._visible(principal, token_id), "tokens")

    def rotate(self, principal: Principal, token_id: str, grace: str | None,
               ttl: str | None) -> dict[str, Any]:
        """A new secret for the token's tenant, role and name; the old one keeps working for
        ``grace``. Admins of the tenant rotate any of its tokens; any token rotates itself."""
        service = self.service
        old = self._visible(principal, token_id)
        if principal.token_id != old.public_id:
            principal.require_admin_of(old.tenant_id, "rotate other tokens")
        lifetimes = service.lifetimes
        period = lifetimes.grace_of(grace)
        lifetime = lifetimes.ttl(ttl if ttl is not None else _kept_ttl(old, lifetimes))
        secret = new_token_secret()
        now = service.clock()
        new = ApiToken(tenant_id=old.tenant_id, role=old.role, name=old.name,
                       secret_hash=token_hash(secret), created_by=principal.token_id,
                       expires_at=now + lifetime, ttl=format_duration(lifetime),
                       rotated_from=old.public_id)
        old.rotate(now, principal.token_id, new.public_id, period)
        service.aggregates.save(old, new, actor=principal.actor)
        return {**new.to_doc(now), "token": secret, "previous": old.to_doc(now)}

    def expire_due(self, now: datetime | None = None, *, actor: str) -> builtins.list[str]:
        """Record ``token.expired`` for every token past its end (the tokens controller,
        ``actor``): those the listings still hold live whose end has passed, never the whole
        history."""
        service = self.service
        now = now or service.clock()
        done = []
        for uuid in service.aggregates.ended_tokens(now):
            token = service.aggregates.get(ApiToken, uuid)
            if token is not None and token.mark_expired(now):
                try:
                    service.aggregates.save(token, actor=actor)
                except Conflict:  # recorded by another process just now
                    continue
                done.append(token.public_id)
        return done


def _kept_ttl(token: ApiToken, lifetimes: TokenLifetimes) -> str | None:
    """A rotated token's successor lives as long as it did (when that is still allowed)."""
    if token.ttl is None:
        return None  # a token without a lifetime (``init``'s): the default
    text: str = token.ttl
    try:
        lifetimes.ttl(text)
    except InvalidInput:
        return None
    return text


class TokenExpiry:
    """The tokens controller: a pass records the ends that passed. It scans the listed
    tokens when the earliest end it knows of has come, and at least every RESCAN_S."""

    def __init__(self, tokens: TokenService) -> None:
        self.tokens = tokens
        self._next_scan = 0.0  # monotonic
        self._next_end: datetime | None = None

    def tick(self, now: datetime | None = None) -> builtins.list[str]:
        service = self.tokens.service
        now = now or service.clock()
        due = self._next_end is not None and now >= self._next_end
        if not due and time.monotonic() < self._next_scan:
            return []
        done = self.tokens.expire_due(now, actor=CONTROLLER_TOKENS)
        self._next_end = service.aggregates.next_token_end()
        self._next_scan = time.monotonic() + RESCAN_S
        return done
