"""The control plane's own commands: bootstrap (init, the PKI, ids), authentication, the catalog.

Tenants, sites, pools and the PKI bundle; tokens are api/services/tokens.py's. Each command
checks the caller, reads clocks and ids, calls aggregate methods and ends with ONE ``save`` of
every aggregate it touched (atomic), through the shared ``Aggregates`` (api/services/unit.py).
Queries read aggregates directly (``get``) or the listings projection (``listing``), which is
caught up first, so a caller always reads its own writes. The other services (nodes, join,
reservations) are built beside this one by the composition root (api/runtime.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from uuid import UUID

from eventsourcing.application import AggregateNotFoundError
from eventsourcing.persistence import IntegrityError

from better_compute.api.services.limits import ServiceLimits
from better_compute.api.services.tokens import TokenService, new_token_secret
from better_compute.api.services.unit import Aggregates, Clock, utc_now
from better_compute.api.store.actor import LOCAL
from better_compute.api.store.token_use import TokenUse
from better_compute.domain.access import ROOT_TENANT, Principal, Role
from better_compute.domain.base import fingerprint, iso
from better_compute.domain.errors import (
    Conflict,
    NotFound,
    NotInitialized,
    PermissionDenied,
    Unauthenticated,
)
from better_compute.domain.gpus import parse_gpu_model
from better_compute.domain.ids import NAMESPACE, check_key, check_tenant_id, keyed_or_new, parse_id
from better_compute.domain.pki import PKI_ID, PkiBundle
from better_compute.domain.policy import parse_policy, policy_to_dict
from better_compute.domain.pool import Pool, check_node_class, create_params, parse_quota
from better_compute.domain.site import Site, check_new_site
from better_compute.domain.tenant import Tenant, tenant_uuid
from better_compute.domain.text import check_name
from better_compute.domain.token import (
    TOKEN_PREFIX,
    ApiToken,
    TokenLifetimes,
    token_hash,
    token_uuid,
)

__all__ = ["ComputeService", "utc_now"]


class ComputeService:
    def __init__(self, aggregates: Aggregates, *, token_use: TokenUse,
                 lifetimes: TokenLifetimes | None = None,
                 master_key_text: Callable[[], str] | None = None,
                 gateway_url: str | None = None,
                 limits: ServiceLimits | None = None) -> None:
        self.aggregates = aggregates
        self.store = aggregates.store
        self.projections = aggregates.projections
        self.sql = aggregates.sql
        # Reads the operator's master key; commands that sign need it.
        self.master_key_text = master_key_text
        # The agents' gateway as `serve` publishes it (None in the CLI's in-process mode).
        self.gateway_url = gateway_url
        self.lifetimes = lifetimes or TokenLifetimes()  # the server's (api/services/tokens.py)
        self.limits = limits or ServiceLimits()  # what one tenant may hold (0: no bound)
        self.token_use = token_use
        self.tokens = TokenService(self)
        self._id_namespace: UUID | None = None

    @property
    def clock(self) -> Clock:
        return self.aggregates.clock

    @clock.setter
    def clock(self, clock: Clock) -> None:  # tests move time
        self.aggregates.clock = clock

    def listing(self, kind: str, **filters: Any) -> list[dict[str, Any]]:
        return self.aggregates.listing(kind, **filters)

    # ------------------------------------------------------------ bootstrap

    def is_initialized(self) -> bool:
        return self.aggregates.get(PkiBundle, PKI_ID) is not None

    def new_id(self, tenant_id: str, kind: str, key: str | None) -> UUID:
        """A create's aggregate id: from its idempotency key in this installation's
        namespace (domain/ids.py), or random without a key."""
        return keyed_or_new(tenant_id, kind, key, self.id_namespace() if key else NAMESPACE)

    def id_namespace(self) -> UUID:
        """This installation's namespace for keyed ids (read once: it never changes)."""
        if self._id_namespace is None:
            self._id_namespace = self.pki().id_namespace
        return self._id_namespace

    def pki(self) -> PkiBundle:
        bundle = self.aggregates.get(PkiBundle, PKI_ID)
        if bundle is None:
            raise NotInitialized(
                "this store has no PKI bundle and no root tenant yet: run `better-compute init`"
            )
        return bundle

    def initialize(self, public: dict[str, str], sealed: str) -> str:
        """Create the PKI bundle, the root tenant and its first admin token, atomically
        (``better-compute init``: the local operator is its actor)."""
        if self.is_initialized():
            raise Conflict(
                "this store is already initialized: `better-compute init` runs once per store; "
                "use the root token it printed, or mint another with `tokens create`"
            )
        secret = new_token_secret()
        bundle = PkiBundle.new(public=public, sealed=sealed)
        root = Tenant(tenant_id=ROOT_TENANT, name="Platform operator", created_by=None)
        token = ApiToken(tenant_id=ROOT_TENANT, role=Role.ADMIN.value, name="root administrator",
                         secret_hash=token_hash(secret), created_by=None)
        try:
            self.store.save(bundle, root, token, actor=LOCAL)
        except IntegrityError:
            raise Conflict("this store was initialized by another process just now") from None
        return secret

    def authenticate(self, secret: str | None) -> Principal:
        if not secret:
            raise Unauthenticated(
                "no API token: set BETTER_COMPUTE_TOKEN to a biam_… token "
                "(`better-compute init` printed the root administrator's)"
            )
        if not secret.startswith(TOKEN_PREFIX):
            raise Unauthenticated("the API token is malformed: API tokens start with biam_")
        token = self._token(token_uuid(token_hash(secret)))
        if token is None or token.revoked:
            raise Unauthenticated(
                "the API token is unknown or revoked: ask an admin of your tenant for a new one"
            )
        now = self.clock()
        if token.expired(now):  # refused like a revoked token, by the clock (api/services/tokens.py)
            raise Unauthenticated(
                f"the API token {token.public_id} expired at {iso(token.ends_at)}: ask an admin "
                "of your tenant for a new one; rotate tokens before they end "
                "(`better-compute tokens rotate`)"
            )
        self.token_use.seen(token.public_id, now)  # memory only; flushed in batches
        return Principal(tenant_id=token.tenant_id, role=token.role_enum,
                         token_id=token.public_id, expires_at=token.ends_at)

    def _token(self, uuid: UUID) -> ApiToken | None:
        """A token as stored now, on every request (so a revocation anywhere counts at
        once): from the aggregate cache, which reads only the events after the version it
        keeps (usually none: nothing decoded); the first time in this process, from its
        events alone (tokens are never snapshotted)."""
        try:
            token = self.store.load(uuid, snapshots=False)
        except AggregateNotFoundError:
            return None
        return token if isinstance(token, ApiToken) else None

    # ------------------------------------------------------------------ system

    def whoami(self, principal: Principal) -> dict[str, Any]:
        return {
            "tenantId": principal.tenant_id,
            "role": principal.role.value,
            "rootAdministrator": principal.is_root_admin,
            "tokenId": principal.token_id,
        }

    # ----------------------------------------------------------------- tenants

    def tenants_create(self, principal: Principal, tenant_id: str, name: str | None) -> dict[str, Any]:
        principal.require_root_admin("create tenants")
        check_tenant_id(tenant_id)
        check_name(name)
        name = name or tenant_id
        existing = self.aggregates.get(Tenant, tenant_uuid(tenant_id))
        if existing is None:
            tenant = Tenant(tenant_id=tenant_id, name=name, created_by=principal.token_id)
            try:
                self.store.save(tenant, actor=principal.actor)
                return tenant.to_doc()
            except IntegrityError:  # created by a concurrent request just now: as a retry
                existing = self.aggregates.get(Tenant, tenant_uuid(tenant_id))
                if existing is None:
                    raise
        if existing.name == name:
            return existing.to_doc()
        raise Conflict(f"tenant {tenant_id!r} already exists with the name {existing.name!r}")

    def tenants_get(self, principal: Principal, tenant_id: str) -> dict[str, Any]:
        check_tenant_id(tenant_id)
        if not principal.can_see_tenant(tenant_id):
            raise NotFound(f"no tenant {tenant_id!r}")
        return self.aggregates.tenant(tenant_id).to_doc()

    def tenants_list(self, principal: Principal) -> list[dict[str, Any]]:
        if principal.is_root:
            return self.listing("tenant")
        return self.listing("tenant", tenant_id=principal.tenant_id)

    # ------------------------------------------------------------------ tokens

    # (api/services/tokens.py: lifetimes, rotation, expiry, last use)

    def tokens_create(self, principal: Principal, tenant_id: str | None, role: str,
                      name: str | None, ttl: str | None = None) -> dict[str, Any]:
        return self.tokens.create(principal, tenant_id, role, name, ttl)

    def tokens_list(self, principal: Principal, tenant_id: str | None, limit: int | None = None,
                    after: str | None = None) -> list[dict[str, Any]]:
        return self.tokens.list(principal, tenant_id, limit, after)

    def tokens_revoke(self, principal: Principal, token_id: str) -> dict[str, Any]:
        return self.tokens.revoke(principal, token_id)

    # ------------------------------------------------------------------- sites

    def sites_create(
        self, principal: Principal, kind: str, region: str, name: str | None, key: str | None
    ) -> dict[str, Any]:
        check_new_site(principal, kind, region, name)
        if key:
            check_key(key)
        tenant = principal.tenant_id
        params = {"kind": kind, "region": region, "name": name or ""}
        uuid = self.new_id(tenant, "site", key)
        site = self.aggregates.create_once(
            Site,
            lambda: Site.with_id(uuid, tenant_id=tenant, kind=kind, region=region, name=name or "", key=key,
                         fingerprint=fingerprint(params)),
            key=key, fp=fingerprint(params), what="site", actor=principal.actor,
        )
        return site.to_doc()

    def _site(self, principal: Principal, site_id: str) -> Site:
        site = self.aggregates.get(Site, parse_id("site", site_id))
        if site is None or not self._site_visible(principal, site):
            raise NotFound(f"no site {site_id!r}: `better-compute sites list` shows the sites you see")
        return site

    def _site_visible(self, principal: Principal, site: Site) -> bool:
        if principal.can_see_tenant(site.tenant_id):
            return True
        pools = self.listing("pool", visible_to=principal.tenant_id)
        return any(p["siteId"] == site.public_id for p in pools)

    def sites_get(self, principal: Principal, site_id: str) -> dict[str, Any]:
        return self._site(principal, site_id).to_doc()

    def sites_list(self, principal: Principal, all_tenants: bool = False
                   ) -> list[dict[str, Any]]:
        if all_tenants:
            self.aggregates.listed_tenant(principal, None, True, "sites")
        if principal.is_root:
            return self.listing("site")
        own = self.listing("site", tenant_id=principal.tenant_id)
        hosting = {p["siteId"] for p in self.listing("pool", visible_to=principal.tenant_id)}
        shared = [s for s in self.listing("site") if s["id"] in hosting and s not in own]
        return own + shared

    # ------------------------------------------------------------------- pools

    def pools_create(
        self, principal: Principal, site_id: str, node_class: str, gpu_model: str,
        policy: dict[str, Any], name: str | None, key: str | None,
    ) -> dict[str, Any]:
        site = self._site(principal, site_id)
        principal.require_admin_of(site.tenant_id, "create pools")
        if site.tenant_id != principal.tenant_id:
            raise PermissionDenied(f"site {site_id} belongs to tenant {site.tenant_id}")
        check_node_class(node_class)
        check_name(name)
        family = parse_gpu_model(gpu_model)
        checked = policy_to_dict(parse_policy(policy, source="the pool policy"))
        if key:
            check_key(key)
        fp = fingerprint(create_params(site.public_id, node_class, family, checked, name or ""))
        uuid = self.new_id(principal.tenant_id, "pool", key)
        pool = self.aggregates.create_once(
            Pool,
            lambda: Pool.with_id(uuid, tenant_id=principal.tenant_id, site_id=site.public_id,
                         node_class=node_class, gpu_model=family, policy=checked,
                         name=name or "", key=key, fingerprint=fp),
            key=key, fp=fp, what="pool", actor=principal.actor,
        )
        return pool.to_doc()

    def pool(self, principal: Principal, pool_id: str) -> Pool:
        pool = self.aggregates.get(Pool, parse_id("pool", pool_id))
        if pool is None or not (principal.is_root or pool.visible_to(principal.tenant_id)):
            raise NotFound(f"no pool {pool_id!r}: `better-compute pools list` shows the pools you see")
        return pool

    def pools_get(self, principal: Principal, pool_id: str) -> dict[str, Any]:
        pool = self.pool(principal, pool_id)
        return pool.to_doc(viewer=None if principal.is_root else principal.tenant_id)

    def pools_list(self, principal: Principal, site_id: str | None, all_tenants: bool = False
                   ) -> list[dict[str, Any]]:
        if all_tenants:
            self.aggregates.listed_tenant(principal, None, True, "pools")
        if site_id:
            parse_id("site", site_id)  # a malformed --site is an error, not an empty list
        where = {"siteId": site_id} if site_id else None
        if principal.is_root:
            return self.listing("pool", where=where)
        docs = self.listing("pool", visible_to=principal.tenant_id, where=where)
        for doc in docs:
            if doc["tenantId"] != principal.tenant_id:
                doc["offerings"] = [o for o in doc["offerings"] if o["tenantId"] == principal.tenant_id]
        return docs

    def pools_offer(
        self, principal: Principal, pool_id: str, to_tenant: str, quota: dict[str, Any]
    ) -> dict[str, Any]:
        pool = self.pool(principal, pool_id)
        principal.require_admin_of(pool.tenant_id, "offer pools")
        if pool.tenant_id != principal.tenant_id and not principal.is_root_admin:
            raise PermissionDenied(f"pool {pool_id} belongs to tenant {pool.tenant_id}")
        checked = parse_quota(quota)
        self.aggregates.tenant(to_tenant)
        if pool.offer(to_tenant, checked):
            self.aggregates.save(pool, actor=principal.actor)
        return pool.to_doc()

    # --------------------------------------------------------------------- pki

    def pki_show(self, principal: Principal) -> dict[str, Any]:
        return self.pki().to_doc()


