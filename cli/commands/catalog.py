"""tenants, tokens, sites and pools."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from better_compute.cli.context import Context
from better_compute.cli.files import check_new_file, write_new_secret
from better_compute.cli.registry import add_all_tenants, add_group, add_verb
from better_compute.cli.tables import POOLS, SITES, TOKENS
from better_compute.domain.errors import InvalidInput


def tenants_create(ctx: Context, a: argparse.Namespace) -> None:
    ctx.emit(ctx.call("tenants.create", tenantId=a.id, name=a.name))


def tenants_get(ctx: Context, a: argparse.Namespace) -> None:
    ctx.emit(ctx.call("tenants.get", tenantId=a.id))


def tenants_list(ctx: Context, a: argparse.Namespace) -> None:
    ctx.emit(ctx.call("tenants.list"))  # the generic table: ID, NAME, CREATEDAT


def tokens_create(ctx: Context, a: argparse.Namespace) -> None:
    if a.out:
        check_new_file(a.out)
    created = ctx.call("tokens.create", tenantId=ctx.tenant, role=a.role, name=a.name,
                       ttl=a.ttl)
    if a.out:
        write_new_secret(a.out, created.pop("token"))
        created["tokenFile"] = str(Path(a.out))
    ctx.emit(created)


def tokens_list(ctx: Context, a: argparse.Namespace) -> None:
    """Every one: the server answers a page at a time."""
    ctx.emit(ctx.call_pages("tokens.list", **ctx.list_scope()), TOKENS)


def tokens_revoke(ctx: Context, a: argparse.Namespace) -> None:
    ctx.emit(ctx.call("tokens.revoke", tokenId=a.token_id))


def tokens_rotate(ctx: Context, a: argparse.Namespace) -> None:
    if a.out:
        check_new_file(a.out)
    rotated = ctx.call("tokens.rotate", tokenId=a.token_id, grace=a.grace, ttl=a.ttl)
    if a.out:
        write_new_secret(a.out, rotated.pop("token"))
        rotated["tokenFile"] = str(Path(a.out))
    ctx.emit(rotated)


TOKENS_CREATE_EXAMPLES = [
    'better-compute tokens create --tenant acme --role member --name ci --ttl 30d --out ci.token',
    'better-compute tokens create --role read-only --name dashboards   # the default TTL',
]

TOKENS_ROTATE_EXAMPLES = [
    'better-compute tokens rotate tok_… --out ci.token          # the old secret works 1h more',
    'better-compute tokens rotate tok_… --grace 24h --ttl 30d --out ci.token',
    'better-compute tokens rotate tok_… --grace 0s              # the old secret stops now',
]


def sites_create(ctx: Context, a: argparse.Namespace) -> None:
    ctx.emit(ctx.call("sites.create", kind=a.kind, region=a.region, name=a.name, key=a.key))


def sites_get(ctx: Context, a: argparse.Namespace) -> None:
    ctx.emit(ctx.call("sites.get", siteId=a.site))


def sites_list(ctx: Context, a: argparse.Namespace) -> None:
    ctx.emit(ctx.call("sites.list", allTenants=a.all_tenants or None), ctx.list_table(SITES))


def read_policy_file(path: str) -> dict[str, Any]:
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise InvalidInput(f"--policy-file {path}: cannot read it ({exc.strerror})") from None
    try:
        policy = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidInput(f"--policy-file {path} is not JSON: {exc}") from None
    if not isinstance(policy, dict):
        raise InvalidInput(f"--policy-file {path} must hold a JSON object such as "
                           '{"acceptance": [{"kind": "diag.nvml"}], "expect": {"gpuCount": 8}}')
    return policy


def pools_create(ctx: Context, a: argparse.Namespace) -> None:
    ctx.emit(ctx.call("pools.create", siteId=a.site, **{"class": a.node_class},
                      gpuModel=a.gpu_model, policy=read_policy_file(a.policy_file),
                      name=a.name, key=a.key))


def pools_get(ctx: Context, a: argparse.Namespace) -> None:
    ctx.emit(ctx.call("pools.get", poolId=a.pool))


def pools_list(ctx: Context, a: argparse.Namespace) -> None:
    ctx.emit(ctx.call("pools.list", siteId=a.site, allTenants=a.all_tenants or None),
             ctx.list_table(POOLS))


def parse_quota(items: list[str]) -> dict[str, Any]:
    quota: dict[str, Any] = {}
    for item in items:
        for part in item.split(","):
            name, sep, value = part.partition("=")
            if not sep or not name.strip() or not value.strip().isdigit():
                raise InvalidInput(f"--quota {part!r} is not RESOURCE=N: write --quota gpu=16")
            quota[name.strip()] = int(value)
    return quota


def pools_offer(ctx: Context, a: argparse.Namespace) -> None:
    ctx.emit(ctx.call("pools.offer", poolId=a.pool, toTenantId=a.to, quota=parse_quota(a.quota)))


def register(sub: Any) -> None:
    _register_tenants(sub)
    _register_tokens(sub)
    _register_sites(sub)
    _register_pools(sub)


def _register_tenants(sub: Any) -> None:
    g = add_group(sub, "tenants", "Tenants: the customers, and root (the platform operator).",
                  examples=["better-compute tenants create acme", "better-compute tenants list"])
    p = add_verb(g, "create", tenants_create, "Create a tenant; its id is what --to and --tenant take.",
                 examples=["better-compute tenants create acme",
                           "better-compute tenants create acme --name 'Acme Corp'"])
    p.add_argument("id", help="the tenant id, for example acme")
    p.add_argument("--name", help="a display name (default: the id)")
    p = add_verb(g, "get", tenants_get, "Show one tenant.",
                 examples=["better-compute tenants get acme"])
    p.add_argument("id")
    add_verb(g, "list", tenants_list, "List the tenants you see.",
             examples=["better-compute tenants list", "better-compute tenants list -o name"])


def _register_tokens(sub: Any) -> None:
    g = add_group(sub, "tokens", "API tokens (biam_…): shown once, stored only as a hash.",
                  examples=["better-compute tokens create --tenant acme --role admin --out acme-token"])
    p = add_verb(g, "create", tokens_create, "Mint a token for a tenant with a role.",
                 examples=["better-compute tokens create --tenant acme --role admin --out acme-token",
                           "better-compute tokens create --tenant acme --role member --name ci "
                           "--ttl 30d --out ci.token",
                           "better-compute tokens create --role read-only --name dashboards "
                           "--query token"])
    p.add_argument("--tenant", help="the tenant (default: BETTER_COMPUTE_TENANT)")
    p.add_argument("--role", required=True, help="admin, member or read-only")
    p.add_argument("--name", help="what the token is for")
    p.add_argument("--ttl", metavar="DURATION",
                   help="how long the token works, e.g. 90d (default and maximum: the server's "
                   "BETTER_COMPUTE_TOKEN_TTL and BETTER_COMPUTE_TOKEN_MAX_TTL, 90d and 365d)")
    p.add_argument("--out", metavar="FILE", help="write the secret to FILE (0600, never overwritten)")
    p = add_verb(g, "list", tokens_list,
                 "List a tenant's tokens (never their secrets): state, end, last use.",
                 examples=["better-compute tokens list --tenant acme",
                           "better-compute tokens list -A     # every tenant's (root admins)"])
    p.add_argument("--tenant", help="the tenant (default: BETTER_COMPUTE_TENANT)")
    add_all_tenants(p, "tokens")
    p = add_verb(g, "revoke", tokens_revoke, "Revoke a token.",
                 examples=["better-compute tokens revoke tok_…"])
    p.add_argument("token_id", metavar="TOKEN_ID", help="tok_… as tokens list shows")
    p = add_verb(g, "rotate", tokens_rotate,
                 "A new secret (and id) for a token's tenant, role and name; the old secret keeps "
                 "working for a grace period.", examples=TOKENS_ROTATE_EXAMPLES)
    p.add_argument("token_id", metavar="TOKEN_ID", help="tok_… as tokens list shows")
    p.add_argument("--grace", metavar="DURATION",
                   help="how long the old secret keeps working, 0s to 7d (default: the server's "
                   "BETTER_COMPUTE_TOKEN_ROTATION_GRACE, 1h)")
    p.add_argument("--ttl", metavar="DURATION",
                   help="the new token's lifetime (default: the old token's)")
    p.add_argument("--out", metavar="FILE", help="write the new secret to FILE (0600, never "
                   "overwritten)")


def _register_sites(sub: Any) -> None:
    g = add_group(sub, "sites", "Sites: where machines live (root tenant: shared or dedicated).",
                  examples=["export SITE=$(better-compute sites create --kind shared --region "
                            "eu-1 --key site-eu-1 --query id)", "better-compute sites list"])
    p = add_verb(g, "create", sites_create, "Create a platform site.",
                 examples=["export SITE=$(better-compute sites create --kind shared --region "
                           "eu-1 --key site-eu-1 --query id)"])
    p.add_argument("--kind", required=True, help="shared (offered to tenants) or dedicated")
    p.add_argument("--region", required=True, help="for example eu-1")
    p.add_argument("--name", help="a display name")
    p.add_argument("--key", help="idempotency key: the same key returns the same site")
    p = add_verb(g, "get", sites_get, "Show one site.",
                 examples=["better-compute sites get $SITE"])
    p.add_argument("site", metavar="SITE", help="the site: its id (site_…) or its name")
    p = add_verb(g, "list", sites_list, "List the sites you see.",
                 examples=["better-compute sites list", "better-compute sites list -o name",
                           "better-compute sites list -A      # with their TENANT (root)"])
    add_all_tenants(p, "sites")


def _register_pools(sub: Any) -> None:
    g = add_group(sub, "pools", "Pools: machines of one GPU model with one policy.",
                  examples=["better-compute pools get $POOL",
                            "better-compute pools offer $POOL --to acme --quota gpu=16"])
    p = add_verb(g, "create", pools_create, "Create a pool on a site.",
                 examples=["export POOL=$(better-compute pools create --site $SITE --class "
                           "metal-host --gpu-model H100 --policy-file pool-policy.json "
                           "--key pool-eu-1-h100 --query id)"])
    p.add_argument("--site", required=True, metavar="SITE", help="the site of the pool: its id (site_…) or its name")
    p.add_argument("--class", dest="node_class", required=True, metavar="CLASS",
                   help="metal-host: joining machines become host nodes whose GPUs are held")
    p.add_argument("--gpu-model", required=True,
                   help="the GPU model (family), for example H100 or 'RTX 6000 Ada' "
                   "(docs/gpu-models.md)")
    p.add_argument("--policy-file", required=True, metavar="FILE",
                   help='JSON: {"acceptance": [{"kind": "diag.nvml"}], "expect": {"gpuCount": 8}}')
    p.add_argument("--name", help="a display name")
    p.add_argument("--key", help="idempotency key: the same key returns the same pool")
    p = add_verb(g, "get", pools_get, "Show one pool with its policy and offerings.",
                 examples=["better-compute pools get $POOL",
                           "better-compute pools get $POOL --query policy -o yaml"])
    p.add_argument("pool", metavar="POOL", help="the pool: its id (pool_…) or its name (--name, else --key)")
    p = add_verb(g, "list", pools_list, "List the pools you own or are offered.",
                 examples=["better-compute pools list", "better-compute pools list --site $SITE",
                           "better-compute pools list -A      # with their TENANT (root)"])
    p.add_argument("--site", metavar="SITE", help="only the pools of this site")
    add_all_tenants(p, "pools")
    p = add_verb(g, "offer", pools_offer, "Offer a pool to a tenant with a gpu quota.",
                 examples=["better-compute pools offer $POOL --to acme --quota gpu=16"])
    p.add_argument("pool", metavar="POOL", help="the pool: its id (pool_…) or its name (--name, else --key)")
    p.add_argument("--to", required=True, metavar="TENANT", help="the tenant id, for example acme")
    p.add_argument("--quota", required=True, action="append", metavar="gpu=N",
                   help="the GPUs the tenant may hold at once; the resource is gpu (singular)")
