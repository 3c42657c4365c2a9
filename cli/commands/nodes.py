"""nodes: list, get, events, cordon, uncordon, drain, remove, accept-inventory (nodes.adopt:
through `api`)."""

from __future__ import annotations

import argparse
from typing import Any

from better_compute.cli.context import Context
from better_compute.cli.follow import add_watch_flag, follow
from better_compute.cli.registry import add_all_tenants, add_group, add_verb
from better_compute.cli.tables import EVENTS, NODES


def nodes_list(ctx: Context, a: argparse.Namespace) -> int | None:
    def first() -> list[dict[str, Any]]:
        return list(ctx.call("nodes.list", **ctx.list_scope(), poolId=a.pool,
                             includeRemoved=a.include_removed or None))

    if not a.watch:
        ctx.emit(first(), ctx.list_table(NODES))
        return None
    scope = ctx.list_scope()
    pool = ctx.call("pools.get", poolId=a.pool)["id"] if a.pool else None

    def keep(doc: dict[str, Any]) -> bool:
        return ((pool is None or doc.get("poolId") == pool)
                and (scope.get("tenantId") is None or doc.get("tenantId") == scope["tenantId"])
                and (a.include_removed or doc.get("provisionState") != "removed"))

    return follow(ctx, types="node.*", first=first, keep=keep,
                  fetch=lambda node: dict(ctx.call("nodes.get", nodeId=node)),
                  table=ctx.list_table(NODES))


def nodes_get(ctx: Context, a: argparse.Namespace) -> int | None:
    doc = ctx.call("nodes.get", nodeId=a.node)
    if not a.watch:
        ctx.emit(doc)
        return None
    return follow(ctx, types="node.*", first=lambda: [doc], keep=lambda _: True,
                  fetch=lambda node: dict(ctx.call("nodes.get", nodeId=node)), table=NODES,
                  only={str(doc["id"])})


def nodes_events(ctx: Context, a: argparse.Namespace) -> None:
    ctx.emit(ctx.call("nodes.events", nodeId=a.node), EVENTS)


def nodes_cordon(ctx: Context, a: argparse.Namespace) -> None:
    ctx.emit(ctx.call("nodes.cordon", nodeId=a.node, reason=a.reason))


def nodes_uncordon(ctx: Context, a: argparse.Namespace) -> None:
    ctx.emit(ctx.call("nodes.uncordon", nodeId=a.node))


def nodes_drain(ctx: Context, a: argparse.Namespace) -> None:
    ctx.emit(ctx.call("nodes.drain", nodeId=a.node, reason=a.reason))


def nodes_remove(ctx: Context, a: argparse.Namespace) -> None:
    ctx.emit(ctx.call("nodes.remove", nodeId=a.node, reason=a.reason, force=a.force or None))


def nodes_accept_inventory(ctx: Context, a: argparse.Namespace) -> None:
    ctx.emit(ctx.call("nodes.acceptInventory", nodeId=a.node, reason=a.reason))


ACCEPT_INVENTORY_EXAMPLES = [
    "better-compute nodes get node_… --query inventoryMismatch   # what it reports instead",
    'better-compute nodes accept-inventory node_… --reason "GPU 3 replaced (RMA 1234)"',
]

DRAIN_EXAMPLES = [
    'better-compute nodes drain node_… --reason "replace PSU"',
    'better-compute nodes get node_… --query maintenance.state   # draining, then drained',
    'better-compute nodes uncordon node_…                         # take work again',
]

REMOVE_EXAMPLES = [
    'better-compute nodes remove node_… --reason retired          # once drained',
    'better-compute nodes remove node_… --force --reason "fire"   # releases what it holds',
    'bcd join …   # on the machine: the same node comes back, adopting',
]


def register(sub: Any) -> None:
    g = add_group(sub, "nodes", "Machines that joined a pool: lifecycle, conditions, events.",
                  examples=["better-compute nodes list --pool $POOL",
                            "better-compute nodes get $NODE --query provisionState"])
    p = add_verb(g, "list", nodes_list, "Nodes of the tenant (root: every tenant's).",
                 examples=["better-compute nodes list --pool $POOL",
                           "better-compute nodes list -o wide",
                           "better-compute nodes list -A           # every tenant's (root)",
                           "better-compute nodes list --pool $POOL -w  # then a row per change",
                           "export NODE=$(better-compute nodes list --pool $POOL --query '[0].id')",
                           "for n in $(better-compute nodes list -o name); do "
                           "better-compute nodes get $n --query provisionState; done"])
    p.add_argument("--pool", metavar="POOL", help="only the nodes of this pool")
    p.add_argument("--tenant", help="the tenant (default: BETTER_COMPUTE_TENANT)")
    add_all_tenants(p, "nodes")
    p.add_argument("--include-removed", action="store_true",
                   help="list removed nodes too (hidden by default)")
    add_watch_flag(p, "each node")
    p = add_verb(g, "get", nodes_get,
                 "One node; --query provisionState or --query conditions picks a part.",
                 examples=["better-compute nodes get $NODE --query provisionState",
                           "better-compute nodes get $NODE --query conditions",
                           "better-compute nodes get gpu-sn-7701 -w     # a row per change"])
    p.add_argument("node", metavar="NODE", help="the node: its id (node_…) or its hostname")
    add_watch_flag(p, "the node")
    p = add_verb(g, "events", nodes_events,
                 "The node's events, oldest first (node.joined, node.connected, …).",
                 examples=["better-compute nodes events $NODE",
                           "better-compute nodes events $NODE --query '[].type'"])
    p.add_argument("node", metavar="NODE", help="the node: its id (node_…) or its hostname")
    p = add_verb(g, "cordon", nodes_cordon,
                 "Put the node in maintenance: no new placements; holds on it stay.",
                 examples=["better-compute nodes cordon $NODE --reason 'replace PSU 2'"])
    p.add_argument("node", metavar="NODE", help="the node: its id (node_…) or its hostname")
    p.add_argument("--reason", help="why (shown in its conditions and events)")
    p = add_verb(g, "uncordon", nodes_uncordon, "End the node's maintenance.",
                 examples=["better-compute nodes uncordon $NODE"])
    p.add_argument("node", metavar="NODE", help="the node: its id (node_…) or its hostname")
    p = add_verb(g, "drain", nodes_drain,
                 "Drain the node: no new placements; holds and future bookings stay until they "
                 "end; maintenance.state goes draining, then drained.", examples=DRAIN_EXAMPLES)
    p.add_argument("node", metavar="NODE", help="the node: its id (node_…) or its hostname")
    p.add_argument("--reason", help="why (shown in its conditions and events)")
    p = add_verb(g, "remove", nodes_remove,
                 "Remove the node from its pool; refused while anything is held or booked unless "
                 "--force. Its bcd is refused and stops; the machine may join again.",
                 examples=REMOVE_EXAMPLES)
    p.add_argument("node", metavar="NODE", help="the node: its id (node_…) or its hostname")
    p.add_argument("--force", action="store_true",
                   help="release every reservation held or booked on it first (reason "
                   "node-removed)")
    p.add_argument("--reason", help="why (recorded in node.removed)")
    p = add_verb(g, "accept-inventory", nodes_accept_inventory,
                 "Root only: take the GPUs the node now reports (after a repair: a GPU "
                 "replaced, added or taken out) as its GPUs; until then what it reports changes "
                 "nothing (conditions InventoryMatches False).",
                 examples=ACCEPT_INVENTORY_EXAMPLES)
    p.add_argument("node", metavar="NODE", help="a node id (node_…)")
    p.add_argument("--reason", help="why (recorded in node.inventory.accepted)")
