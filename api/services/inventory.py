"""A node's GPUs: checked against what was accepted, claimed store-wide, changed by an operator.

What a node lists (in its ``acceptance.result``, in its reports) is compared with the GPUs it
has (domain/node_inventory.py) and with the GPUs other nodes hold (domain/gpu_claims.py):
anything else is refused, recorded once (``node.inventory.mismatch``) and changes nothing
else. Adopting a node claims its GPUs in the same atomic save; removing it releases them;
``nodes.acceptInventory`` (root only) takes what the node reports after a real repair,
claiming and releasing in the same save as ``node.inventory.accepted``
(docs/nodes.md, "What a node may change").
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from typing import Any
from uuid import UUID

import msgspec
from eventsourcing.persistence import IntegrityError

from better_compute.api.services.compute import ComputeService
from better_compute.api.services.unit import RETRY_ATTEMPTS, Aggregates, Also
from better_compute.api.wire.journal import AcceptanceResult
from better_compute.domain.access import Principal
from better_compute.domain.base import TenantOwned
from better_compute.domain.bookings import NodeBookings, bookings_uuid
from better_compute.domain.errors import Conflict, InvalidInput, NotFound
from better_compute.domain.gpu_claims import GpuClaim, gpu_claim_uuid
from better_compute.domain.gpu_models import same_model
from better_compute.domain.gpus import gpus_of
from better_compute.domain.ids import parse_id, public_id
from better_compute.domain.node import Node
from better_compute.domain.node_inventory import (
    compare_inventory,
    gpu_doc,
    with_reported_health,
)
from better_compute.domain.node_rules import evaluate_acceptance
from better_compute.domain.pool import Pool
from better_compute.domain.text import MAX_REASON, check_text

KEPT = ("the node kept changing while its GPUs were being checked; nothing was saved: "
        "try again")


def claims_of(aggregates: Aggregates, uuids: Iterable[str]) -> dict[str, GpuClaim | None]:
    """The claim on each GPU UUID (None: never claimed). Which claims exist is one query;
    only those are read."""
    ids = {u: gpu_claim_uuid(u) for u in dict.fromkeys(uuids)}
    stored = aggregates.stored(list(ids.values()))
    return {u: aggregates.get(GpuClaim, i) if i in stored else None for u, i in ids.items()}


def held_elsewhere(claims: dict[str, GpuClaim | None], node: Node) -> dict[str, str]:
    """The GPUs of ``claims`` another node holds, and which node."""
    return {u: other for u, c in claims.items()
            if c is not None and (other := c.held_by_another(node.public_id)) is not None}


def claim_all(claims: dict[str, GpuClaim | None], node: Node, at: datetime
              ) -> list[GpuClaim]:
    """Claims on every GPU of ``claims`` for ``node`` (new ones where none was): to save."""
    changed = []
    for uuid, claim in claims.items():
        claim = claim or GpuClaim(tenant_id=node.tenant_id, uuid=uuid)
        if claim.claim(node.public_id, node.tenant_id, at) or claim.pending_events:
            changed.append(claim)
    return changed


def release_all(aggregates: Aggregates, node: Node, uuids: Iterable[str], at: datetime,
                reason: str) -> list[GpuClaim]:
    """``node``'s claims on ``uuids`` released (``removed``, ``inventory``): to save."""
    changed = []
    for claim in claims_of(aggregates, uuids).values():
        if claim is not None and claim.release(node.public_id, at, reason):
            changed.append(claim)
    return changed


class InventoryService:
    """A node's GPUs over the ComputeService's store and clock."""

    def __init__(self, service: ComputeService) -> None:
        self.service = service
        self.aggregates = service.aggregates

    def _save_retrying(self, uuid: UUID, decide: Any, *, actor: str) -> Any:
        """Load the node, ``decide`` (what to save, what to answer), save as ``actor``; again
        on a clash."""
        for _ in range(RETRY_ATTEMPTS):
            node = self.aggregates.get(Node, uuid)
            if node is None:
                raise NotFound(f"no node with id {uuid}")
            changed, answer = decide(node)
            if not changed:
                return answer
            try:
                self.aggregates.store.save(*changed, actor=actor)
            except IntegrityError:
                continue
            return answer
        raise Conflict(KEPT)

    # ------------------------------------------------------------------ the gateway

    def acceptance_result(self, uuid: UUID, epoch: int, entry: AcceptanceResult) -> str | None:
        """A verified ``acceptance.result``: adopted (its GPUs claimed) or failed as the
        verdict says; None. When it lists other GPUs than the node's, refused: the mismatch
        recorded, the running attempt failed (reason ``inventory``), and the refusal's
        message answered, for the Nack. The node's own verdict: the node is its actor."""
        answer: str | None = self._save_retrying(uuid, self._accepting(epoch, entry),
                                                 actor=public_id("node", uuid))
        return answer

    def accepting(self, epoch: int, entry: AcceptanceResult) -> Callable[[Node], Also]:
        """``acceptance_result`` as a change of the node for ``NodeService.change_each``
        (the gateway saves many sessions' verdicts in one write): the refusal's message or
        None, and the GPU claims to save with the node."""
        decide = self._accepting(epoch, entry)

        def change(node: Node) -> Also:
            changed, answer = decide(node)
            return Also(answer, [a for a in changed if a is not node])

        return change

    def _accepting(self, epoch: int, entry: AcceptanceResult
                   ) -> Callable[[Node], tuple[list[TenantOwned], str | None]]:
        reported = [gpu_doc(msgspec.to_builtins(g)) for g in entry.gpus]
        verdict_input = msgspec.to_builtins(entry)

        def decide(node: Node) -> tuple[list[TenantOwned], str | None]:
            if node.session_epoch != epoch:
                raise Conflict(f"session epoch {epoch} of node {node.public_id} is stale "
                               f"(current {node.session_epoch})")
            now = self.service.clock()
            listed = reported or [dict(g) for g in node.gpus]  # none: the verdict says why
            claims = claims_of(self.aggregates, [g["uuid"] for g in listed])
            diff = compare_inventory(node.gpus, listed, held_elsewhere(claims, node))
            if not diff.matches:
                node.note_inventory_mismatch(diff, listed, "acceptance.result", now)
                node.refuse_acceptance(entry.attempt, diff.message(), now)
                return ([node] if node.pending_events else []), diff.message()
            verdict = evaluate_acceptance(node.acceptance_checks, verdict_input)
            gpus = with_reported_health(node.gpus, reported) if reported else None
            node.finish_acceptance(entry.attempt, verdict.passed, verdict.message,
                                   verdict.checks, gpus, now)
            if not node.pending_events:
                return [], None
            claimed: list[TenantOwned] = [*claim_all(claims, node, now)] if node.adopted else []
            return [node, *claimed], None

        return decide

    def reported(self, uuid: UUID, epoch: int, gpus: builtins.list[dict[str, Any]]) -> bool:
        """The GPUs of a report: when they differ from the node's, ``node.inventory.mismatch``
        (once for the same GPUs); nothing else changes. Whether it recorded one. The node's own
        report: the node is its actor."""
        reported = [gpu_doc(g) for g in gpus]

        def decide(node: Node) -> tuple[list[TenantOwned], bool]:
            if node.session_epoch != epoch or node.removed:
                return [], False
            own = {g.uuid for g in node.gpu_values()}  # its own GPUs: claimed when adopted
            strangers = [g["uuid"] for g in reported if g["uuid"] not in own]
            claims = claims_of(self.aggregates, strangers) if strangers else {}
            diff = compare_inventory(node.gpus, reported, held_elsewhere(claims, node))
            noted = node.note_inventory_mismatch(diff, reported, "report", self.service.clock())
            return ([node] if noted else []), noted

        noted: bool = self._save_retrying(uuid, decide, actor=public_id("node", uuid))
        return noted

    # ----------------------------------------------------------------- the operator

    def accept(self, principal: Principal, node_id: str, reason: str | None
               ) -> dict[str, Any]:
        """``nodes.acceptInventory``: the GPUs the node reports become its GPUs (root only)."""
        principal.require_root_admin("accept a node's changed GPUs")
        uuid = parse_id("node", node_id)
        why = check_text((reason or "").strip(), "the accept-inventory reason",
                         MAX_REASON) or "inventory accepted"

        def decide(node: Node) -> tuple[list[TenantOwned], Node]:
            pending = node.inventory_mismatch
            if pending is None:
                raise Conflict(
                    f"node {node.public_id} reports the {len(node.gpus)} GPUs it has: there "
                    "is no changed inventory to accept (`better-compute nodes get "
                    f"{node.public_id} --query conditions` says InventoryMatches)")
            gpus = [dict(g) for g in pending.get("reported") or []]
            self._check_fits(node, gpus)
            now = self.service.clock()
            new = [g["uuid"] for g in gpus]
            gone = [g.uuid for g in node.gpu_values() if g.uuid not in new]
            node.accept_inventory(gpus, now, principal.token_id, why)
            changed: list[TenantOwned] = [node]
            if node.adopted:
                changed += claim_all(claims_of(self.aggregates, new), node, now)
                changed += release_all(self.aggregates, node, gone, now, "inventory")
            return changed, node

        node = self.aggregates.get(Node, uuid)
        if node is None:
            raise NotFound(f"no node {node_id!r}: `better-compute nodes list` shows the nodes")
        accepted: Node = self._save_retrying(uuid, decide, actor=principal.actor)
        return accepted.to_doc()

    def _check_fits(self, node: Node, gpus: Sequence[dict[str, Any]]) -> None:
        """What an operator may accept: distinct GPUs no other node holds, of the pool's
        model, and none taken away while a hold or a booking uses it."""
        uuids = [g["uuid"] for g in gpus]
        twice = sorted({u for u in uuids if uuids.count(u) > 1})
        if twice:
            raise InvalidInput(f"node {node.public_id} lists GPU {twice[0]} more than once: a "
                               "GPU is one GPU. Fix the node's GPU source, then accept what "
                               "it reports")
        others = held_elsewhere(claims_of(self.aggregates, uuids), node)
        if others:
            uuid, other = next(iter(others.items()))
            raise Conflict(f"GPU {uuid} belongs to node {other}: a GPU belongs to one node. "
                           f"If the card moved, remove it from {other} first (`better-compute "
                           f"nodes accept-inventory {other}` once it no longer reports it, or "
                           f"`nodes remove {other}`)", data={"gpu": uuid, "nodeId": other})
        pool = self.aggregates.get(Pool, parse_id("pool", node.pool_id))
        model = pool.gpu_model if pool is not None else None
        foreign = [g for g in gpus_of(gpus) if not same_model(g.model, model)]
        if foreign:
            raise InvalidInput(f"GPU {foreign[0].uuid} is a {foreign[0].model}, and pool "
                               f"{node.pool_id} holds {model} GPUs only: a pool holds one GPU "
                               "model")
        gone = {g.uuid for g in node.gpu_values()} - set(uuids)
        held = self._held(node, gone)
        if held:
            uuid, reservation = next(iter(held.items()))
            raise Conflict(f"GPU {uuid} would leave node {node.public_id} while reservation "
                           f"{reservation} holds or has booked it: release it, or drain the "
                           "node and wait until it is drained, then accept",
                           data={"gpu": uuid, "reservationId": reservation})

    def _held(self, node: Node, uuids: set[str]) -> dict[str, str]:
        """Which of ``uuids`` a hold or a booking of ``node`` uses, and whose."""
        bookings = self.aggregates.get(NodeBookings, bookings_uuid(node.public_id))
        uses = [*(bookings.bookings.values() if bookings else []),
                *node.device_assignments()]
        return {str(u): str(use.get("reservationId")) for use in uses
                for u in use.get("gpus") or [] if u in uuids}
