"""reserve, release, extend, reservations list|get, and capacity --preview."""

from __future__ import annotations

import argparse
import secrets
import sys
import time
from typing import Any

from better_compute.cli.commands import capacity
from better_compute.cli.commands.queue_wait import wait_while_queued
from better_compute.cli.registry import add_group, add_verb
from better_compute.domain.errors import InvalidInput, Unavailable

DEFAULT_WAIT_S = 20.0


def new_key() -> str:
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


def reserve(ctx: Any, a: argparse.Namespace) -> None:
    key = a.key or new_key()
    if not a.key:
        print(f"idempotency key: {key} (run again with --key {key} to retry without booking "
              "twice)", file=sys.stderr)
    params = {"tenantId": ctx.tenant, "poolId": a.pool, "gpus": a.gpus, "duration": a.duration,
              "model": a.model, "product": a.product, "selector": a.selector,
              "nvlink": True if a.nvlink else None, "start": a.start, "key": key,
              "queue": True if a.queue else None, "queueTimeout": a.queue_timeout,
              "moveEarlier": True if a.move_earlier else None}
    deadline = time.monotonic() + a.wait
    delay = 0.25
    while True:
        try:
            result = ctx.call("reservations.create", **params)
            break
        except Unavailable:
            # The same key makes the retry safe: at most one reservation is ever booked.
            if time.monotonic() + delay > deadline:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 2.0)
    ctx.emit(wait_while_queued(ctx, result, deadline))


def release(ctx: Any, a: argparse.Namespace) -> None:
    method = "reservations.cancel" if a.cancel else "reservations.release"
    ctx.emit(ctx.call(method, reservationId=a.reservation, tenantId=ctx.tenant))


def extend(ctx: Any, a: argparse.Namespace) -> None:
    ctx.emit(ctx.call("reservations.extend", reservationId=a.reservation, by=a.by,
                      tenantId=ctx.tenant))


def reservations_get(ctx: Any, a: argparse.Namespace) -> None:
    ctx.emit(ctx.call("reservations.get", reservationId=a.reservation, tenantId=ctx.tenant))


def reservations_list(ctx: Any, a: argparse.Namespace) -> None:
    ctx.emit(ctx.call("reservations.list", tenantId=ctx.tenant, poolId=a.pool, state=a.state))


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


def _preview(ctx: Any, a: argparse.Namespace) -> bool:
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


capacity.EXTENSIONS.append((_preview_arguments, _preview))


def register(sub: Any) -> None:
    p = add_verb(sub, "reserve", reserve,
                 "Reserve GPUs of a pool for a while; prints the new idempotency key on "
                 "standard error.")
    p.add_argument("--pool", required=True, metavar="POOL", help="the pool (pool_…)")
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
    p.add_argument("--wait", type=_wait_seconds, default=DEFAULT_WAIT_S, metavar="SECONDS",
                   help=f"how long to wait for the placement, also of a queued reservation "
                        f"(default {DEFAULT_WAIT_S:.0f})")
    p.add_argument("--tenant", help="the tenant (default: BETTER_COMPUTE_TENANT)")

    p = add_verb(sub, "release", release,
                 "End a reservation now (bookings end, quota is refunded, the hold leaves the "
                 "node); --cancel withdraws one that has not started.")
    p.add_argument("reservation", metavar="RSV", help="rsv_… as reserve printed")
    p.add_argument("--cancel", action="store_true", help="withdraw a reservation before its start")
    p.add_argument("--tenant", help="the tenant (default: BETTER_COMPUTE_TENANT)")

    p = add_verb(sub, "extend", extend,
                 "Extend a reservation when its GPUs are free for the extra time.")
    p.add_argument("reservation", metavar="RSV", help="rsv_…")
    p.add_argument("--by", required=True, metavar="DURATION", help="how much longer, e.g. 2h")
    p.add_argument("--tenant", help="the tenant (default: BETTER_COMPUTE_TENANT)")

    g = add_group(sub, "reservations", "Reservations: list them or show one.")
    p = add_verb(g, "list", reservations_list, "A tenant's reservations, oldest first.")
    p.add_argument("--pool", metavar="POOL", help="only this pool's")
    p.add_argument("--state", help="only these states, e.g. active or placed,binding")
    p.add_argument("--tenant", help="the tenant (default: BETTER_COMPUTE_TENANT)")
    p = add_verb(g, "get", reservations_get,
                 "One reservation; --query state or --query binding as in the tutorial.")
    p.add_argument("reservation", metavar="RSV", help="rsv_…")
    p.add_argument("--tenant", help="the tenant (default: BETTER_COMPUTE_TENANT)")
