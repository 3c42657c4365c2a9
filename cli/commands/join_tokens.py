"""join-tokens: let machines join a pool (bcd join), shown once, stored only as a hash."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from better_compute.cli.context import Context
from better_compute.cli.files import check_new_file, write_new_secret
from better_compute.cli.registry import add_all_tenants, add_group, add_verb
from better_compute.cli.tables import JOIN_TOKENS
from better_compute.domain.errors import Conflict


def create(ctx: Context, a: argparse.Namespace) -> None:
    if a.out:
        check_new_file(a.out)  # before the token exists: a bad --out mints nothing
    created = ctx.call(
        "joinTokens.create", poolId=a.pool, ttl=a.ttl, maxUses=a.max_uses,
        expectSerial=a.expect_serial, expectMac=a.expect_mac, expectUuid=a.expect_uuid,
        key=a.key,
    )
    secret = created.pop("token", None)
    if secret is None:
        raise Conflict(
            f"join token {created['id']} already exists for --key {a.key}; its secret was shown "
            "once when it was minted and is not kept anywhere: use the file written then, or "
            f"revoke it (`better-compute join-tokens revoke {created['id']}`) and mint a new one "
            "with a new --key"
        )
    if a.out:
        write_new_secret(a.out, secret)
        created["tokenFile"] = str(Path(a.out))
        print(f"join token {created['id']} written to {a.out} (mode 0600); it is shown nowhere "
              "else", file=sys.stderr)
    else:
        created["token"] = secret
    ctx.emit(created)


def list_tokens(ctx: Context, a: argparse.Namespace) -> None:
    ctx.emit(ctx.call("joinTokens.list", **ctx.list_scope(), poolId=a.pool),
             ctx.list_table(JOIN_TOKENS))


def get(ctx: Context, a: argparse.Namespace) -> None:
    ctx.emit(ctx.call("joinTokens.get", joinTokenId=a.join_token))


def revoke(ctx: Context, a: argparse.Namespace) -> None:
    ctx.emit(ctx.call("joinTokens.revoke", joinTokenId=a.join_token))


_CREATE_EXAMPLE = ("better-compute join-tokens create --pool $POOL --ttl 2h --max-uses 1 "
                   "--expect-serial SN-7701 --key join-sn-7701 --out ./join-token")


def register(sub: Any) -> None:
    g = add_group(sub, "join-tokens",
                  "Join tokens (bcjt_…): let machines join a pool with bcd join; shown once.",
                  examples=[_CREATE_EXAMPLE, "better-compute join-tokens list --pool $POOL"])
    p = add_verb(g, "create", create,
                 "Mint a join token for a pool; write it to a file with --out.",
                 examples=[_CREATE_EXAMPLE,
                           "better-compute join-tokens create --pool $POOL --ttl 30m "
                           "--max-uses 4 --out ./rack-7-token"])
    p.add_argument("--pool", required=True, metavar="POOL", help="the pool machines join")
    p.add_argument("--ttl", required=True, metavar="DURATION",
                   help="how long the token works: 1m to 24h (for example 2h)")
    p.add_argument("--max-uses", type=int, default=1, metavar="N",
                   help="how many machines may join with it (default 1)")
    bind = p.add_mutually_exclusive_group()
    bind.add_argument("--expect-serial", metavar="SERIAL",
                      help="only the machine whose firmware reports this serial")
    bind.add_argument("--expect-mac", metavar="MAC",
                      help="only a machine with this MAC address (for machines with no serial "
                      "and no product UUID: WSL 2, many VMs)")
    bind.add_argument("--expect-uuid", metavar="UUID",
                      help="only the machine with this product UUID")
    p.add_argument("--key", help="idempotency key: the same key returns the same token")
    p.add_argument("--out", metavar="FILE",
                   help="write the secret to FILE (mode 0600, never overwritten)")
    p = add_verb(g, "list", list_tokens, "List a tenant's join tokens (never their secrets).",
                 examples=["better-compute join-tokens list --pool $POOL",
                           "better-compute join-tokens list -A    # every tenant's (root)"])
    p.add_argument("--tenant", help="the tenant (default: BETTER_COMPUTE_TENANT)")
    p.add_argument("--pool", metavar="POOL", help="only this pool's tokens")
    add_all_tenants(p, "join tokens")
    p = add_verb(g, "get", get, "Show one join token: state, uses, binding, expiry.",
                 examples=["better-compute join-tokens get jt_… --query state"])
    p.add_argument("join_token", metavar="JOIN_TOKEN", help="jt_… as join-tokens list shows")
    p = add_verb(g, "revoke", revoke, "Revoke a join token; no machine joins with it after.",
                 examples=["better-compute join-tokens revoke jt_…"])
    p.add_argument("join_token", metavar="JOIN_TOKEN", help="jt_… as join-tokens list shows")
