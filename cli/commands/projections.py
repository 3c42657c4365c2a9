"""projections status and projections rebuild: the read models that follow the event log."""

from __future__ import annotations

import argparse
from typing import Any

from better_compute.cli.context import Context
from better_compute.cli.registry import add_group, add_verb


def projections_status(ctx: Context, a: argparse.Namespace) -> None:
    ctx.emit(ctx.call("projections.status"))


def projections_rebuild(ctx: Context, a: argparse.Namespace) -> None:
    ctx.emit(ctx.call("projections.rebuild", name=a.name))


def register(sub: Any) -> None:
    g = add_group(sub, "projections",
                  "Read models kept from the event log, each with its tracking position.",
                  examples=["better-compute projections status"])
    add_verb(g, "status", projections_status,
             "Each read model's position in the event log, the head, and the lag between them.",
             examples=["better-compute projections status"])
    p = add_verb(g, "rebuild", projections_rebuild,
                 "Empty a read model (default: all) and apply the whole log again from sequence 0.",
                 examples=["better-compute projections rebuild",
                           "better-compute projections rebuild listings"])
    p.add_argument("name", nargs="?", metavar="NAME", help="one projection, e.g. listings")
