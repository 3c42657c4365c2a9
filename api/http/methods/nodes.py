"""nodes.*: the node lifecycle as operators see and steer it."""

from __future__ import annotations

from typing import Any

from better_compute.api.http.rpc import Call, method
from better_compute.api.http.schemas import ListScope, Params
from better_compute.api.services.nodes import NodeService


class NodesList(ListScope, kw_only=True):
    pool_id: str | None = None
    include_removed: bool = False  # removed nodes too (hidden by default)


class NodeRef(Params, kw_only=True):
    node_id: str
    tenant_id: str | None = None


class NodesAdopt(Params, kw_only=True):
    node_id: str
    tenant_id: str | None = None
    reason: str | None = None


class NodesCordon(Params, kw_only=True):
    node_id: str
    tenant_id: str | None = None
    reason: str | None = None


class NodesAcceptInventory(Params, kw_only=True):
    node_id: str
    reason: str | None = None


def _nodes(call: Call) -> NodeService:
    return call.services.nodes


@method("nodes.list", NodesList,
        "Nodes of a tenant (root without tenantId, or allTenants: every tenant's), optionally "
        "of one pool; removed ones only with includeRemoved.")
def nodes_list(call: Call, p: NodesList) -> list[dict[str, Any]]:
    return _nodes(call).list(call.principal, p.tenant_id, p.pool_id, p.all_tenants,
                             p.include_removed)


@method("nodes.get", NodeRef,
        "One node: provisionState, conditions, session, acceptance, GPUs, maintenance.")
def nodes_get(call: Call, p: NodeRef) -> dict[str, Any]:
    return _nodes(call).get(call.principal, p.node_id)


@method("nodes.events", NodeRef, "The node's events from the event log, oldest first.")
def nodes_events(call: Call, p: NodeRef) -> list[dict[str, Any]]:
    return _nodes(call).events(call.principal, p.node_id)


@method("nodes.adopt", NodesAdopt,
        "Start a new acceptance attempt for a node whose acceptance failed (after fixing the "
        "cause); reason says what was fixed.")
def nodes_adopt(call: Call, p: NodesAdopt) -> dict[str, Any]:
    return _nodes(call).adopt(call.principal, p.tenant_id, p.node_id, p.reason)


@method("nodes.cordon", NodesCordon,
        "Put a node in maintenance: the placer skips it; holds on it stay.")
def nodes_cordon(call: Call, p: NodesCordon) -> dict[str, Any]:
    return _nodes(call).cordon(call.principal, p.node_id, p.reason)


@method("nodes.uncordon", NodeRef, "End a node's maintenance.")
def nodes_uncordon(call: Call, p: NodeRef) -> dict[str, Any]:
    return _nodes(call).uncordon(call.principal, p.node_id)


class NodesRemove(Params, kw_only=True):
    node_id: str
    tenant_id: str | None = None
    reason: str | None = None
    force: bool = False


@method("nodes.drain", NodesCordon,
        "Drain a node: no new placements; holds and future bookings stay until they end or are "
        "released. maintenance.state says draining, then drained once nothing is held.")
def nodes_drain(call: Call, p: NodesCordon) -> dict[str, Any]:
    return _nodes(call).drain(call.principal, p.node_id, p.reason)


@method("nodes.remove", NodesRemove,
        "Remove a node from its pool: refused while anything is held or booked unless force "
        "(which releases those reservations first, reason node-removed); the gateway then "
        "refuses its certificate and capacity drops it. The machine may join again.")
def nodes_remove(call: Call, p: NodesRemove) -> dict[str, Any]:
    return _nodes(call).remove(call.principal, p.node_id, p.reason, p.force)


@method("nodes.acceptInventory", NodesAcceptInventory,
        "Root only: take the GPUs a node reports, which differ from the ones it has "
        "(conditions InventoryMatches False, after a repair), as its GPUs: checked against the "
        "pool's GPU model, the other nodes' GPUs and the holds on it; capacity follows.")
def nodes_accept_inventory(call: Call, p: NodesAcceptInventory) -> dict[str, Any]:
    return call.services.inventory.accept(call.principal, p.node_id, p.reason)
