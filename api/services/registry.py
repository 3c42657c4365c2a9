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
from better_compute.api.services.inventory import InventoryService
from better_compute.api.services.join import JoinService
from better_compute.api.services.limits import ServiceLimits
from better_compute.api.services.names import Names
from better_compute.api.services.nodes import NodeService
from better_compute.api.services.reservations import ReservationService
from better_compute.api.services.tokens import TokenService
from better_compute.api.services.unit import Aggregates
from better_compute.api.store.token_use import TokenUse
from better_compute.domain.placement import NodePartition
from better_compute.domain.token import TokenLifetimes


@dataclass(frozen=True)
class Services:
    aggregates: Aggregates
    compute: ComputeService  # bootstrap, authentication, tenants, sites, pools, the PKI
    tokens: TokenService
    nodes: NodeService
    inventory: InventoryService  # a node's GPUs: checked, claimed, accepted by an operator
    join: JoinService
    reservations: ReservationService
    names: Names  # sites, pools and nodes by name where an id is taken


def build_services(aggregates: Aggregates, *, lifetimes: TokenLifetimes,
                   master_key_text: Callable[[], str] | None,
                   gateway_url: str | None = None, partition: NodePartition | None = None,
                   limits: ServiceLimits | None = None) -> Services:
    """``partition``: the placing process's share of the nodes (one of ``serve --workers``);
    ``limits``: what one tenant may hold (api/services/limits.py)."""
    compute = ComputeService(aggregates, token_use=TokenUse(aggregates.sql), lifetimes=lifetimes,
                             master_key_text=master_key_text, gateway_url=gateway_url,
                             limits=limits)
    reservations = ReservationService(compute, partition)
    # The queue changes this process saves, for the next create's check of the queue's head.
    aggregates.store.add_recording_listener(reservations.core.note_queue_changes)
    return Services(aggregates=aggregates, compute=compute, tokens=compute.tokens,
                    nodes=NodeService(compute), inventory=InventoryService(compute),
                    join=JoinService(compute), reservations=reservations,
                    names=Names(aggregates))
