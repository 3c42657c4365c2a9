"""api METHOD k=v…, and pki show."""

from __future__ import annotations

import argparse
import json
from typing import Any

from better_compute.cli.registry import add_group, add_verb
from better_compute.domain.errors import InvalidInput


def parse_assignments(items: list[str]) -> dict[str, Any]:
    """k=v pairs; a value that parses as JSON is JSON, else a string."""
    params: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise InvalidInput(f"{item!r} is not key=value: write params as name=value, "
                               "for example tenantId=root")
        try:
            params[key] = json.loads(raw)
        except json.JSONDecodeError:
            params[key] = raw
    return params


def api(ctx: Any, args: argparse.Namespace) -> None:
    ctx.emit(ctx.client.call(args.method, parse_assignments(args.params)))


def pki_show(ctx: Any, args: argparse.Namespace) -> None:
    ctx.emit(ctx.call("pki.show"))


def register(sub: Any) -> None:
    p = add_verb(sub, "api", api, "Call any JSON-RPC method: api METHOD name=value … "
                 "(a value that parses as JSON is JSON, else a string).")
    p.add_argument("method", metavar="METHOD", help="for example system.whoami; rpc.discover lists all")
    p.add_argument("params", nargs="*", metavar="NAME=VALUE")
    pki = add_group(sub, "pki", "The control plane's PKI: public certificates and pins.")
    add_verb(pki, "show", pki_show, "The pins (servingCaSpkiPin, joinSigningKeyPin, "
             "joinEncryptionKeyPin) and the serving and node CA certificates.")
