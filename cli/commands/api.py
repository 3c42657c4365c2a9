"""api METHOD k=v k:=JSON…, and pki show."""

from __future__ import annotations

import argparse
import json
from typing import Any

from better_compute.cli.context import Context
from better_compute.cli.registry import add_group, add_verb
from better_compute.domain.errors import InvalidInput


def parse_assignments(items: list[str]) -> dict[str, Any]:
    """httpie's convention: ``name=value`` is always a string, ``name:=JSON`` a typed value
    (``maxUses:=2``, ``quota:='{"gpu":16}'``, ``nvlink:=true``)."""
    params: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key or key == ":":
            raise InvalidInput(f"{item!r} is not name=value or name:=JSON: write params as "
                               "name=value for strings (tenantId=root) and name:=JSON for "
                               "numbers, booleans, lists and objects (maxUses:=2)")
        if key.endswith(":"):
            try:
                params[key[:-1]] = json.loads(raw)
            except json.JSONDecodeError as exc:
                raise InvalidInput(f"{item!r}: the value after := is not JSON ({exc}); quote "
                                   "strings (name:='\"text\"') or write name=text") from None
        else:
            params[key] = raw
    return params


def api(ctx: Context, args: argparse.Namespace) -> None:
    ctx.emit(ctx.client.call(args.method, parse_assignments(args.params)))


def pki_show(ctx: Context, args: argparse.Namespace) -> None:
    ctx.emit(ctx.call("pki.show"))


def register(sub: Any) -> None:
    p = add_verb(sub, "api", api, "Call any JSON-RPC method: api METHOD name=value name:=JSON … "
                 "(name=value is a string; name:=JSON a number, boolean, list or object).",
                 examples=[
                     "better-compute api system.whoami",
                     "better-compute api rpc.discover --query 'methods[].name'",
                     "better-compute api nodes.adopt tenantId=$BETTER_COMPUTE_TENANT "
                     "nodeId=$NODE reason='GPU 3 reseated'",
                     "better-compute api events.list since:=0 limit:=10",
                     "better-compute api pools.offer poolId=$POOL toTenantId=acme "
                     "quota:='{\"gpu\": 16}'",
                 ])
    p.add_argument("method", metavar="METHOD", help="for example system.whoami; rpc.discover lists all")
    p.add_argument("params", nargs="*", metavar="NAME=VALUE|NAME:=JSON")
    pki = add_group(sub, "pki", "The control plane's PKI: public certificates and pins.",
                    examples=["better-compute pki show --query servingCaSpkiPin"])
    add_verb(pki, "show", pki_show, "The pins (servingCaSpkiPin, joinSigningKeyPin, "
             "joinEncryptionKeyPin) and the serving and node CA certificates.",
             examples=["better-compute pki show --query servingCaSpkiPin",
                       "better-compute pki show --query joinSigningKeyPin",
                       "better-compute pki show --query joinEncryptionKeyPin"])
