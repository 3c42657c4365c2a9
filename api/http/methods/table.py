"""The table of JSON-RPC methods: each one's name, params Struct, handler and summary, and
whether it is public (callable without a token) or writes (books or frees GPUs).

api/http/rpc.py dispatches by this table; ``rpc.discover`` answers with it; the docs tests
check that docs/api.md lists every method in it.
"""

from __future__ import annotations

from typing import Any

from better_compute.api.http.methods import (
    Call,
    Method,
    capacity,
    catalog,
    events,
    join,
    nodes,
    reservations,
    system,
    usage,
)
from better_compute.api.http.schemas import NoParams
from better_compute.api.wire.join import JoinParams


def rpc_discover(call: Call, _: NoParams) -> dict[str, Any]:
    return {"methods": discover()}


def discover() -> list[dict[str, Any]]:
    return [
        {"name": m.name, "summary": m.summary, "public": m.public, "params": m.schema()}
        for m in sorted(METHODS.values(), key=lambda m: m.name)
    ]


_TABLE = (
    Method("system.whoami", NoParams, system.whoami, "The caller: tenant, role, token."),
    Method("rpc.discover", NoParams, rpc_discover,
           "Every method with its params schema.", public=True),
    Method("pki.show", NoParams, system.pki_show,
           "Public certificates and the pins servingCaSpkiPin, joinSigningKeyPin, "
           "joinEncryptionKeyPin."),
    Method("tenants.create", catalog.TenantsCreate, catalog.tenants_create,
           "Create a tenant (root administrators)."),
    Method("tenants.get", catalog.TenantsGet, catalog.tenants_get, "One tenant."),
    Method("tenants.list", NoParams, catalog.tenants_list,
           "Tenants the caller sees (the root tenant sees all)."),
    Method("tokens.create", catalog.TokensCreate, catalog.tokens_create,
           "Mint an API token for a tenant with a role (admin, member, read-only) and a TTL; "
           "shown once."),
    Method("tokens.list", catalog.TokensList, catalog.tokens_list,
           "A tenant's tokens (never their secrets), with their state, end and last use; a page "
           "of at most limit (1,000) after after; allTenants: every tenant's (root admins)."),
    Method("tokens.revoke", catalog.TokensRevoke, catalog.tokens_revoke,
           "Revoke a token; it stops working at once."),
    Method("sites.create", catalog.SitesCreate, catalog.sites_create,
           "Create a platform site, shared or dedicated (root tenant); key makes it retry-safe."),
    Method("sites.get", catalog.SitesGet, catalog.sites_get, "One site."),
    Method("sites.list", catalog.SitesList, catalog.sites_list,
           "Sites the caller sees (root: every tenant's; allTenants says so, root only)."),
    Method("pools.create", catalog.PoolsCreate, catalog.pools_create,
           "Create a pool of one GPU model with a policy on a site; key makes it retry-safe."),
    Method("pools.get", catalog.PoolsGet, catalog.pools_get,
           "One pool with its policy and offerings."),
    Method("pools.list", catalog.PoolsList, catalog.pools_list,
           "Pools the caller owns or is offered (root: every tenant's; allTenants says so, root "
           "only)."),
    Method("pools.offer", catalog.PoolsOffer, catalog.pools_offer,
           "Offer a pool to a tenant with a quota (the resource is gpu), or change the quota."),
    Method("tokens.rotate", catalog.TokensRotate, catalog.tokens_rotate,
           "A new secret for a token (same tenant, role and name; a new id); the old one keeps "
           "working for the grace period. Admins rotate their tenant's tokens; a token itself."),
    Method("joinTokens.create", join.JoinTokensCreate, join.join_tokens_create,
           "Mint a join token for a pool (TTL 1m..24h, max uses, optional expect binding); the "
           "secret is in `token`, shown once; key makes it retry-safe."),
    Method("joinTokens.list", join.JoinTokensList, join.join_tokens_list,
           "A tenant's join tokens (never their secrets); allTenants: every tenant's (root)."),
    Method("joinTokens.get", join.JoinTokenRef, join.join_tokens_get,
           "One join token: state, uses, binding, expiry."),
    Method("joinTokens.revoke", join.JoinTokenRef, join.join_tokens_revoke,
           "Revoke a join token; no machine joins with it after."),
    Method("nodes.join", JoinParams, join.nodes_join,  # type: ignore[arg-type]  # a wire Struct
           "Join a machine with a join token (bcd join): params are the sealed "
           "JoinRequest; the answer is a JoinResponse signed by the join signing key.",
           public=True),
    Method("nodes.list", nodes.NodesList, nodes.nodes_list,
           "Nodes of a tenant (root without tenantId, or allTenants: every tenant's), optionally "
           "of one pool; removed ones only with includeRemoved."),
    Method("nodes.get", nodes.NodeRef, nodes.nodes_get,
           "One node: provisionState, conditions, session, acceptance, GPUs, maintenance."),
    Method("nodes.events", nodes.NodeRef, nodes.nodes_events,
           "The node's events from the event log, oldest first."),
    Method("nodes.adopt", nodes.NodesAdopt, nodes.nodes_adopt,
           "Start a new acceptance attempt for a node whose acceptance failed (after fixing the "
           "cause); reason says what was fixed."),
    Method("nodes.cordon", nodes.NodesCordon, nodes.nodes_cordon,
           "Put a node in maintenance: the placer skips it; holds on it stay."),
    Method("nodes.uncordon", nodes.NodeRef, nodes.nodes_uncordon, "End a node's maintenance."),
    Method("nodes.drain", nodes.NodesCordon, nodes.nodes_drain,
           "Drain a node: no new placements; holds and future bookings stay until they end or "
           "are released. maintenance.state says draining, then drained once nothing is held."),
    Method("nodes.remove", nodes.NodesRemove, nodes.nodes_remove,
           "Remove a node from its pool: refused while anything is held or booked unless force "
           "(which releases those reservations first, reason node-removed); the gateway then "
           "refuses its certificate and capacity drops it. The machine may join again."),
    Method("nodes.acceptInventory", nodes.NodesAcceptInventory, nodes.nodes_accept_inventory,
           "Root only: take the GPUs a node reports, which differ from the ones it has "
           "(conditions InventoryMatches False, after a repair), as its GPUs: checked against the "
           "pool's GPU model, the other nodes' GPUs and the holds on it; capacity follows."),
    Method("capacity.get", capacity.CapacityGet, capacity.capacity_get,
           "A pool's capacity per resource (gpu, cpu, memory): total, allocatable, allocated, "
           "reserved, available, and GPUs provisioning, unhealthy, in maintenance, unreachable."),
    Method("capacity.history", capacity.CapacityHistory, capacity.capacity_history,
           "A pool's GPUs over the last window (1h to 7d, default 24h): total, allocatable, "
           "allocated, reserved and available at evenly spaced instants, from the capacity read "
           "model's 5-minute history."),
    Method("reservations.create", reservations.ReservationsCreate, reservations.reservations_create,
           "Reserve GPUs of a pool for a duration: the placer books them on one "
           "node with their host CPUs and memory (now, at start, or at the earliest start); key "
           "makes it retry-safe; queue waits in the pool's queue when it cannot be placed.",
           writes=True),
    Method("reservations.get", reservations.ReservationRef, reservations.reservations_get,
           "One reservation with its state and binding."),
    Method("reservations.list", reservations.ReservationsList, reservations.reservations_list,
           "A tenant's reservations (allTenants: every tenant's, root), oldest first, a page of "
           "at most limit (1,000) after after."),
    Method("reservations.release", reservations.ReservationRef, reservations.reservations_release,
           "End a started reservation now: bookings end, quota is refunded, the "
           "hold leaves the node.", writes=True),
    Method("reservations.cancel", reservations.ReservationRef, reservations.reservations_cancel,
           "Withdraw a reservation that has not started yet (a queued one leaves "
           "the queue).", writes=True),
    Method("reservations.extend", reservations.ReservationsExtend, reservations.reservations_extend,
           "Extend a reservation by a duration when its GPUs are free for the extra "
           "time.", writes=True),
    Method("capacity.preview", reservations.CapacityPreview, reservations.capacity_preview,
           "Would a reservation fit now, and with which host CPUs and memory? When not, the "
           "earliest start at which it fits. Books nothing."),
    Method("events.list", events.EventsList, events.events_list,
           "A page of the event log after `since`: {events, head, next}. Continue with "
           "since=next; once next equals head you have every event up to head, so watch from "
           "there. actor, subject and [from, to) narrow it for an audit."),
    Method("projections.status", NoParams, events.projections_status,
           "Every read model with its position in the event log and its lag (root admins)."),
    Method("projections.rebuild", events.ProjectionsRebuild, events.projections_rebuild,
           "Empty one read model (or all) and apply the event log again from sequence 0 (root "
           "admins)."),
    Method("usage.report", usage.UsageReport, usage.usage_report_method,
           "GPU-hours booked and held active in [from, to), exact to the second, by tenant, pool "
           "and/or day; running reservations count to now. Root sees every tenant; others their "
           "own."),
)
METHODS: dict[str, Method] = {m.name: m for m in _TABLE}
if len(METHODS) != len(_TABLE):
    raise RuntimeError("a JSON-RPC method name is in the table twice")
