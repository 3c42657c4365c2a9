"""Every service of the control plane, built once over one ``Aggregates`` (api/services/unit.py).

The composition root (api/runtime.py) calls ``build_services``; the HTTP methods, the gateway
and the controllers reach a service as ``services.<name>``, never by building one. The
services are composed, not inherited: each holds the shared ``Aggregates`` and, where it needs
the catalog (pools, the PKI, ids), the ``ComputeService``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from better_compute.api.services.compute import ComputeService
from better_compute.api.services.join import JoinService
from better_compute.api.services.nodes import NodeService
from better_compute.api.services.reservation_queue import MAX_QUEUED
from better_compute.api.services.reservations import ReservationService
from better_compute.api.services.tokens import MAX_PER_TENANT as MAX_TOKENS_PER_TENANT
from better_compute.api.services.tokens import TokenService
from better_compute.api.services.unit import Aggregates
from better_compute.api.store.token_use import TokenUse
from better_compute.domain.placement import Lane
from better_compute.domain.token import TokenLifetimes


@dataclass(frozen=True)
class Services:
    aggregates: Aggregates
    compute: ComputeService  # bootstrap, authentication, tenants, sites, pools, the PKI
    tokens: TokenService
    nodes: NodeService
    join: JoinService
    reservations: ReservationService


def build_services(aggregates: Aggregates, *, lifetimes: TokenLifetimes,
                   master_key_text: Callable[[], str] | None,
                   gateway_url: str | None = None, lane: Lane | None = None,
                   max_queued: int = MAX_QUEUED,
                   max_tokens_per_tenant: int = MAX_TOKENS_PER_TENANT) -> Services:
    """``lane``: the placing process's share of the nodes (one of ``serve --workers``);
    ``max_queued``: a tenant's queued reservations in one pool, at most, and
    ``max_tokens_per_tenant`` its live API tokens (0: no bound)."""
    compute = ComputeService(aggregates, token_use=TokenUse(aggregates.sql), lifetimes=lifetimes,
                             master_key_text=master_key_text, gateway_url=gateway_url,
                             max_tokens_per_tenant=max_tokens_per_tenant)
    return Services(aggregates=aggregates, compute=compute, tokens=compute.tokens,
                    nodes=NodeService(compute), join=JoinService(compute),
                    reservations=ReservationService(compute, lane, max_queued))
