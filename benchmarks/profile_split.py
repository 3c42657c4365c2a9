"""Where a server's time goes: py-spy's raw stacks split into the create path's parts.

    py-spy record --gil --rate 500 --format raw -o stacks.txt --pid SERVE_PID --duration 20
    .venv/bin/python -m better_compute.benchmarks.profile_split stacks.txt [--ops N]

``SERVE_PID`` is the ``better-compute serve`` process under load (for example
``benchmarks/reservations.py --clients 1 --seconds 30 --live 0``, which prints it).
Each sample (a stack of the thread holding the GIL) goes to the first part whose rule
matches its frames, the request's own parts first by what it is inside of. With
``--ops`` (the operations the server answered during the recording) each part is also
shown as milliseconds per operation, from the sampling rate.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

# (part, frames that must all appear in the stack); first match wins.
_REQUEST_PARTS: list[tuple[str, tuple[str, ...]]] = [
    ("free-GPU projection catch-up", ("choose", "catch_up")),
    ("placement (projection read, place)", ("choose",)),
    ("quota load", ("quota_of",)),
    ("bookings load", ("bookings_of",)),
    ("pool load", ("_visible_pool",)),
    ("reservation load", ("ReservationService.reservation ",)),
    ("ending the hold (bookings, quota, node loads)", ("_end_hold",)),
    ("host share read", ("node_host_share",)),
    ("the save", ("Application.save",)),
    ("database time", ("ReservationCore.now",)),
    ("rendering the answer", ("to_doc",)),
]
_OTHER_PARTS: list[tuple[str, tuple[str, ...]]] = [
    ("controllers: reservation timers", ("ReservationTimers.tick",)),
    ("controllers: node lifecycle", ("NodeLifecycle.reconcile",)),
    ("controllers: queue dispatcher", ("QueueDispatcher.run",)),
    ("controllers: tokens", ("TokenExpiry.tick",)),
    ("controllers: leadership check", ("still_leader",)),
    ("controllers: read models' upkeep (listings, usage)", ("ReadModelUpkeep.run",)),
    ("/watch hub (follows the log)", ("WatchHub",)),
    ("authentication", ("authenticate",)),
    ("JSON-RPC decode, params, encode", ("rpc.py",)),
    ("token use noted", ("token_use",)),
]
_METHODS = ("reservations_create", "reservations_release", "reservations_cancel",
            "reservations_extend")


def part_of(frames: list[str]) -> str:
    text = ";".join(frames)
    for method in _METHODS:
        if method in text:
            for name, needles in _REQUEST_PARTS:
                if all(n in text for n in needles):
                    return f"{method}: {name}"
            return f"{method}: params, checks, other"
    for name, needles in _OTHER_PARTS:
        if all(n in text for n in needles):
            return name
    if "ssl" in text.lower():
        return "TLS"
    if any(n in text for n in ("httptools", "h11", "uvicorn", "starlette", "http_limits",
                               "request_log", "metrics")):
        return "event loop: HTTP, TLS records, middleware, hand-offs"
    if "asyncio" in text or "anyio" in text:
        return "event loop: HTTP, TLS records, middleware, hand-offs"
    return "other"


def split(path: Path) -> Counter[str]:
    parts: Counter[str] = Counter()
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        parts[part_of(stack.split(";"))] += int(count)
    return parts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m better_compute.benchmarks.profile_split",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("stacks", type=Path)
    parser.add_argument("--ops", type=int, default=0)
    parser.add_argument("--rate", type=int, default=500, help="py-spy's --rate")
    args = parser.parse_args(argv)
    parts = split(args.stacks)
    total = sum(parts.values()) or 1
    print(f"{'part':<62} {'share':>6} {'ms/op':>7}")
    for name, samples in parts.most_common():
        per_op = f"{1000 * samples / args.rate / args.ops:7.2f}" if args.ops else ""
        print(f"{name:<62} {100 * samples / total:5.1f}% {per_op}")
    print(f"{'samples':<62} {total:>6}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
