"""nodes: list, get, events, cordon, uncordon, drain, remove (nodes.adopt: through `api`)."""

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


def nodes_drain(ctx: Any, a: argparse.Namespace) -> None:
    ctx.emit(ctx.call("nodes.drain", nodeId=a.node, reason=a.reason))


def nodes_remove(ctx: Any, a: argparse.Namespace) -> None:
    ctx.emit(ctx.call("nodes.remove", nodeId=a.node, reason=a.reason, force=a.force or None))


DRAIN_EXAMPLES = """\
examples:
  better-compute nodes drain node_… --reason "replace PSU"
  better-compute nodes get node_… --query maintenance.state   # draining, then drained
  better-compute nodes uncordon node_…                         # take work again"""

REMOVE_EXAMPLES = """\
examples:
  better-compute nodes remove node_… --reason retired          # once drained
  better-compute nodes remove node_… --force --reason "fire"   # releases what it holds
  bcd join …   # on the machine: the same node comes back, adopting"""


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
    p = add_verb(g, "drain", nodes_drain,
                 "Drain the node: no new placements; holds and future bookings stay until they "
                 "end; maintenance.state goes draining, then drained.", epilog=DRAIN_EXAMPLES,
                 formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("node", metavar="NODE", help="a node id (node_…)")
    p.add_argument("--reason", help="why (shown in its conditions and events)")
    p = add_verb(g, "remove", nodes_remove,
                 "Remove the node from its pool; refused while anything is held or booked unless "
                 "--force. Its bcd is refused and stops; the machine may join again.",
                 epilog=REMOVE_EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("node", metavar="NODE", help="a node id (node_…)")
    p.add_argument("--force", action="store_true",
                   help="release every reservation held or booked on it first (reason "
                   "node-removed)")
    p.add_argument("--reason", help="why (recorded in node.removed)")
