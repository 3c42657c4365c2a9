"""Where a server's time goes: py-spy's raw stacks split into the create path's parts.

    py-spy record --gil --subprocesses --rate 500 --format raw -o stacks.txt --pid SERVE_PID \
        --duration 20
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

# (part, frames that must all appear in the stack); first match wins. A frame is matched as
# py-spy writes it, ``function (path:line)``: by its function and the file it is in (py-spy
# names no class; ``ComputeStore.save`` is ``save (api/store/store.py:…)``).
_REQUEST_PARTS: list[tuple[str, tuple[str, ...]]] = [
    ("free-GPU projection catch-up", ("choose (api/services/reservation_base.py",
                                      "catch_up (projections/framework.py")),
    ("placement (projection read, place)", ("choose (api/services/reservation_base.py",)),
    ("quota load", ("quota_of (api/services/reservation_base.py",)),
    ("bookings load", ("bookings_of (api/services/reservation_base.py",)),
    ("pool load", ("_visible_pool (api/services/reservations.py",)),
    ("reservation load", ("reservation (api/services/reservations.py",)),
    ("ending the hold (bookings, quota, node loads)", ("end_hold (api/services/",)),
    ("host share read", ("node_host_share (",)),
    ("the save", ("save (api/store/store.py",)),
    ("database time", ("now (api/services/reservation_base.py",)),
    ("rendering the answer", ("to_doc (",)),
]
_OTHER_PARTS: list[tuple[str, tuple[str, ...]]] = [
    ("controllers: reservation timers", ("tick (api/controllers/reservations.py",)),
    ("controllers: node lifecycle", ("reconcile (api/controllers/node_lifecycle.py",)),
    ("controllers: queue dispatcher", ("run (api/controllers/queue.py",)),
    ("controllers: tokens", ("tick (api/services/tokens.py",)),
    ("controllers: leadership check", ("still_leader (",)),
    ("read models' follower (batches)", ("run (projections/framework.py",)),
    ("/watch hub (follows the log)", ("api/http/follower.py",)),
    ("authentication", ("authenticate (",)),
    ("JSON-RPC decode, params, encode", ("api/http/rpc.py",)),
    ("token use noted", ("api/store/token_use.py",)),
]
_METHODS = ("reservations_create", "reservations_release", "reservations_cancel",
            "reservations_extend")
_EVENT_LOOP = ("httptools", "h11", "uvicorn", "starlette", "api/http/http_limits.py",
               "api/http/request_log.py", "api/http/metrics.py", "asyncio", "anyio")


def _code_frames(frames: list[str]) -> list[str]:
    """The stack without the frames py-spy adds for a process (``process PID:"command
    line"``, with ``--subprocesses``) or a thread (``thread (0x…)``, with ``--threads``):
    a worker's command line holds its options (``metrics_listen``, say), not code."""
    return [f for f in frames if not f.startswith(("process ", "thread ("))]


def part_of(frames: list[str]) -> str:
    text = ";".join(_code_frames(frames))
    for method in _METHODS:
        if f"{method} (" in text:
            for name, needles in _REQUEST_PARTS:
                if all(n in text for n in needles):
                    return f"{method}: {name}"
            return f"{method}: params, checks, other"
    for name, needles in _OTHER_PARTS:
        if all(n in text for n in needles):
            return name
    if "ssl" in text.lower():
        return "TLS"
    if any(n in text for n in _EVENT_LOOP):
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
