"""reserve, release, extend, reservations list|get, and capacity --preview.

``reserve`` creates the reservation with an idempotency key (retrying the same key while the
server is unreachable), then with ``--wait SECONDS`` (default 20) waits until it is ``active``
or in a final state (cli/waiting.py), with a spinner on a terminal. A new key is printed on
standard error only once the request was accepted (or its outcome is unknown), never for
input the server refused.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from better_compute.cli.commands import capacity
from better_compute.cli.commands.queue_wait import wait_while_queued
from better_compute.cli.context import Context
from better_compute.cli.follow import add_watch_flag, follow
from better_compute.cli.registry import add_all_tenants, add_group, add_verb
from better_compute.cli.tables import RESERVATIONS
from better_compute.domain.errors import InvalidInput, Unavailable

DEFAULT_WAIT_S = 20.0


def new_key() -> str:
    import secrets

    return "rsv-" + secrets.token_hex(10)


def _wait_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--wait {text!r} is not a number of seconds (for example --wait 20)") from None
    if value < 0:
        raise argparse.ArgumentTypeError("--wait takes 0 or more seconds")
    return value


def _print_key(key: str) -> None:
    print(f"idempotency key: {key} (run again with --key {key} to retry without booking "
          "twice)", file=sys.stderr)


def reserve_params(ctx: Context, a: argparse.Namespace, key: str) -> dict[str, Any]:
    """reservations.create's params from the flags (flags other features add go here)."""
    return {"tenantId": ctx.tenant, "poolId": a.pool, "gpus": a.gpus, "duration": a.duration,
            "model": a.model, "product": a.product, "selector": a.selector,
            "nvlink": True if a.nvlink else None, "start": a.start, "key": key,
            "kubernetes": True if a.kubernetes else None,
            "queue": True if a.queue else None, "queueTimeout": a.queue_timeout,
            "moveEarlier": True if a.move_earlier else None}


def reserve(ctx: Context, a: argparse.Namespace) -> int:
    from better_compute.cli.waiting import create_with_retries, wait_until_settled

    key = a.key or new_key()
    deadline = time.monotonic() + a.wait
    try:
        result = create_with_retries(ctx, reserve_params(ctx, a, key), a.wait)
    except Unavailable:
        if not a.key:  # the outcome is unknown: the key is how to retry without booking twice
            _print_key(key)
        raise
    if not a.key:
        _print_key(key)
    if ctx.env.get("BETTER_COMPUTE_URL", "").strip():  # a server's controllers place the queue
        result = wait_while_queued(ctx, result, deadline)  # its position, on a terminal
    result, code = wait_until_settled(ctx, result, max(0.0, deadline - time.monotonic()))
    ctx.emit(result)
    return code


def release(ctx: Context, a: argparse.Namespace) -> None:
    method = "reservations.cancel" if a.cancel else "reservations.release"
    ctx.emit(ctx.call(method, reservationId=a.reservation, tenantId=ctx.tenant))


def extend(ctx: Context, a: argparse.Namespace) -> None:
    ctx.emit(ctx.call("reservations.extend", reservationId=a.reservation, by=a.by,
                      tenantId=ctx.tenant))


def _reservation(ctx: Context, rsv: str) -> dict[str, Any]:
    return dict(ctx.call("reservations.get", reservationId=rsv, tenantId=ctx.tenant))


def reservations_get(ctx: Context, a: argparse.Namespace) -> int | None:
    doc = _reservation(ctx, a.reservation)
    if not a.watch:
        ctx.emit(doc)
        return None
    return follow(ctx, types="reservation.*", first=lambda: [doc], keep=lambda _: True,
                  fetch=lambda rsv: _reservation(ctx, rsv), table=RESERVATIONS,
                  only={str(doc["id"])})


def reservations_list(ctx: Context, a: argparse.Namespace) -> int | None:
    """Every one, newest first: the server answers a page at a time, oldest first (stable
    pages while new ones are made); a person picks "the last one" from the top."""
    def first() -> list[dict[str, Any]]:
        items = ctx.call_pages("reservations.list", **ctx.list_scope(), poolId=a.pool,
                               state=a.state)
        return list(items[::-1])

    if not a.watch:
        ctx.emit(first(), ctx.list_table(RESERVATIONS))
        return None
    scope = ctx.list_scope()
    pool = ctx.call("pools.get", poolId=a.pool)["id"] if a.pool else None
    states = {s.strip() for s in (a.state or "").split(",") if s.strip()}

    def keep(doc: dict[str, Any]) -> bool:
        return ((pool is None or doc.get("poolId") == pool)
                and (not states or doc.get("state") in states)
                and (scope.get("tenantId") is None or doc.get("tenantId") == scope["tenantId"]))

    return follow(ctx, types="reservation.*", first=first, keep=keep,
                  fetch=lambda rsv: _reservation(ctx, rsv), table=ctx.list_table(RESERVATIONS))


def _narrowing(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", help="a GPU model such as H100 (the pool's)")
    p.add_argument("--product", help="a product name, such as H100-SXM5-80GB")
    p.add_argument("--selector", metavar="EXPR",
                   help="keep GPUs this expression is true for, e.g. \"vramGiB >= 80\" "
                        "(docs/reservations.md, selectors)")
    p.add_argument("--nvlink", action="store_true", help="all GPUs in one NVLink domain")
    p.add_argument("--start", metavar="WHEN",
                   help="+2h or an RFC 3339 time (default: now); reserve also takes earliest")


def _preview_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preview", action="store_true",
                   help="answer whether --gpus N --for D would fit now; books nothing")
    p.add_argument("--gpus", type=int, metavar="N", help="with --preview: how many GPUs")
    p.add_argument("--for", dest="duration", metavar="DURATION",
                   help="with --preview: how long, e.g. 2h")
    _narrowing(p)


def _preview(ctx: Context, a: argparse.Namespace) -> bool:
    narrowed = any(getattr(a, n, None) for n in ("gpus", "duration", "model", "product",
                                                 "selector", "nvlink", "start"))
    if not a.preview:
        if narrowed:
            raise InvalidInput("--gpus, --for, --model, --product, --selector, --nvlink and "
                               "--start go with --preview: add --preview")
        return False
    if a.gpus is None or a.duration is None:
        raise InvalidInput("capacity --preview needs --gpus N and --for DURATION "
                           "(for example --gpus 4 --for 2h)")
    ctx.emit(ctx.call("capacity.preview", tenantId=ctx.tenant, poolId=a.pool, gpus=a.gpus,
                      duration=a.duration, model=a.model, product=a.product,
                      selector=a.selector, nvlink=True if a.nvlink else None, start=a.start))
    return True


CAPACITY_PREVIEW: capacity.Extension = (_preview_arguments, _preview)  # cli/commands/__init__.py


def register(sub: Any) -> None:
    _register_reserve(sub)
    _register_the_rest(sub)


def _register_reserve(sub: Any) -> None:
    p = add_verb(sub, "reserve", reserve,
                 "Reserve GPUs of a pool for a while and wait until the hold is active; prints "
                 "the new idempotency key on standard error once the request is accepted.",
                 examples=["better-compute reserve --pool $POOL --gpus 4 --for 2h",
                           "export RSV=$(better-compute reserve --pool $POOL --gpus 4 --for 2h "
                           "--query id)",
                           "better-compute reserve --pool $POOL --gpus 8 --for 1d --nvlink "
                           "--selector 'vramGiB >= 80' --start +2h",
                           "better-compute reserve --pool $POOL --gpus 4 --for 2h --key "
                           "rsv-3f9a… --wait 0"])
    p.add_argument("--pool", required=True, metavar="POOL", help="the pool: its id (pool_…) or its name")
    p.add_argument("--gpus", required=True, type=int, metavar="N", help="how many GPUs")
    p.add_argument("--for", dest="duration", required=True, metavar="DURATION",
                   help="how long: 30m, 2h, 1d")
    _narrowing(p)
    p.add_argument("--queue", action="store_true",
                   help="when it cannot be placed (no node can hold it yet, or over quota), "
                        "wait in the pool's queue instead of failing; starts as early as it can")
    p.add_argument("--queue-timeout", metavar="DURATION",
                   help="with --queue: how long it may wait before it expires (default 6h)")
    p.add_argument("--move-earlier", action="store_true",
                   help="with a later --start: move it earlier when GPUs free up")
    p.add_argument("--key", help="an idempotency key: the same key returns the same reservation")
    p.add_argument("--kubernetes", action="store_true",
                   help="hand the GPUs to the kubelet through bcd's device plugin "
                        "(a pool with policy.kubernetes; docs/kubernetes.md)")
    p.add_argument("--wait", type=_wait_seconds, default=DEFAULT_WAIT_S, metavar="SECONDS",
                   help="how long to wait for the reservation to be active or final (a queued "
                   "one: placed), retrying while the server is unreachable (default "
                   f"{DEFAULT_WAIT_S:.0f}; 0: return once placed or queued)")
    p.add_argument("--tenant", help="the tenant (default: BETTER_COMPUTE_TENANT)")


def _register_the_rest(sub: Any) -> None:
    p = add_verb(sub, "release", release,
                 "End a reservation now (bookings end, quota is refunded, the hold leaves the "
                 "node); --cancel withdraws one that has not started.",
                 examples=["better-compute release $RSV", "better-compute release $RSV --cancel"])
    p.add_argument("reservation", metavar="RSV", help="rsv_… as reserve printed")
    p.add_argument("--cancel", action="store_true", help="withdraw a reservation before its start")
    p.add_argument("--tenant", help="the tenant (default: BETTER_COMPUTE_TENANT)")

    p = add_verb(sub, "extend", extend,
                 "Extend a reservation when its GPUs are free for the extra time.",
                 examples=["better-compute extend $RSV --by 2h"])
    p.add_argument("reservation", metavar="RSV", help="rsv_…")
    p.add_argument("--by", required=True, metavar="DURATION", help="how much longer, e.g. 2h")
    p.add_argument("--tenant", help="the tenant (default: BETTER_COMPUTE_TENANT)")

    g = add_group(sub, "reservations", "Reservations: list them or show one.",
                  examples=["better-compute reservations list",
                            "better-compute reservations get $RSV --query state"])
    p = add_verb(g, "list", reservations_list, "A tenant's reservations, newest first.",
                 examples=["better-compute reservations list",
                           "better-compute reservations list --pool $POOL --state active -o wide",
                           "better-compute reservations list -A --state active   # every "
                           "tenant's (root)",
                           "better-compute reservations list -o name"])
    p.add_argument("--pool", metavar="POOL", help="only this pool's")
    p.add_argument("--state", help="only these states, e.g. active or placed,binding")
    p.add_argument("--tenant", help="the tenant (default: BETTER_COMPUTE_TENANT)")
    add_all_tenants(p, "reservations")
    add_watch_flag(p, "each reservation")
    p = add_verb(g, "get", reservations_get,
                 "One reservation; --query state or --query binding as in the tutorial.",
                 examples=["better-compute reservations get $RSV --query state",
                           "better-compute reservations get $RSV --query binding",
                           "better-compute reservations get $RSV -w   # placed, binding, active…"])
    p.add_argument("reservation", metavar="RSV", help="rsv_…")
    p.add_argument("--tenant", help="the tenant (default: BETTER_COMPUTE_TENANT)")
    add_watch_flag(p, "the reservation")
