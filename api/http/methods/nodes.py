"""nodes.*: the node lifecycle as operators see and steer it."""

from __future__ import annotations

from typing import Any

from better_compute.api.http.methods import Call
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


def nodes_list(call: Call, p: NodesList) -> list[dict[str, Any]]:
    return _nodes(call).list(call.principal, p.tenant_id, p.pool_id, p.all_tenants,
                             p.include_removed)


def nodes_get(call: Call, p: NodeRef) -> dict[str, Any]:
    return _nodes(call).get(call.principal, p.node_id)


def nodes_events(call: Call, p: NodeRef) -> list[dict[str, Any]]:
    return _nodes(call).events(call.principal, p.node_id)


def nodes_adopt(call: Call, p: NodesAdopt) -> dict[str, Any]:
    return _nodes(call).adopt(call.principal, p.tenant_id, p.node_id, p.reason)


def nodes_cordon(call: Call, p: NodesCordon) -> dict[str, Any]:
    return _nodes(call).cordon(call.principal, p.node_id, p.reason)


def nodes_uncordon(call: Call, p: NodeRef) -> dict[str, Any]:
    return _nodes(call).uncordon(call.principal, p.node_id)


class NodesRemove(Params, kw_only=True):
    node_id: str
    tenant_id: str | None = None
    reason: str | None = None
    force: bool = False


def nodes_drain(call: Call, p: NodesCordon) -> dict[str, Any]:
    return _nodes(call).drain(call.principal, p.node_id, p.reason)


def nodes_remove(call: Call, p: NodesRemove) -> dict[str, Any]:
    return _nodes(call).remove(call.principal, p.node_id, p.reason, p.force)


def nodes_accept_inventory(call: Call, p: NodesAcceptInventory) -> dict[str, Any]:
    return call.services.inventory.accept(call.principal, p.node_id, p.reason)
