"""capacity --pool P: a pool's rollup per resource (docs/capacity.md).

``capacity`` is one verb with flags, not a group: reservations add
``--preview`` (with ``--gpus`` and ``--for``) to the same parser as an :data:`Extension`
that cli/commands/__init__.py passes to ``register``, and answer it from their own runner.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from better_compute.cli.context import Context
from better_compute.cli.registry import add_verb
from better_compute.cli.tables import CAPACITY

# (add_arguments(parser), run(ctx, args) -> bool handled): a flag set another feature plugs in.
Extension = tuple[Callable[[argparse.ArgumentParser], None],
                  Callable[[Context, argparse.Namespace], bool]]


def capacity(ctx: Context, a: argparse.Namespace, extensions: Sequence[Extension] = ()) -> None:
    for _, run in extensions:
        if run(ctx, a):
            return
    ctx.emit(ctx.call("capacity.get", poolId=a.pool), CAPACITY)


def register(sub: Any, extensions: Sequence[Extension] = ()) -> None:
    p = add_verb(sub, "capacity", partial(capacity, extensions=tuple(extensions)),
                 "A pool's capacity per resource: total, allocatable, allocated, reserved, "
                 "available, and GPUs provisioning, unhealthy, in maintenance, unreachable.",
                 examples=["better-compute capacity --pool $POOL",
                           "better-compute capacity --preview --pool $POOL --gpus 4 --for 2h",
                           "better-compute capacity --pool $POOL --query resources.gpu.available"])
    p.add_argument("--pool", required=True, metavar="POOL", help="the pool: its id (pool_…) or its name")
    for add_arguments, _ in extensions:
        add_arguments(p)
