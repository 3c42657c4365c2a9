"""nodes: list, get, events, cordon, uncordon (nodes.adopt is called through `api`)."""

from __future__ import annotations

import argparse
from typing import Any

from better_compute.cli.registry import add_group, add_verb


def nodes_list(ctx: Any, a: argparse.Namespace) -> None:
    ctx.emit(ctx.call("nodes.list", tenantId=ctx.tenant, poolId=a.pool))


def nodes_get(ctx: Any, a: argparse.Namespace) -> None:
    ctx.emit(ctx.call("nodes.get", nodeId=a.node))


def nodes_events(ctx: Any, a: argparse.Namespace) -> None:
    ctx.emit(ctx.call("nodes.events", nodeId=a.node))


def nodes_cordon(ctx: Any, a: argparse.Namespace) -> None:
    ctx.emit(ctx.call("nodes.cordon", nodeId=a.node, reason=a.reason))


def nodes_uncordon(ctx: Any, a: argparse.Namespace) -> None:
    ctx.emit(ctx.call("nodes.uncordon", nodeId=a.node))


def register(sub: Any) -> None:
    g = add_group(sub, "nodes", "Machines that joined a pool: lifecycle, conditions, events.")
    p = add_verb(g, "list", nodes_list, "Nodes of the tenant (root: every tenant's).")
    p.add_argument("--pool", metavar="POOL", help="only the nodes of this pool")
    p.add_argument("--tenant", help="the tenant (default: BETTER_COMPUTE_TENANT)")
    p = add_verb(g, "get", nodes_get,
                 "One node; --query provisionState or --query conditions picks a part.")
    p.add_argument("node", metavar="NODE", help="a node id (node_…)")
    p = add_verb(g, "events", nodes_events,
                 "The node's events, oldest first (node.joined, node.connected, …).")
    p.add_argument("node", metavar="NODE", help="a node id (node_…)")
    p = add_verb(g, "cordon", nodes_cordon,
                 "Put the node in maintenance: no new placements; holds on it stay.")
    p.add_argument("node", metavar="NODE", help="a node id (node_…)")
    p.add_argument("--reason", help="why (shown in its conditions and events)")
    p = add_verb(g, "uncordon", nodes_uncordon, "End the node's maintenance.")
    p.add_argument("node", metavar="NODE", help="a node id (node_…)")
